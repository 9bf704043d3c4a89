"""``controller rollout``: a backend's revisions, and steering its rollouts (an application's
too, by its name: ``applications``); the wait that follows is ``waiting``'s.

controller rollout history NAME [--json]
controller rollout undo NAME [--to-revision N] [--force] [--message TEXT] [--wait]
controller rollout restart NAME [--message TEXT] [--wait]
controller rollout pause NAME
controller rollout resume NAME [--wait]
controller rollout promote NAME [--wait]   (a canary release: skip its remaining steps)
controller rollout abort NAME [--wait]     (a canary release: back to the stable revision)
controller rollout status NAME          (the same as ``controller wait NAME``)
"""

from __future__ import annotations

import argparse
import json
import urllib.parse
from typing import Any

from . import applications as apps
from .client import make_client
from .options import WAIT_TIMEOUT_HELP
from .output import age, describe_cause, same_version_notice, since, table
from .waiting import wait_for


def backend_path(name: str, *rest: str) -> str:
    return "/".join([f"/api/v1/backends/{urllib.parse.quote(name, safe='')}", *rest])


# -- commands --


def cmd_history(args: argparse.Namespace) -> int:
    client = make_client(args)
    if apps.application_of(client, args.name) is not None:
        return apps.history(client, args)
    revisions = client.ok("GET", backend_path(args.name, "revisions"))["revisions"]
    if args.json:
        print(json.dumps(revisions, indent=2))
    else:
        print_history(revisions)
    return 0


def cmd_undo(args: argparse.Namespace) -> int:
    client = make_client(args)
    if apps.application_of(client, args.name) is not None:
        body = {"to_revision": args.to_revision, "force": args.force, "message": args.message}
        return apps.steer(client, args, "undo", {**body, "via": "cli"})
    before = client.ok("GET", backend_path(args.name))
    body = {
        "to_revision": args.to_revision,
        "force": args.force,
        "message": args.message,
        "via": "cli",
    }
    result = client.ok("POST", backend_path(args.name, "undo"), body)
    if result["generation"] == before["generation"]:
        # An undo to the content that runs already writes nothing.
        print(f"backend/{args.name}: revision {result['revision']} runs that content already")
    else:
        print(
            f"backend/{args.name} rolling back to revision {result['restores']}'s content, as "
            f"revision {result['revision']} (generation {result['generation']})"
        )
    if not args.wait:
        return 0
    return wait_for(client, [args.name], set(), args.timeout, {args.name: result["generation"]})


def cmd_restart(args: argparse.Namespace) -> int:
    client = make_client(args)
    if apps.application_of(client, args.name) is not None:
        return apps.steer(client, args, "restart", {"message": args.message, "via": "cli"})
    body = {"message": args.message, "via": "cli"}
    result = client.ok("POST", backend_path(args.name, "restart"), body)
    print(
        f"backend/{args.name} restarting: revision {result['revision']} runs the same content "
        f"with the code on disk now (generation {result['generation']})"
    )
    if not args.wait:
        return 0
    return wait_for(client, [args.name], set(), args.timeout, {args.name: result["generation"]})


def cmd_pause(args: argparse.Namespace) -> int:
    client = make_client(args)
    result = client.ok("POST", backend_path(args.name, "pause"))
    print(
        f"backend/{args.name} paused at revision {result['revision']}: later deploys are "
        "recorded, not rolled out, until `controller rollout resume`"
    )
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    client = make_client(args)
    before = client.ok("GET", backend_path(args.name))
    pending = (before.get("rollout") or {}).get("pending_revision")
    result = client.ok("POST", backend_path(args.name, "resume"))
    if pending is not None and result["revision"] == pending:
        print(f"backend/{args.name} resumed: rolling out revision {pending}")
    else:
        print(f"backend/{args.name} resumed: nothing was pending")
    if not args.wait:
        return 0
    return wait_for(client, [args.name], set(), args.timeout, {args.name: result["generation"]})


def cmd_canary(args: argparse.Namespace) -> int:
    client = make_client(args)
    if apps.application_of(client, args.name) is not None:
        return apps.steer(client, args, args.verb, {"via": "cli"})
    before = client.ok("GET", backend_path(args.name))
    canary = (before.get("rollout") or {}).get("canary") or {}
    result = client.ok("POST", backend_path(args.name, args.verb), {"via": "cli"})
    where = f"at step {canary.get('step')} of {canary.get('steps')}" if canary else ""
    if args.verb == "promote":
        print(f"backend/{args.name}: canary revision {result['revision']} promoted {where}")
    else:
        print(
            f"backend/{args.name}: canary revision {canary.get('revision')} aborted {where}: its "
            f"weight is 0; back to revision {canary.get('stable_revision')}"
        )
    if not args.wait:
        return 0
    return wait_for(client, [args.name], set(), args.timeout)


def cmd_wait(args: argparse.Namespace) -> int:
    client = make_client(args)
    client.ok("GET", backend_path(args.name))  # 404 if unknown
    return wait_for(client, [args.name], set(), args.timeout)


# -- what history shows --


def print_history(revisions: list[dict[str, Any]]) -> None:
    """A table of revisions, oldest first; ``*`` marks the one the backend rolls out or runs.
    A failed rollout's error follows the table."""
    rows = [("REVISION", "VERSION", "OUTCOME", "CODE", "CREATED", "CAUSE")]
    for r in revisions:
        outcome = r["outcome"]
        if outcome == "complete" and not r["good"]:
            # Completed with no replica serving (scaled to 0): a plain undo skips it.
            outcome = "complete (none served)"
        rows.append(
            (
                f"{r['number']}{'*' if r['current'] else ''}",
                r["version"],
                outcome,
                _code_column(r),
                age(since(r["created_at"])),
                describe_cause(r),
            )
        )
    print("\n".join(table(rows)))
    for r in revisions:
        if r.get("same_version"):
            notice = same_version_notice(r["same_version"], r["version"])
            print(f"revision {r['number']}: {notice}")
        if r["error"]:
            print(f"revision {r['number']} failed: {r['error']}")


def _code_column(revision: dict[str, Any]) -> str:
    """Whether the entrypoint's source on disk is still what the revision ran: an undo to a
    revision whose code CHANGED runs today's code under its config (refused without --force)."""
    changed = revision["code_changed"]
    if changed is None:
        return "unknown"
    return "CHANGED" if changed else "matches"


#: The longest a CLI command waits (a year): past it, a typo.
_MAX_TIMEOUT_S = 365 * 86400.0


# -- the parser --


def add_rollout_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``controller rollout ...``, and ``controller wait`` (what ``rollout status`` was first
    called; kept as an alias)."""
    rollout = sub.add_parser(
        "rollout", help="a backend's revisions; undo, restart, pause, resume, promote, abort"
    )
    verbs = rollout.add_subparsers(dest="verb", required=True)

    history = verbs.add_parser("history", help="a backend's revisions, oldest first")
    history.add_argument("name", help="the backend's name")
    history.add_argument("--json", action="store_true", help="print the API's answer, as JSON")
    history.set_defaults(func=cmd_history)

    undo = verbs.add_parser(
        "undo", help="go back to the last good revision's content (or --to-revision's)"
    )
    undo.add_argument("name", help="the backend's name")
    undo.add_argument(
        "--to-revision", type=_revision, metavar="N", help="the revision to bring back"
    )
    undo.add_argument(
        "--force",
        action="store_true",
        help="even if the code on disk is not what that revision ran",
    )
    undo.add_argument(
        "-m", "--message", metavar="TEXT", help="why, kept in the revision the undo makes"
    )
    _add_wait(undo)
    undo.set_defaults(func=cmd_undo)

    restart = verbs.add_parser(
        "restart",
        help="replace every replica, running the code on disk now (ship edited code)",
    )
    restart.add_argument("name", help="the backend's name")
    restart.add_argument(
        "-m", "--message", metavar="TEXT", help="why, kept in the revision the restart makes"
    )
    _add_wait(restart)
    restart.set_defaults(func=cmd_restart)

    pause = verbs.add_parser("pause", help="record later deploys without rolling them out")
    pause.add_argument("name", help="the backend's name")
    pause.set_defaults(func=cmd_pause)

    resume = verbs.add_parser("resume", help="roll out what was deployed while paused")
    resume.add_argument("name", help="the backend's name")
    _add_wait(resume)
    resume.set_defaults(func=cmd_resume)

    for verb, what in (
        ("promote", "a canary release: skip its remaining steps, replace the stable revision"),
        ("abort", "a canary release: weight 0 now, drain it, back to the stable revision"),
    ):
        steer = verbs.add_parser(verb, help=what)
        steer.add_argument("name", help="the backend's name")
        _add_wait(steer)
        steer.set_defaults(func=cmd_canary)

    for parent, command in ((verbs, "status"), (sub, "wait")):
        wait = parent.add_parser(command, help="wait until a backend's latest goal ends")
        wait.add_argument("name", help="the backend's name")
        wait.add_argument(
            "--timeout",
            type=seconds,
            default=600.0,
            help="how long to wait, in seconds (default %(default)g); past it the command exits 1",
        )
        wait.set_defaults(func=cmd_wait)


def _add_wait(command: argparse.ArgumentParser) -> None:
    """``--wait`` and its ``--timeout``, as every change's command takes them."""
    command.add_argument("--wait", action="store_true", help="show progress until it ends")
    command.add_argument("--timeout", type=seconds, default=600.0, help=WAIT_TIMEOUT_HELP)


def _revision(text: str) -> int:
    # ArgumentTypeError, not ValueError: argparse would name this function in its message.
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a revision's number, >= 1 (got {text!r})")
    return value


def seconds(text: str) -> float:
    """A ``--timeout``: a number of seconds > 0, and finite (a socket's timeout takes no
    infinity; a day is as good)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= _MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds > 0 and at most {_MAX_TIMEOUT_S:g} (got {text!r})"
        )
    return value
