"""The ``controller`` command: ``run`` is the daemon; every other command talks to its HTTP API.

controller run [--config FILE] [--listen HOST:PORT] [--runtime local|ray] [--store sqlite|ray]
controller apply -f FILE [--prune] [--wait]
controller status [NAME] [--json]
controller logs NAME [--replica TAG] [--follow] [--tail N]
controller delete NAME [--wait] [--force]
controller wait NAME
controller shutdown
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from ._errors import CheckpointError, ManifestError, StartupError
from ._statedir import (
    STATE_DIR_ENV,
    TOKEN_ENV,
    check_private,
    daemon_running,
    default_state_dir,
    read_address,
    token_path,
)

#: The longest a watch request waits before the CLI refreshes what it shows.
_REFRESH_S = 1.0
#: How often ``logs --follow`` asks for what is new.
_FOLLOW_S = 0.5


class CLIError(Exception):
    """Something the user should read; the command exits with `code`."""

    def __init__(self, message: str, code: int = 1):
        self.code = code
        super().__init__(message)


# -- talking to the daemon --


class Client:
    def __init__(self, url: str, token: str | None):
        self.url = url.rstrip("/")
        self.token = token

    def call(
        self, method: str, path: str, body: Any = None, *, timeout: float = 30.0
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.token is not None:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
                try:
                    return response.status, json.loads(raw or b"null")
                except ValueError:
                    raise CLIError(
                        f"error: {self.url} answered with something other than JSON; is it a "
                        "controller daemon?"
                    ) from None
        except urllib.error.HTTPError as exc:
            try:
                payload = json.loads(exc.read() or b"null")
            except ValueError:
                payload = None
            return exc.code, payload
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CLIError(
                f"cannot reach the controller at {self.url} ({reason}); is `controller run` "
                "running, and is --url or --state-dir right?"
            ) from None

    def ok(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        status, payload = self.call(method, path, body, **kwargs)
        if status >= 400:
            # 2: the request was refused as it stands and nothing was applied.
            code = 2 if status in (400, 409, 413, 422) else 1
            raise CLIError(_describe_error(status, payload), code)
        return payload


def _describe_error(status: int, payload: Any) -> str:
    error = payload.get("error") if isinstance(payload, dict) else None
    message = (error.get("message") if isinstance(error, dict) else None) or f"HTTP {status}"
    if status == 401:
        message += " (the CLI reads the token from --token, $CONTROLLER_TOKEN or the state dir)"
    return f"error: {message}"


def _client(args: argparse.Namespace) -> Client:
    state_dir: Path = args.state_dir
    url = args.url
    token = (args.token or os.environ.get(TOKEN_ENV) or "").strip() or None
    if url is None or token is None:
        # Its files say where to send the token, so they are trusted only in a dir that no one
        # else can write: else anyone could point the CLI, and the token, at a server of theirs.
        try:
            check_private(state_dir, create=False)
        except StartupError as exc:
            raise CLIError(f"error: {exc}") from None
    if url is None:
        found = read_address(state_dir).get("url")
        if not isinstance(found, str) or not daemon_running(state_dir):
            why = "no daemon.json" if not isinstance(found, str) else "its daemon.json is stale"
            raise CLIError(
                f"error: no controller daemon is running for the state dir {state_dir} ({why}); "
                "start one with `controller run`, or pass --url (or the --state-dir it runs "
                "with)"
            )
        url = found
    if token is None:
        try:
            token = token_path(state_dir).read_text().strip()
        except OSError:
            token = None  # the daemon will say 401, and the message says where tokens come from
    return Client(url, token)


# -- commands --


def cmd_run(args: argparse.Namespace) -> int:
    import trio

    from ._daemon import DaemonOptions, run_daemon

    _setup_logging(args.log_format)
    options = DaemonOptions(
        state_dir=args.state_dir,
        listen=args.listen,
        runtime=args.runtime,
        store=args.store,
        config=args.config,
        pythonpath=tuple(args.pythonpath),
        ray_address=args.ray_address,
        namespace=args.namespace,
        allow_remote=args.allow_remote,
        max_replicas=args.max_replicas,
    )
    try:
        trio.run(run_daemon, options)
    except BaseException as exc:
        # A start that cannot proceed says why in one line (exit 1; 2 for a bad config file,
        # with nothing applied), wherever in the daemon's nurseries it was raised.
        found = _one_of(exc, (ManifestError, StartupError, CheckpointError))
        if isinstance(found, ManifestError):
            raise CLIError(str(found), 2) from None
        if found is not None:
            raise CLIError(f"controller run: {found}", 1) from None
        raise
    return 0


def _one_of(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """`exc` if it is one of `kinds`, or the only exception inside (nested) groups of one."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, kinds) else None


def cmd_apply(args: argparse.Namespace) -> int:
    from ._manifest import load_manifest

    try:
        manifest = load_manifest(args.file)
    except ManifestError as exc:
        raise CLIError(str(exc), 2) from None
    client = _client(args)
    result = client.ok(
        "POST",
        "/api/v1/apply",
        {
            "backends": {b.name: b.to_dict() for b in manifest.backends},
            "prune": args.prune,
            "source": str(args.file),
        },
    )
    for item in result["applied"]:
        what = "configured" if item["changed"] else "unchanged"
        print(f"backend/{item['name']} {what} (generation {item['generation']})")
    for item in result["deleted"]:
        print(f"backend/{item['name']} deleted (pruned)")
    if not args.wait:
        return 0
    deleting = {item["name"] for item in result["deleted"]}
    names = [item["name"] for item in result["applied"]] + sorted(deleting)
    return _wait(client, names, deleting, args.timeout)


def cmd_status(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.name:
        status = client.ok("GET", f"/api/v1/backends/{urllib.parse.quote(args.name)}")
        if args.json:
            print(json.dumps(status, indent=2))
        else:
            _print_backend(status)
        return 0
    backends = client.ok("GET", "/api/v1/backends")["backends"]
    if args.json:
        print(json.dumps(backends, indent=2))
    elif not backends:
        print("no backends")
    else:
        _print_table(backends)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    client = _client(args)
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
        _print_log(entry, several)
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
            raise CLIError(_describe_error(status, payload))
        for entry in payload["logs"]:
            tag = entry["replica"]
            if tag not in offsets:
                offsets[tag] = 0
            if entry["offset"] == offsets[tag]:
                continue
            fresh = {**query, "replica": tag, "offset": offsets[tag]}
            chunk = client.ok("GET", f"{path}?{urllib.parse.urlencode(fresh)}")["logs"]
            for item in chunk:
                _print_log(item, several or len(offsets) > 1)
                offsets[tag] = item["offset"]
        # Like `kubectl logs -f` when its pod ends: all that was written has been shown.
        if not payload["exists"]:
            print(f"backend/{args.name}: deleted", file=sys.stderr)
            return 0
        if args.replica and all(e["state"] == "GONE" for e in payload["logs"]):
            print(f"replica {args.replica}: gone", file=sys.stderr)
            return 0


def _print_log(entry: dict[str, Any], prefix: bool) -> None:
    text = entry["text"]
    if not prefix:
        sys.stdout.write(text)
    else:
        gone = " (gone)" if entry["state"] == "GONE" else ""
        for line in text.splitlines():
            sys.stdout.write(f"[{entry['replica']}{gone}] {line}\n")
    sys.stdout.flush()


def cmd_delete(args: argparse.Namespace) -> int:
    client = _client(args)
    path = f"/api/v1/backends/{urllib.parse.quote(args.name)}"
    result = client.ok("DELETE", path + ("?force=true" if args.force else ""))
    print(f"backend/{args.name} deleting (generation {result['generation']})")
    if not args.wait:
        return 0
    return _wait(client, [args.name], {args.name}, args.timeout)


def cmd_wait(args: argparse.Namespace) -> int:
    client = _client(args)
    client.ok("GET", f"/api/v1/backends/{urllib.parse.quote(args.name)}")  # 404 if unknown
    return _wait(client, [args.name], set(), args.timeout)


def cmd_shutdown(args: argparse.Namespace) -> int:
    client = _client(args)
    cursor = client.ok("GET", "/api/v1/watch?timeout_s=0")["cursor"]
    left = {b["name"] for b in client.ok("GET", "/api/v1/backends")["backends"]}
    client.ok("POST", "/api/v1/shutdown")
    print("shutting down: draining and deleting every backend")
    # Follow the watch until the daemon closes the connection: that is its exit, seen as it
    # happens, from wherever the CLI runs. Each backend's tombstone says it is gone.
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        try:
            query = urllib.parse.urlencode({"since": cursor, "timeout_s": 30})
            change = client.ok("GET", f"/api/v1/watch?{query}", timeout=40)
        except CLIError:
            if left:
                raise CLIError(
                    f"error: the controller stopped before {', '.join(sorted(left))} were "
                    "deleted (see its log); their replicas keep running, and the next "
                    "`controller run` finishes the deletes"
                ) from None
            print("the controller has stopped")
            return 0
        cursor = change["cursor"]
        left -= {s["name"] for s in change["snapshots"] if not s["exists"]}
    raise CLIError(f"the controller is still running after {args.timeout:g}s")


# -- waiting, like `kubectl rollout status` --


def _wait(client: Client, names: Sequence[str], deleting: set[str], timeout: float) -> int:
    """Show each backend's progress until every goal resolves. 0 if all reached, 1 if any
    backend is DEPLOY_FAILED (or the wait timed out)."""
    deadline = time.monotonic() + timeout
    shown: dict[str, str] = {}
    tracebacks: dict[str, str | None] = {}
    cursor, epoch = 0, ""
    while True:
        statuses = {b["name"]: b for b in client.ok("GET", "/api/v1/backends")["backends"]}
        pending, failed = [], []
        for name in names:
            status = statuses.get(name)
            if name in deleting:
                if status is None:
                    line = "deleted"
                else:
                    pending.append(name)
                    line = f"deleting: {status['message']}"
            elif status is None:
                failed.append(name)
                line = "not found (deleted meanwhile?)"
            else:
                ready = status["ready_of_version"]
                line = f"{ready}/{status['desired']} ready, {status['state']}: {status['message']}"
                if status["state"] == "DEPLOY_FAILED":
                    failed.append(name)
                    line += f" (last error: {status['last_error']})"
                    tracebacks[name] = status.get("last_traceback")
                elif not status["goal_done"]:
                    pending.append(name)
            if shown.get(name) != line:
                shown[name] = line
                print(f"backend/{name}: {line}", flush=True)
        if not pending:
            if failed:
                for name in failed:
                    if tracebacks.get(name):
                        print(f"backend/{name}: the replica's traceback:", file=sys.stderr)
                        print(_indent(str(tracebacks[name])), file=sys.stderr)
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
        change = client.ok("GET", f"/api/v1/watch?{query}")
        cursor, epoch = change["cursor"], change["epoch"]


def _ready(b: dict[str, Any]) -> str:
    """``2/2``: serving replicas of any version over desired; during a rollout, with those of
    the target version: ``2/2 (0/2 v2)``."""
    text = f"{b['ready']}/{b['desired']}"
    if b["ready_of_version"] != b["ready"]:
        text += f" ({b['ready_of_version']}/{b['desired']} {b['version']})"
    return text


def _age(seconds: float | None) -> str:
    """``45s``, ``12m``, ``3h``, ``2d``: how long ago, as kubectl shows it."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _since(iso_time: str | None) -> float | None:
    if not iso_time:
        return None
    moment = datetime.fromisoformat(iso_time.replace("Z", "+00:00"))
    return max(0.0, time.time() - moment.timestamp())


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines())


# -- output --


def _print_table(backends: list[dict[str, Any]]) -> None:
    rows = [("NAME", "STATE", "READY", "REPLICAS", "MESSAGE")]
    for b in backends:
        replicas = "; ".join(
            f"{version}: " + ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
            for version, states in sorted(b["counts_by_version"].items())
        )
        rows.append((b["name"], b["state"], _ready(b), replicas or "-", b["message"]))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        cells = [cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True)]
        print("  ".join([*cells, row[4]]))


def _print_backend(b: dict[str, Any]) -> None:
    print(f"Name:        {b['name']}")
    print(f"State:       {b['state']} ({b['reason']})")
    print(f"Message:     {b['message']}")
    print(f"Generation:  {b['generation']} (observed {b['observed_generation']})")
    print(f"Ready:       {_ready(b)}")
    if b["last_error"]:
        print(f"Last error:  {b['last_error']}")
        if b.get("last_traceback"):
            print(_indent(b["last_traceback"]))
    print("Config:")
    for key, value in b["config"].items():
        print(f"  {key}: {json.dumps(value)}")
    print("Replicas:")
    rows = [("TAG", "STATE", "VERSION", "ADDRESS", "PID", "NODE", "AGE", "")]
    for r in b["replicas"]:
        node = r["node"] or "-"
        rows.append(
            (
                r["tag"],
                r["state"],
                r["version"],
                r["address"] or "-",
                str(r["pid"] or "-"),
                node if len(node) <= 16 else node[:12] + "...",
                _age(r["age_s"]),
                "" if r["healthy"] else "(unhealthy)",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    print("Events:")
    for e in b["events"][-10:]:
        print(f"  {_age(_since(e['time'])):>5} ago  {e['kind']:<14} {e['message']}")


class _JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def _setup_logging(fmt: str) -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(_JSONFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


# -- the parser --


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="controller", description="A replica controller on trio: daemon and CLI."
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=default_state_dir(),
        help=f"the daemon's files: token, address, store, workers (default ${STATE_DIR_ENV} or "
        "~/.local/state/trio-controller)",
    )
    parser.add_argument("--url", help="the daemon's API (default: the one in the state dir)")
    parser.add_argument("--token", help="API token (default $CONTROLLER_TOKEN or the state dir)")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the controller daemon")
    run.add_argument("--listen", default="127.0.0.1:7070", help="HOST:PORT (default %(default)s)")
    run.add_argument("--runtime", choices=["local", "ray"], default="local")
    run.add_argument("--store", choices=["sqlite", "ray"], default="sqlite")
    run.add_argument("--config", type=Path, help="a backends file to apply at start")
    run.add_argument(
        "--pythonpath",
        type=Path,
        action="append",
        default=[],
        help="a directory replicas import from (repeatable)",
    )
    run.add_argument("--ray-address", help="a running Ray cluster (with --runtime/--store ray)")
    run.add_argument("--namespace", default="controller", help="Ray namespace (%(default)s)")
    run.add_argument("--log-format", choices=["human", "json"], default="human")
    run.add_argument(
        "--allow-remote",
        action="store_true",
        help="listening beyond loopback is meant (plain HTTP, bearer token): no warning",
    )
    run.add_argument(
        "--max-replicas",
        type=_positive_int,
        help="how many replicas the runtime holds (per node on Ray); default: from memory",
    )
    run.set_defaults(func=cmd_run)

    apply = sub.add_parser("apply", help="create or update the backends of a file")
    apply.add_argument("-f", "--file", type=Path, required=True)
    apply.add_argument("--prune", action="store_true", help="delete backends not in the file")
    apply.add_argument("--wait", action="store_true", help="show progress until every goal ends")
    apply.add_argument("--timeout", type=float, default=600.0)
    apply.set_defaults(func=cmd_apply)

    status = sub.add_parser("status", help="backends, states and replicas")
    status.add_argument("name", nargs="?")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)

    logs = sub.add_parser("logs", help="a backend's replica logs (kept for gone replicas too)")
    logs.add_argument("name")
    logs.add_argument("--replica", help="one replica's tag (default: every one with a log)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing what is new")
    logs.add_argument("--tail", type=int, default=100, help="lines of each (%(default)s)")
    logs.set_defaults(func=cmd_logs)

    delete = sub.add_parser("delete", help="drain and delete a backend")
    delete.add_argument("name")
    delete.add_argument("--wait", action="store_true")
    delete.add_argument("--force", action="store_true", help="skip the graceful drain")
    delete.add_argument("--timeout", type=float, default=600.0)
    delete.set_defaults(func=cmd_delete)

    wait = sub.add_parser("wait", help="wait until a backend's latest goal ends")
    wait.add_argument("name")
    wait.add_argument("--timeout", type=float, default=600.0)
    wait.set_defaults(func=cmd_wait)

    shutdown = sub.add_parser("shutdown", help="drain and delete everything; stop the daemon")
    shutdown.add_argument("--timeout", type=float, default=180.0)
    shutdown.set_defaults(func=cmd_shutdown)
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1 (got {text})")
    return value


def main(argv: Sequence[str] | None = None) -> NoReturn:
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args))
    except CLIError as exc:
        print(str(exc), file=sys.stderr)
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
    sys.exit(code)
