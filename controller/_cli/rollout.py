"""``controller rollout``: a backend's revisions, and steering its rollouts; and the wait that
follows a change until its goal ends (``rollout status``, ``wait``, ``apply --wait``).

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
import sys
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from .._model.text import one_line
from .client import Client, CLIError, leader_answer, make_client
from .options import WAIT_TIMEOUT_HELP
from .output import age, canary_line, indent, since, table

#: The longest a watch request waits before the CLI refreshes what it shows.
_REFRESH_S = 1.0


def backend_path(name: str, *rest: str) -> str:
    return "/".join([f"/api/v1/backends/{urllib.parse.quote(name, safe='')}", *rest])


# -- commands --


def cmd_history(args: argparse.Namespace) -> int:
    client = make_client(args)
    revisions = client.ok("GET", backend_path(args.name, "revisions"))["revisions"]
    if args.json:
        print(json.dumps(revisions, indent=2))
    else:
        print_history(revisions)
    return 0


def cmd_undo(args: argparse.Namespace) -> int:
    client = make_client(args)
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
        if r["error"]:
            print(f"revision {r['number']} failed: {r['error']}")


def _code_column(revision: dict[str, Any]) -> str:
    """Whether the entrypoint's source on disk is still what the revision ran: an undo to a
    revision whose code CHANGED runs today's code under its config (refused without --force)."""
    changed = revision["code_changed"]
    if changed is None:
        return "unknown"
    return "CHANGED" if changed else "matches"


def describe_cause(revision: dict[str, Any]) -> str:
    """``undo to revision 2, cli, from app.toml: "bad release"``: who asked, from which file,
    what they said (as the controller's events say it)."""
    cause = revision["cause"]
    parts = []
    if revision["automatic"]:
        parts.append(f"automatic rollback to revision {revision['restores']}")
    elif revision["restores"] is not None:
        parts.append(f"undo to revision {revision['restores']}")
    elif revision.get("restarts") is not None:
        parts.append(f"restart of revision {revision['restarts']}")
    parts.append(cause["via"])
    if cause["manifest"] is not None:
        parts.append(f"from {cause['manifest']}")
    text = ", ".join(parts)
    if cause["message"] is not None:
        text += f": {json.dumps(cause['message'], ensure_ascii=False)}"
    return text


# -- waiting, like `kubectl rollout status` --


def wait_for(
    client: Client,
    names: Sequence[str],
    deleting: set[str],
    timeout: float,
    ours: Mapping[str, int] | None = None,
) -> int:
    """Show each backend's progress until every goal resolves. 0 if all reached, 1 if any
    backend is DEPLOY_FAILED, or was changed again by someone else (its generation moved past
    `ours`), or the wait timed out."""
    ours = ours or {}
    deadline = time.monotonic() + timeout
    shown: dict[str, str] = {}
    canaries: dict[str, tuple[int, str, str]] = {}
    tracebacks: dict[str, str | None] = {}
    cursor, epoch = 0, ""
    while True:
        # The leader's own word only: a standby's copy lags, and a leader that stepped down
        # may still show its closed controller's last state.
        answer = leader_answer(client, "/api/v1/backends", deadline)
        statuses = {b["name"]: b for b in answer["backends"]}
        pending, failed = [], []
        for name in names:
            status = statuses.get(name)
            if status is not None and status["generation"] > ours.get(name, status["generation"]):
                failed.append(name)
                line = f"superseded by generation {status['generation']}, a later change"
                rollout = status.get("rollout") or {}
                if rollout.get("automatic"):
                    # The later change is the controller's own: the rollout failed.
                    line = (
                        f"the rollout failed: {_why_failed(client, name)}; the rollback is "
                        f"revision {rollout['revision']} (`controller rollout status {name}` "
                        "follows it)"
                    )
            elif name in deleting:
                if status is None:
                    line = "deleted"
                else:
                    pending.append(name)
                    line = f"deleting: {one_line(status['message'])}"
            elif status is None:
                failed.append(name)
                line = "not found (deleted meanwhile?)"
            else:
                canary = (status.get("rollout") or {}).get("canary")
                steps = canary is not None and canary["phase"] not in ("promoted", "aborted")
                # During a canary's steps both revisions serve: what is ready is all of them.
                ready = status["ready"] if steps else status["ready_of_version"]
                message = one_line(status["message"])
                line = f"{ready}/{status['desired']} ready, {status['state']}: {message}"
                if status["state"] == "DEPLOY_FAILED":
                    failed.append(name)
                    rollout = status.get("rollout") or {}
                    if rollout.get("outcome") == "failed" and rollout.get("error"):
                        line += f" (the rollout failed: {one_line(rollout['error'])})"
                    else:
                        line += f" (last error: {one_line(status['last_error'])})"
                    if status["reason"] in ("StartFailures", "ReconfigureFailed"):
                        # The replica's own traceback is of that failure; not of a deadline's.
                        tracebacks[name] = status.get("last_traceback")
                elif not status["goal_done"]:
                    pending.append(name)
            if shown.get(name) != line:
                shown[name] = line
                print(f"backend/{name}: {line}", flush=True)
            canary = ((status or {}).get("rollout") or {}).get("canary")
            if canary is not None and canary["phase"] not in ("promoted", "aborted"):
                # Shown when its step, phase or verdict moves: the numbers move always.
                said = (canary["step"], canary["phase"], canary["verdict"])
                if said != canaries.get(name):
                    canaries[name] = said
                    print(f"backend/{name}: {canary_line(canary)}", flush=True)
        if not pending:
            if failed:
                for name in failed:
                    if tracebacks.get(name):
                        print(f"backend/{name}: the replica's traceback:", file=sys.stderr)
                        print(indent(str(tracebacks[name])), file=sys.stderr)
                print(f"failed: {', '.join(failed)}", file=sys.stderr)
                return 1
            print("done")
            return 0
        left = deadline - time.monotonic()
        if left <= 0:
            still = ", ".join(pending)
            print(f"timed out after {timeout:g}s; still going: {still}", file=sys.stderr)
            return 1
        # Wake on any change of serving replicas, or after a moment for the rest (starts).
        query = urllib.parse.urlencode(
            {"since": cursor, "epoch": epoch, "timeout_s": min(_REFRESH_S, left)}
        )
        try:
            # Bounded near the long poll's own wait: a paused leader must not hold it.
            change = client.ok("GET", f"/api/v1/watch?{query}", timeout=min(_REFRESH_S, left) + 5)
        except CLIError:
            # The daemon went away or stopped leading under the wait: the next status
            # (above) finds whoever leads now.
            cursor, epoch = 0, ""
            continue
        cursor, epoch = change["cursor"], change["epoch"]


def _why_failed(client: Client, name: str) -> str:
    """The error of `name`'s newest failed revision (the one a rollback undid)."""
    kept = client.ok("GET", f"/api/v1/backends/{urllib.parse.quote(name)}/revisions")
    for revision in reversed(kept["revisions"]):
        if revision["outcome"] == "failed":
            return str(revision["error"])
    return "see `controller rollout history`"


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
