"""The ``controller`` command: ``run`` is the daemon (``run.py``); every other command talks to
its HTTP API.

controller run [--config FILE] [--listen HOST:PORT] [--runtime local|ray] [--store sqlite|ray]
controller apply -f FILE [--prune [--all]] [--wait] [--message TEXT]
controller status [NAME] [--json]
controller logs NAME [--replica TAG] [--follow] [--tail N]
controller delete NAME [--wait] [--force]
controller rollout history|undo|pause|resume|status NAME
controller wait NAME                (the same as `controller rollout status NAME`)
controller shutdown
controller ingress [--listen HOST:PORT] [--workers N]
controller scale NAME REPLICAS | --min N --max N [--wait]
controller console [--no-open]       (a one-time login link to the web console)
controller node list | drain NODE [--deadline S] [--wait] | cordon NODE | uncordon NODE
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .._daemon.statedir import StateDir
from .._model.values.errors import ManifestError, StartupError
from .._model.values.text import safe_text
from . import applications as apps
from .client import CLIError, describe_error, make_client
from .console import add_console_parsers
from .ingress import add_ingress_parser, describe_ingress
from .nodes import add_node_parser, describe_node_ingresses
from .options import NAME_HELP, WAIT_TIMEOUT_HELP, add_global_options
from .output import (
    EscapedText,
    code_notice,
    print_backend,
    print_diff,
    print_log,
    print_table,
    same_version_notice,
)
from .rollout import add_rollout_parser, seconds
from .run import add_run_parser
from .waiting import wait_for

if TYPE_CHECKING:
    from .._model.config.manifest import Manifest

#: How often ``logs --follow`` asks for what is new.
_FOLLOW_S = 0.5


# -- commands --


def cmd_apply(args: argparse.Namespace) -> int:
    from .._model.config.manifest import MAX_MANIFEST_BYTES
    from .._sources import load_manifest

    try:
        manifest = load_manifest(args.file)
        # The digest names the version of the file in its revisions' history. Read once more:
        # a file rewritten in between is named by what this read saw, a moment later.
        with args.file.open("rb") as f:
            digest = hashlib.sha256(f.read(MAX_MANIFEST_BYTES + 1)).hexdigest()
    except ManifestError as exc:
        raise CLIError(str(exc), 2) from None
    except OSError as exc:
        raise CLIError(f"error: cannot read {args.file}: {exc.strerror or exc}", 2) from None
    if args.prune and not manifest.backends and not args.prune_all:
        # As `kubectl apply --prune` asks for --all: an emptied or wrong file must not delete
        # every backend by accident.
        raise CLIError(
            f"error: {args.file} names no backend, so --prune would delete every backend; "
            "add --all to mean it",
            2,
        )
    client = make_client(args)
    # Only the fields the file sets: what the daemon merges with what it applied last.
    backends = {
        b.name: {k: v for k, v in b.to_dict().items() if k in b.given} for b in manifest.backends
    }
    groups = {"applications": _applications(manifest)} if manifest.applications else {}
    if args.dry_run:
        body = {
            "backends": backends,
            **groups,
            "prune": args.prune,
            "source": _one_line(str(args.file)),
        }
        print_diff(client.ok("POST", "/api/v1/apply/diff", body)["backends"])
        return 0
    result = client.ok(
        "POST",
        "/api/v1/apply",
        {
            "backends": backends,
            **groups,
            "prune": args.prune,
            "source": _one_line(str(args.file)),
            "source_digest": digest,
            "message": args.message,
            "via": "cli",
        },
    )
    for item in result["applied"]:
        what = "configured" if item["changed"] else "unchanged"
        print(f"backend/{item['name']} {what} (generation {item['generation']})")
        if item.get("code_changed"):
            print(f"  {code_notice(item['name'], None)}")
        if item.get("same_version"):
            print(f"  note: {same_version_notice(item['same_version'])}")
    for item in result["deleted"]:
        print(f"backend/{item['name']} deleted (pruned)")
    for item in result.get("applications", []):
        print(f"application/{item['name']} at revision {item['revision']}")
    if not args.wait:
        return 0
    deleting = {item["name"] for item in result["deleted"]}
    names = [item["name"] for item in result["applied"]] + sorted(deleting)
    ours = {item["name"]: item["generation"] for item in result["applied"]}
    return wait_for(client, names, deleting, args.timeout, ours)


def _applications(manifest: Manifest) -> dict[str, Any]:
    """A manifest's applications as an apply's body names them."""
    from .._model.values.fields import block_to_dict

    out: dict[str, Any] = {}
    for app in manifest.applications:
        out[app.name] = {"entry": app.entry, "backends": list(app.members[1:])}
        if app.canary is not None:
            out[app.name]["canary"] = block_to_dict(app.canary)
    return out


def cmd_status(args: argparse.Namespace) -> int:
    client = make_client(args)
    app = apps.application_of(client, args.name) if args.name else None
    if app is not None:
        if args.json:
            print(json.dumps(app, indent=2))
        else:
            apps.print_application(app)
        return 0
    if args.name:
        status = client.ok("GET", f"/api/v1/backends/{urllib.parse.quote(args.name)}")
        if args.json:
            print(json.dumps(status, indent=2))
        else:
            print_backend(status)
        return 0
    answer = client.ok("GET", "/api/v1/backends")
    backends = answer["backends"]
    if args.json:
        print(json.dumps(backends, indent=2))
        return 0
    if not backends:
        print("no backends")
    else:
        print_table(backends)
        apps.print_applications(client)
    leadership = answer.get("leadership")
    if isinstance(leadership, dict):
        print(describe_leadership(leadership))
    code, ingress = client.call("GET", "/api/v1/ingress")
    if code == 200 and isinstance(ingress, dict) and ingress.get("listen"):
        print(describe_ingress(ingress))
    if code == 200 and isinstance(ingress, dict) and ingress.get("nodes"):
        print(describe_node_ingresses(ingress["nodes"]))
    return 0


def describe_leadership(leadership: dict[str, Any]) -> str:
    """One line: who leads, since when, and what this daemon is."""
    if leadership.get("leader") is None:
        return (
            f"leader: none just now (epoch {leadership.get('epoch')}); this daemon does not hold "
            "the lease (a takeover, or a store it cannot write: its log says which)"
        )
    role = "this daemon" if leadership.get("role") == "leader" else "another daemon"
    line = (
        f"leader: {role}, {leadership['leader']} (pid {leadership.get('pid')}), epoch "
        f"{leadership.get('epoch')}, since {leadership.get('since')}, "
        f"at {leadership.get('address')}"
    )
    if leadership.get("role") == "standby":
        line += "\nthis daemon stands by: the above is the store as the leader last wrote it"
    return line


def cmd_logs(args: argparse.Namespace) -> int:
    client = make_client(args)
    path = f"/api/v1/backends/{urllib.parse.quote(args.name)}/logs"
    query: dict[str, Any] = {"tail": args.tail}
    if args.replica:
        query["replica"] = args.replica
    logs = client.ok("GET", f"{path}?{urllib.parse.urlencode(query)}")["logs"]
    if not any(entry["text"] for entry in logs):
        print(f"backend/{args.name}: its replicas have printed nothing (yet)", file=sys.stderr)
    several = len(logs) > 1
    offsets: dict[str, int] = {}
    for entry in logs:
        print_log(entry, several)
        offsets[entry["replica"]] = entry["offset"]
    if not args.follow:
        return 0
    # New text of every replica the first read showed, and of replicas that appear meanwhile
    # (each from its start); until Ctrl-C.
    while True:
        time.sleep(_FOLLOW_S)
        sizes = {**query, "tail": 0}
        status, payload = client.call("GET", f"{path}?{urllib.parse.urlencode(sizes)}")
        if status >= 400:
            raise CLIError(describe_error(status, payload))
        for entry in payload["logs"]:
            tag = entry["replica"]
            if tag not in offsets:
                offsets[tag] = 0
            if entry["offset"] == offsets[tag]:
                continue
            fresh = {**query, "replica": tag, "offset": offsets[tag]}
            chunk = client.ok("GET", f"{path}?{urllib.parse.urlencode(fresh)}")["logs"]
            for item in chunk:
                print_log(item, several or len(offsets) > 1)
                offsets[tag] = item["offset"]
        # Like `kubectl logs -f` when its pod ends: all that was written has been shown.
        if not payload["exists"]:
            print(f"backend/{args.name}: deleted", file=sys.stderr)
            return 0
        if args.replica and all(e["state"] == "GONE" for e in payload["logs"]):
            print(f"replica {args.replica}: gone", file=sys.stderr)
            return 0


def cmd_delete(args: argparse.Namespace) -> int:
    client = make_client(args)
    if apps.application_of(client, args.name) is not None:
        return apps.delete(client, args)
    path = f"/api/v1/backends/{urllib.parse.quote(args.name)}"
    result = client.ok("DELETE", path + ("?force=true" if args.force else ""))
    print(f"backend/{args.name} deleting (generation {result['generation']})")
    if not args.wait:
        return 0
    ours = {args.name: result["generation"]}
    return wait_for(client, [args.name], {args.name}, args.timeout, ours)


#: How often `shutdown` looks whether the daemon's process has let go of its state dir.
_EXIT_POLL_S = 0.05


def cmd_shutdown(args: argparse.Namespace) -> int:
    if args.url is None and not StateDir(args.state_dir).running():
        return _stop_what_was_left(StateDir(args.state_dir))
    client = make_client(args)
    print("shutting down: draining and deleting every backend", flush=True)
    try:
        # Answered once every drain is over, or given up on, with what was left.
        result = client.ok("POST", "/api/v1/shutdown", timeout=args.timeout)
    except CLIError as exc:
        if "cannot reach" not in str(exc):
            raise
        raise CLIError(
            "error: the controller stopped before its shutdown was over (see its log); what "
            "was not deleted yet keeps running, and the next `controller run` finishes it"
        ) from None
    left = result.get("left") or []
    if left:
        raise CLIError(
            f"error: the controller stopped before {', '.join(left)} were deleted (see its "
            "log); their replicas keep running, and the next `controller run` finishes the "
            "deletes"
        )
    # The daemon exits next: follow the watch until it closes the connection, so that we
    # return once it is gone, seen from wherever the CLI runs.
    deadline = time.monotonic() + args.timeout
    cursor = 0
    while time.monotonic() < deadline:
        try:
            query = urllib.parse.urlencode({"since": cursor, "timeout_s": 30})
            cursor = client.ok("GET", f"/api/v1/watch?{query}", timeout=40)["cursor"]
        except CLIError:
            if args.url is None:
                # Its API is gone; the process may still be closing its ingress processes and
                # its store. Its state dir's lock goes only with the process: once it is free,
                # a `controller run` on the same dir and ports starts at once.
                state = StateDir(args.state_dir)
                while state.running() and time.monotonic() < deadline:
                    time.sleep(_EXIT_POLL_S)
            print("the controller has stopped")
            return 0
    raise CLIError(f"the controller is still running after {args.timeout:g}s")


def _stop_what_was_left(state: StateDir) -> int:
    """`shutdown` with no daemon in `state`: stop the ingress processes the last one left
    serving (they hold the ingress port), and say what is left."""
    import trio  # (here: the other commands need neither it nor the daemon's modules)

    from .._daemon.ingress_records import left_behind, stop_records
    from .._local.scan import WorkerScan

    try:
        state.check_private(create=False)
    except StartupError as exc:
        raise CLIError(f"error: {exc}") from None
    left = left_behind(state)
    # Its workers name the state dir as the daemon was given it: through a symlink or not.
    pids: set[int] = set()
    for where in {state.workers, Path(os.path.realpath(state.workers))}:
        for found in WorkerScan(where, lambda: None)().values():
            pids |= found
    # The replicas are the store's to delete: only a daemon over it drains them and forgets
    # their backends (killed here, the next start would start them again).
    kept = (
        f"; {len(pids)} replica process(es) of its backends still run: `controller "
        f"--state-dir {state} run`, with the options it ran with (--listen, --ingress-listen, "
        "--pythonpath...), adopts them, and `controller shutdown` then deletes them"
        if pids
        else ""
    )
    if not left:
        raise CLIError(
            f"error: no controller daemon is running for the state dir {state}, and no ingress "
            f"process of one is left{kept or ': nothing to stop'} (pass --url, or the "
            "--state-dir a daemon runs with)"
        )
    shown = ", ".join(f"pid {r.pid} on {r.listen}" for r in left)
    print(f"no daemon runs for {state}: stopping the ingress processes it left ({shown})")
    trio.run(stop_records, left, state)
    print(f"stopped{kept}")
    return 0


# -- the parser --


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="controller", description="A replica controller on trio: daemon and CLI."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    add_run_parser(sub)

    apply = sub.add_parser("apply", help="create or update the backends of a file")
    apply.add_argument(
        "-f", "--file", type=Path, required=True, help="the backends file (TOML, or JSON)"
    )
    apply.add_argument("--prune", action="store_true", help="delete backends not in the file")
    apply.add_argument(
        "--all",
        dest="prune_all",
        action="store_true",
        help="with --prune and a file that names no backend: delete every backend",
    )
    apply.add_argument("--wait", action="store_true", help="show progress until every goal ends")
    apply.add_argument(
        "--dry-run",
        "--diff",
        dest="dry_run",
        action="store_true",
        help="show what would change, field by field, and change nothing",
    )
    apply.add_argument("--timeout", type=seconds, default=600.0, help=WAIT_TIMEOUT_HELP)
    apply.add_argument(
        "-m", "--message", metavar="TEXT", help="why, kept in the revisions the change makes"
    )
    apply.set_defaults(func=cmd_apply)

    status = sub.add_parser("status", help="backends, states and replicas")
    status.add_argument("name", nargs="?", help="one backend, in full (default: a table of all)")
    status.add_argument("--json", action="store_true", help="print the API's answer, as JSON")
    status.set_defaults(func=cmd_status)

    logs = sub.add_parser("logs", help="a backend's replica logs (kept for gone replicas too)")
    logs.add_argument("name", help=NAME_HELP)
    logs.add_argument("--replica", help="one replica's tag (default: every one with a log)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing what is new")
    logs.add_argument(
        "--tail", type=int, default=100, help="how many lines of each log (default %(default)s)"
    )
    logs.add_argument(
        "--raw",
        action="store_true",
        help="print control characters as they are (default: escaped, e.g. \\x1b, so that a "
        "replica's output cannot drive the terminal)",
    )
    logs.set_defaults(func=cmd_logs)

    delete = sub.add_parser("delete", help="drain and delete a backend")
    delete.add_argument("name", help=NAME_HELP)
    delete.add_argument("--wait", action="store_true", help="show progress until it is gone")
    delete.add_argument("--force", action="store_true", help="skip the graceful drain")
    delete.add_argument("--timeout", type=seconds, default=600.0, help=WAIT_TIMEOUT_HELP)
    delete.set_defaults(func=cmd_delete)

    shutdown = sub.add_parser("shutdown", help="drain and delete everything; stop the daemon")
    shutdown.add_argument(
        "--timeout",
        type=seconds,
        default=180.0,
        help="how long to wait for the drains and the daemon's exit, in seconds (default "
        "%(default)g)",
    )
    shutdown.set_defaults(func=cmd_shutdown)
    add_rollout_parser(sub)
    add_ingress_parser(sub)
    add_node_parser(sub)
    add_console_parsers(sub)
    add_global_options(parser)  # last: every subcommand takes them too
    return parser


def _one_line(path: str) -> str:
    """`path` as the history keeps a manifest's name, one line: a file name's control
    characters (a newline, say) escaped as JSON escapes them."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        return json.dumps(path)[1:-1]
    return path


def main(argv: Sequence[str] | None = None) -> NoReturn:
    code: int | str | None
    try:
        args = build_parser().parse_args(argv)
        if args.command == "run" or getattr(args, "raw", False):
            code = int(args.func(args))
        else:
            with (
                contextlib.redirect_stdout(EscapedText(sys.stdout)),
                contextlib.redirect_stderr(EscapedText(sys.stderr)),
            ):
                code = int(args.func(args))
    except SystemExit as exc:  # argparse: --help, or a usage error (already printed)
        code = exc.code
    except CLIError as exc:
        print(safe_text(str(exc)), file=sys.stderr)  # it may quote a replica's error
        code = exc.code
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        # A reply not shaped as a controller daemon's: another server at that address.
        print(
            f"error: the server answered something this CLI does not understand ({exc!r}); "
            "is --url (or the state dir's daemon.json) a controller daemon?",
            file=sys.stderr,
        )
        code = 1
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:
        code = _reader_gone()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = _reader_gone()
    sys.exit(code)


def _reader_gone() -> int:
    """The reader of our output went away (``| head``): what is left unsaid goes nowhere,
    quietly, instead of a traceback at exit."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1
