"""Daemons as the tests run them: ``controller run`` in a process of its own (``Daemon``,
``running``), driven by its CLI and its HTTP API, the manifests it is given, its ingress
processes, its status followed on its watch, and standalone ``controller ingress`` processes in
front of it. The ``state_dir`` fixture of tests/conftest.py gives each test a state dir."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from controller._daemon.statedir import StateDir

HERE = Path(__file__).parent
LIMIT_S = 60
#: How much of a daemon's log a test cut short shows (its end).
LOG_TAIL = 8000


def manifest(**backends: dict[str, Any]) -> str:
    """A TOML manifest of `backends` (values are JSON-compatible, which TOML inline tables
    accept when written as below)."""
    lines = []
    for name, fields in backends.items():
        lines.append(f"[backends.{name}]")
        for key, value in fields.items():
            lines.append(f"{key} = {_toml(value)}")
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def trivial(n: int, version: str = "v1", **extra: Any) -> dict[str, Any]:
    return {
        "entrypoint": "replicas:Trivial",
        "num_replicas": n,
        "version": version,
        "graceful_shutdown_timeout_s": 2,
        **extra,
    }


def app(**fields: Any) -> dict[str, Any]:
    return {
        "entrypoint": "http_replica:HTTPReplica",
        "num_replicas": 2,
        "version": "v1",
        "route_prefix": "/app",
        "max_surge": 1,
        "max_unavailable": 0,
        "graceful_shutdown_timeout_s": 5,
        **fields,
    }


class Daemon:
    def __init__(self, state_dir: Path, python_flags: tuple[str, ...] = ()):
        self.state_dir = state_dir
        self.python_flags = python_flags
        self.process: trio.Process | None = None
        self.log = bytearray()
        self._grew = trio.Event()

    @property
    def ingress_url(self) -> str:
        """Where its ingress serves (it logs the address once bound)."""
        found = re.search(rb"ingress serving routes on (http://[0-9.:]+)", self.log)
        assert found is not None, self.log.decode()
        return found.group(1).decode()

    @property
    def url(self) -> str:
        url: str = json.loads((self.state_dir / "daemon.json").read_text())["url"]
        return url

    @property
    def token(self) -> str:
        return (self.state_dir / "token").read_text().strip()

    async def start(
        self,
        nursery: trio.Nursery,
        *extra: str,
        listen: str = "127.0.0.1:0",
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        """Start `controller run` and return once it listens (it says so on stderr), or has
        exited."""
        process = await trio.lowlevel.open_process(
            [
                *self.cli_argv(),
                "run",
                "--listen",
                listen,
                "--pythonpath",
                str(HERE),
                *ingress_args(extra),
                *list(extra),
            ],
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
        )
        self.process = process
        listening = trio.Event()
        nursery.start_soon(self._read_log, process, listening)
        await listening.wait()

    async def _read_log(self, process: trio.Process, listening: trio.Event) -> None:
        assert process.stderr is not None
        try:
            async with process.stderr:  # closed however the reading ends (a failed test's too)
                async for chunk in process.stderr:
                    self.log += chunk
                    self._grew.set()
                    self._grew = trio.Event()
                    # Its URL: the warning of a listen beyond loopback says "listening on" too,
                    # before the API serves (a shutdown sent then found no daemon.json).
                    if b"listening on http" in self.log:
                        listening.set()
        except BaseException:
            # The test was cut short (its deadline, a failed assertion) with this daemon still
            # running: it ends here, not in the next test (whose collector would find its
            # process object still running, a ResourceWarning that fails that test). Its
            # workers and ingress processes are the state_dir fixture's to end.
            with trio.CancelScope(shield=True):
                if process.returncode is None:
                    process.kill()
                    await process.wait()
                    self.show_log("killed as its test was cut short")
            raise
        listening.set()  # it exited; the caller's next request will say so
        self._grew.set()

    def show_log(self, why: str) -> None:
        """The end of its log, to the test's captured output (pytest shows it with a failure)."""
        tail = bytes(self.log[-LOG_TAIL:]).decode(errors="replace")
        print(f"--- the daemon of {self.state_dir}, {why}; its log's end:\n{tail}", file=sys.stderr)

    async def logged_times(self, text: bytes, times: int) -> None:
        """Wait until the daemon's log holds `text` `times` times (or the daemon has exited)."""
        while self.log.count(text) < times:
            if self.process is not None and self.process.returncode is not None:
                raise AssertionError(f"the daemon exited before logging {text!r} again")
            await self._grew.wait()

    async def logged(self, text: bytes) -> None:
        """Wait until the daemon's log holds `text` (or the daemon has exited)."""
        while text not in self.log:
            if self.process is not None and self.process.returncode is not None:
                raise AssertionError(f"the daemon exited before logging {text!r}")
            await self._grew.wait()

    def cli_argv(self) -> list[str]:
        return [
            sys.executable,
            *self.python_flags,
            "-m",
            "controller",
            "--state-dir",
            str(self.state_dir),
        ]

    async def cli(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return await trio.run_process(
            [*self.cli_argv(), *args], capture_stdout=True, capture_stderr=True, check=False
        )

    async def http(
        self, method: str, path: str, body: bytes | None = None, token: str | None = "default"
    ) -> tuple[int, Any]:
        code, payload, _ = await self.http_with_headers(method, path, body, token)
        return code, payload

    async def http_with_headers(
        self, method: str, path: str, body: bytes | None = None, token: str | None = "default"
    ) -> tuple[int, Any, dict[str, str]]:
        token = self.token if token == "default" else token

        def call() -> tuple[int, Any, dict[str, str]]:
            request = urllib.request.Request(self.url + path, data=body, method=method)
            if token is not None:
                request.add_header("Authorization", f"Bearer {token}")
            if body is not None:
                request.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    raw = response.read()
                    kind = response.headers.get("content-type", "")
                    payload = json.loads(raw) if "json" in kind else raw.decode()
                    return response.status, payload, _lower(response.headers)
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read()), _lower(exc.headers)

        return await trio.to_thread.run_sync(call)

    async def status(self) -> dict[str, Any]:
        """Every backend's status, less the replicas' ages (which grow as time passes)."""
        code, data = await self.http("GET", "/api/v1/backends")
        assert code == 200, data
        for backend in data["backends"]:
            for replica in backend["replicas"]:
                del replica["age_s"]
        return {b["name"]: b for b in data["backends"]}

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.process is not None
        self.process.send_signal(sig)
        return await self.process.wait()


def ingress_args(extra: Sequence[str]) -> list[str]:
    """Tests run daemons side by side: each ingress on a port of its own, unless told, and in
    one process (the tests of several say so)."""
    if "--no-ingress" in extra:
        return []
    args = [] if "--ingress-listen" in extra else ["--ingress-listen", "127.0.0.1:0"]
    if "--ingress-workers" not in extra:
        args += ["--ingress-workers", "1"]
    return args


def ingress_pids(state_dir: Path) -> list[int]:
    """The ingress processes of `state_dir`'s daemons, alive now."""
    found = []
    marker = os.fsencode(str(state_dir))
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if b"controller._daemon.ingress_process" in cmdline and marker in cmdline and state != "Z":
            found.append(int(entry))
    return found


@asynccontextmanager
async def running(
    state_dir: Path,
    *extra: str,
    listen: str = "127.0.0.1:0",
    env: dict[str, str] | None = None,
) -> AsyncIterator[Daemon]:
    """A daemon that is shut down (every backend deleted) at the end."""
    daemon = Daemon(state_dir)
    async with trio.open_nursery() as nursery:
        await daemon.start(nursery, *extra, listen=listen, env=env)
        assert daemon.process is not None
        assert daemon.process.returncode is None, daemon.log
        try:
            yield daemon
        except BaseException:
            daemon.show_log("its test failed")
            raise
        finally:
            # Shielded: a test cut short by its deadline still shuts its daemon down (else its
            # processes, and its pipes' garbage, would fail the tests that come next).
            with trio.CancelScope(shield=True):
                try:
                    with trio.fail_after(LIMIT_S):
                        result = await daemon.cli("shutdown")
                        # The daemon's own words say why a shutdown failed; the CLI's only that.
                        assert result.returncode == 0, (result.stderr, bytes(daemon.log[-6000:]))
                        # Said once the daemon has let go of its state dir: a `run` may follow.
                        assert not StateDir(state_dir).running(), "shutdown said so too soon"
                        assert await daemon.process.wait() == 0
                finally:
                    if daemon.process.returncode is None:
                        daemon.process.kill()
                        await daemon.process.wait()
            assert ingress_pids(state_dir) == [], "shutdown left ingress processes behind"


def _lower(headers: Any) -> dict[str, str]:
    return {key.lower(): value for key, value in headers.items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def one_line(stderr: bytes) -> str:
    """A start-up failure is one line on stderr, with no traceback."""
    text = stderr.decode().strip()
    assert "Traceback" not in text, text
    assert len(text.splitlines()) == 1, text
    return text


def dirs(root: Path, *names: str) -> list[Path]:
    made = []
    for name in names:
        path = root / name
        path.mkdir(mode=0o700)
        made.append(path)
    return made


@contextlib.contextmanager
def killed_at_exit(*daemons: Daemon) -> Iterator[None]:
    """Whatever happens in the test, none of `daemons` outlives it (a stopped one is woken, so
    that it dies), nor the ingress processes of one that had to be killed. Each is reaped here
    (its pipe is closed by its reader): left to the garbage collector, a failed test's daemon
    warned (``ResourceWarning``) in whichever test ran next, and failed that one too."""
    try:
        yield
    finally:
        for daemon in daemons:
            process = daemon.process
            if process is None:
                continue
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)
                process.kill()
                with contextlib.suppress(ChildProcessError):
                    os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)  # not reaped...
                process.poll()  # ...until here, where the Process records how it ended
                for pid in ingress_pids(daemon.state_dir):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)


async def until(daemon: Daemon, name: str, check: Any) -> dict[str, Any]:
    """Follow the daemon's watch until `check(status of name)` holds; return that status."""
    cursor, epoch = 0, ""
    while True:
        status: dict[str, Any] = (await daemon.status())[name]
        if check(status):
            return status
        code, data = await daemon.http(
            "GET", f"/api/v1/watch?since={cursor}&timeout_s=1&epoch={epoch}"
        )
        assert code == 200, data
        cursor, epoch = data["cursor"], data["epoch"]


def settled(version: str) -> Any:
    def check(status: dict[str, Any]) -> bool:
        return bool(
            status["state"] == "HEALTHY"
            and status["version"] == version
            and all(r["version"] == version for r in status["replicas"])
        )

    return check


async def shown(daemon: Daemon, name: str, check: Any) -> dict[str, Any]:
    """`until`, for a standby: the backend may not be in its view of the store yet."""
    cursor, epoch = 0, ""
    while True:
        status: dict[str, Any] | None = (await daemon.status()).get(name)
        if status is not None and check(status):
            return status
        code, data = await daemon.http(
            "GET", f"/api/v1/watch?since={cursor}&timeout_s=1&epoch={epoch}"
        )
        assert code == 200, data
        cursor, epoch = data["cursor"], data["epoch"]


async def role(daemon: Daemon) -> dict[str, Any]:
    code, data = await daemon.http("GET", "/api/v1/backends")
    assert code == 200, data
    leadership: dict[str, Any] = data["leadership"]
    return leadership


async def deploy(daemon: Daemon, name: str, **fields: Any) -> None:
    code, data = await daemon.http(
        "PUT", f"/api/v1/backends/{name}", json.dumps(app(**fields)).encode()
    )
    assert code == 200, data


class Standalone:
    """`controller ingress` processes, read as they log."""

    def __init__(self, process: trio.Process):
        self.process = process
        self.log = bytearray()
        self._grew = trio.Event()

    async def read(self, started: trio.Event) -> None:
        assert self.process.stderr is not None
        async for chunk in self.process.stderr:
            self.log += chunk
            self._grew.set()
            self._grew = trio.Event()
            if b"serving on" in self.log:
                started.set()
        started.set()
        await self.process.stderr.aclose()

    async def logged(self, text: bytes, times: int = 1) -> None:
        while self.log.count(text) < times:
            assert self.process.returncode is None, self.log.decode()
            await self._grew.wait()


async def standalone(nursery: trio.Nursery, daemon: Daemon, port: int, *extra: str) -> Standalone:
    process = await trio.lowlevel.open_process(
        [
            *daemon.cli_argv(),
            *("--url", daemon.url, f"--token={daemon.token}"),
            *("ingress", "--listen", f"127.0.0.1:{port}", *extra),
        ],
        stderr=subprocess.PIPE,
    )
    ingress = Standalone(process)
    started = trio.Event()
    nursery.start_soon(ingress.read, started)
    await started.wait()
    return ingress


async def converged_daemon(
    nursery: trio.Nursery, state_dir: Path, n: int, listen: str = "127.0.0.1:0"
) -> Daemon:
    """A daemon that applied a backend `a` of `n` replicas at start, and reached it."""
    file = state_dir / "backends.toml"
    file.write_text(manifest(a=trivial(n)))
    daemon = Daemon(state_dir)
    await daemon.start(nursery, "--config", str(file), listen=listen)
    assert (await daemon.cli("wait", "a")).returncode == 0
    return daemon
