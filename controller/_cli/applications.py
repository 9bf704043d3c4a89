"""The CLI's commands on an application: ``status``, ``delete`` and ``rollout history | undo |
restart | promote | abort`` take an application's name where they take a backend's (the two
never share one), and act on every member at once."""

from __future__ import annotations

import argparse
import json
import urllib.parse
from typing import Any

from .client import Client, CLIError, describe_error
from .output import age, describe_cause, since, table
from .waiting import wait_for


def app_path(name: str, *rest: str) -> str:
    return "/".join([f"/api/v1/applications/{urllib.parse.quote(name, safe='')}", *rest])


def application_of(client: Client, name: str) -> dict[str, Any] | None:
    """`name`'s application as the API shows it, or None if it names none (a backend, then)."""
    status, payload = client.call("GET", app_path(name))
    if status == 404 and isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and error.get("type") == "UnknownApplication":
            return None
    if status >= 400:
        raise CLIError(describe_error(status, payload))
    return payload if isinstance(payload, dict) else None


def print_application(app: dict[str, Any]) -> None:
    revision = app["revision"]
    print(f"application/{app['name']}: {app['state']}, revision {revision}, entry {app['entry']}")
    rows = [("MEMBER", "STATE", "REVISION", "RECORDED", "MESSAGE")]
    for m in app["members"]:
        name = f"{m['name']} (entry)" if m["entry"] else m["name"]
        asked, recorded = m["revision"], m["recorded"]
        rows.append((name, m["state"], str(asked), str(recorded), m["message"]))
    print("\n".join(table(rows, indent="  ")))
    if any(m["revision"] != m["recorded"] for m in app["members"]):
        print(
            "  a member asks for another revision than the application's latest recorded: it "
            "changed on its own (a deploy, undo or restart of the backend itself, or an "
            "automatic rollback: an aborted canary, a failed rollout); the next apply of the "
            "application's manifest records what it asks"
        )


def print_applications(client: Client) -> None:
    """The applications under the backends of ``controller status`` (nothing if none)."""
    status, payload = client.call("GET", "/api/v1/applications")
    if status != 200 or not isinstance(payload, dict) or not payload.get("applications"):
        return  # an older daemon, or none
    rows = [("APPLICATION", "STATE", "REVISION", "ENTRY", "MEMBERS")]
    for app in payload["applications"]:
        members = ", ".join(m["name"] for m in app["members"])
        rows.append((app["name"], app["state"], str(app["revision"]), app["entry"], members))
    print("\n".join(table(rows)))


def history(client: Client, args: argparse.Namespace) -> int:
    revisions = client.ok("GET", app_path(args.name, "revisions"))["revisions"]
    if args.json:
        print(json.dumps(revisions, indent=2))
        return 0
    rows = [("REVISION", "MEMBERS (backend revision)", "CREATED", "CAUSE")]
    for r in revisions:
        members = ", ".join(f"{name} {number}" for name, number in r["members"].items())
        cause = describe_cause(r)
        if r["undone_to"] is not None:
            cause = f"undo to {r['undone_to']}; {cause}"
        current = "*" if r["current"] else ""
        rows.append((f"{r['number']}{current}", members, age(since(r["created_at"])), cause))
    print("\n".join(table(rows)))
    return 0


def steer(client: Client, args: argparse.Namespace, what: str, body: dict[str, Any]) -> int:
    """Undo, restart, promote or abort every member; with --wait, until each goal ends."""
    before = client.ok("GET", app_path(args.name))
    after = client.ok("POST", app_path(args.name, what), body)
    if what == "undo" and after["revision"] == before["revision"]:
        print(f"application/{args.name}: every member runs that revision's content already")
    elif what == "undo":
        print(f"application/{args.name} rolling back every member, as revision {after['revision']}")
    elif what == "restart":
        print(f"application/{args.name} restarting every member, as revision {after['revision']}")
    else:
        print(f"application/{args.name}: the canary of every member in one {what}ed")
    if not getattr(args, "wait", False):
        return 0
    members = [m["name"] for m in after["members"]]
    return wait_for(client, members, set(), args.timeout)


def delete(client: Client, args: argparse.Namespace) -> int:
    path = app_path(args.name) + ("?force=true" if args.force else "")
    generations = client.ok("DELETE", path)["generations"]
    print(f"application/{args.name} deleting with its members: {', '.join(sorted(generations))}")
    if not args.wait:
        return 0
    return wait_for(client, sorted(generations), set(generations), args.timeout, generations)
