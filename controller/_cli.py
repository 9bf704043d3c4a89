"""The ``controller`` command: ``run`` is the daemon; every other command talks to its HTTP API.

controller run [--config FILE] [--listen HOST:PORT] [--runtime local|ray] [--store sqlite|ray]
controller apply -f FILE [--prune] [--wait]
controller status [NAME] [--json]
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
from pathlib import Path
from typing import Any, NoReturn

from ._errors import ManifestError

STATE_DIR_ENV = "CONTROLLER_STATE_DIR"
DEFAULT_URL = "http://127.0.0.1:7070"
#: The longest a watch request waits before the CLI refreshes what it shows.
_REFRESH_S = 1.0


class CLIError(Exception):
    """Something the user should read; the command exits with `code`."""

    def __init__(self, message: str, code: int = 1):
        self.code = code
        super().__init__(message)


def default_state_dir() -> Path:
    env = os.environ.get(STATE_DIR_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "trio-controller"


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
                return response.status, json.loads(response.read() or b"null")
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
            raise CLIError(_describe_error(status, payload), 2 if status in (400, 413, 422) else 1)
        return payload


def _describe_error(status: int, payload: Any) -> str:
    error = payload.get("error", {}) if isinstance(payload, dict) else {}
    message = error.get("message") or f"HTTP {status}"
    if status == 401:
        message += " (the CLI reads the token from --token, $CONTROLLER_TOKEN or the state dir)"
    return f"error: {message}"


def _client(args: argparse.Namespace) -> Client:
    state_dir: Path = args.state_dir
    url = args.url
    if url is None:
        try:
            url = json.loads((state_dir / "daemon.json").read_text())["url"]
        except (OSError, ValueError, KeyError):
            url = DEFAULT_URL
    token = args.token or os.environ.get("CONTROLLER_TOKEN")
    if token is None:
        try:
            token = (state_dir / "token").read_text().strip()
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
    )
    try:
        trio.run(run_daemon, options)
    except ManifestError as exc:
        raise CLIError(str(exc), 2) from None
    return 0


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
    client.ok("POST", "/api/v1/shutdown")
    print("shutting down: draining and deleting every backend")
    # Follow the watch until the daemon closes the connection: that is its exit, seen as it
    # happens, from wherever the CLI runs.
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        try:
            query = urllib.parse.urlencode({"since": cursor, "timeout_s": 30})
            cursor = client.ok("GET", f"/api/v1/watch?{query}", timeout=40)["cursor"]
        except CLIError:
            print("the controller has stopped")
            return 0
    raise CLIError(f"the controller is still running after {args.timeout:g}s")


# -- waiting, like `kubectl rollout status` --


def _wait(client: Client, names: Sequence[str], deleting: set[str], timeout: float) -> int:
    """Show each backend's progress until every goal resolves. 0 if all reached, 1 if any
    backend is DEPLOY_FAILED (or the wait timed out)."""
    deadline = time.monotonic() + timeout
    shown: dict[str, str] = {}
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
                ready = _ready_of_target(status)
                line = f"{ready}/{status['desired']} ready, {status['state']}: {status['message']}"
                if status["state"] == "DEPLOY_FAILED":
                    failed.append(name)
                    line += f" (last error: {status['last_error']})"
                elif not status["goal_done"]:
                    pending.append(name)
            if shown.get(name) != line:
                shown[name] = line
                print(f"backend/{name}: {line}", flush=True)
        if not pending:
            if failed:
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


def _ready_of_target(status: dict[str, Any]) -> int:
    version = status["config"]["version"] or f"gen-{status['generation']}"
    by_state = status["counts_by_version"].get(version, {})
    return int(by_state.get("RUNNING", 0)) + int(by_state.get("UPDATING", 0))


# -- output --


def _print_table(backends: list[dict[str, Any]]) -> None:
    rows = [("NAME", "STATE", "READY", "REPLICAS", "MESSAGE")]
    for b in backends:
        replicas = "; ".join(
            f"{version}: " + ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
            for version, states in sorted(b["counts_by_version"].items())
        )
        ready = f"{_ready_of_target(b)}/{b['desired']}"
        rows.append((b["name"], b["state"], ready, replicas or "-", b["message"]))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        cells = [cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True)]
        print("  ".join([*cells, row[4]]))


def _print_backend(b: dict[str, Any]) -> None:
    print(f"Name:        {b['name']}")
    print(f"State:       {b['state']} ({b['reason']})")
    print(f"Message:     {b['message']}")
    print(f"Generation:  {b['generation']} (observed {b['observed_generation']})")
    print(f"Ready:       {_ready_of_target(b)}/{b['desired']}")
    if b["last_error"]:
        print(f"Last error:  {b['last_error']}")
    print("Config:")
    for key, value in b["config"].items():
        print(f"  {key}: {json.dumps(value)}")
    print("Replicas:")
    for r in b["replicas"]:
        health = "" if r["healthy"] else "  (unhealthy)"
        print(f"  {r['tag']}  {r['state']:<10}  {r['version']:<8}  {r['address'] or '-'}{health}")
    print("Events:")
    for e in b["events"][-10:]:
        print(f"  {e['kind']:<14} {e['message']}")


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


def main(argv: Sequence[str] | None = None) -> NoReturn:
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args))
    except CLIError as exc:
        print(str(exc), file=sys.stderr)
        code = exc.code
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
