"""The daemon end to end: a real `controller run` process on a loopback port, driven by the CLI
and by an HTTP client; real worker processes; real clock, every wait bounded by fail_after."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from .test_local_runtime import worker_pids

HERE = Path(__file__).parent
LIMIT_S = 60


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
        async for chunk in process.stderr:
            self.log += chunk
            self._grew.set()
            self._grew = trio.Event()
            if b"listening on" in self.log:
                listening.set()
        listening.set()  # it exited; the caller's next request will say so
        self._grew.set()

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


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dm", dir="/tmp"))  # short: Unix socket paths
    yield path
    leftovers = worker_pids(path)
    for pid in leftovers:
        os.killpg(pid, signal.SIGKILL)
    # A daemon stopped by a signal leaves its ingress processes serving, by design (the next
    # one adopts them); a test that shut its daemon down checks that none is left itself.
    for pid in ingress_pids(path):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)
    assert leftovers == {}, "a test left worker processes behind"


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
        finally:
            with trio.fail_after(LIMIT_S):
                result = await daemon.cli("shutdown")
                assert result.returncode == 0, result.stderr
                assert await daemon.process.wait() == 0
            assert ingress_pids(state_dir) == [], "shutdown left ingress processes behind"


async def test_apply_scale_roll_prune_and_delete_through_the_cli(state_dir: Path) -> None:
    file = state_dir / "backends.toml"
    with trio.fail_after(LIMIT_S * 2):
        async with running(state_dir) as daemon:
            file.write_text(manifest(a=trivial(2), b=trivial(1)))
            result = await daemon.cli("apply", "-f", str(file), "--wait")
            out = result.stdout.decode()
            assert result.returncode == 0, result.stderr
            assert "backend/a configured (generation 1)" in out
            assert "backend/a: 2/2 ready, HEALTHY" in out
            assert out.rstrip().endswith("done")
            assert len(worker_pids(state_dir)) == 3

            # The same file again changes nothing.
            result = await daemon.cli("apply", "-f", str(file))
            assert "backend/a unchanged (generation 1)" in result.stdout.decode()

            # Scale and roll a, prune b.
            file.write_text(manifest(a=trivial(3, "v2")))
            result = await daemon.cli("apply", "-f", str(file), "--prune", "--wait")
            out = result.stdout.decode()
            assert result.returncode == 0, result.stderr
            assert "backend/b deleted (pruned)" in out
            assert "backend/b: deleted" in out
            status = await daemon.status()
            assert set(status) == {"a"}
            assert status["a"]["counts_by_version"] == {"v2": {"RUNNING": 3}}

            table = (await daemon.cli("status")).stdout.decode()
            assert table.splitlines()[0].split()[:4] == ["NAME", "STATE", "READY", "REPLICAS"]
            assert "a     HEALTHY  3/3    v2: 3 RUNNING" in table
            detail = json.loads((await daemon.cli("status", "a", "--json")).stdout)
            assert detail["generation"] == 2

            result = await daemon.cli("delete", "a", "--wait")
            assert result.returncode == 0, result.stderr
            assert "backend/a: deleted" in result.stdout.decode()
            assert await daemon.status() == {}
            assert worker_pids(state_dir) == {}


async def test_wait_exits_non_zero_on_deploy_failed(state_dir: Path) -> None:
    file = state_dir / "bad.toml"
    file.write_text(manifest(broken={"entrypoint": "replicas:FailsInInit", "version": "v1"}))
    with trio.fail_after(LIMIT_S):
        async with running(state_dir) as daemon:
            result = await daemon.cli("apply", "-f", str(file), "--wait")
            assert result.returncode == 1
            out = result.stdout.decode()
            assert "DEPLOY_FAILED" in out
            assert "ValueError: bad port" in out
            result = await daemon.cli("wait", "broken")
            assert result.returncode == 1


async def test_every_endpoint_but_healthz_needs_the_token(state_dir: Path) -> None:
    with trio.fail_after(LIMIT_S):
        async with running(state_dir) as daemon:
            assert (state_dir / "token").stat().st_mode & 0o777 == 0o600
            assert await daemon.http("GET", "/healthz", token=None) == (200, {"ok": True})
            body = json.dumps(trivial(1)).encode()
            for token in (None, "wrong"):
                for method, path, data in [
                    ("GET", "/api/v1/backends", None),
                    ("PUT", "/api/v1/backends/a", body),
                    ("DELETE", "/api/v1/backends/a", None),
                    ("POST", "/api/v1/shutdown", b"{}"),
                    ("GET", "/metrics", None),
                    ("GET", "/openapi.json", None),
                ]:
                    code, error = await daemon.http(method, path, data, token=token)
                    assert code == 401, (method, path, token)
                    assert error["error"]["type"] == "Unauthorized"
            assert await daemon.status() == {}  # nothing was deployed, nothing shut down
            code, spec = await daemon.http("GET", "/openapi.json")
            assert code == 200
            assert "/api/v1/watch" in spec["paths"]


async def test_bad_files_and_bodies_are_rejected_and_change_nothing(state_dir: Path) -> None:
    file = state_dir / "backends.toml"
    with trio.fail_after(LIMIT_S):
        async with running(state_dir) as daemon:
            file.write_text(manifest(a=trivial(1)))
            assert (await daemon.cli("apply", "-f", str(file), "--wait")).returncode == 0
            before = await daemon.status()

            file.write_text(
                manifest(
                    a=trivial(-1, typo=1),
                    b={"num_replicas": "two", "max_surge": 0, "max_unavailable": 0},
                )
            )
            result = await daemon.cli("apply", "-f", str(file))
            assert result.returncode == 2
            err = result.stderr.decode()
            assert f"in {file}; nothing was applied" in err
            for expected in [
                "backend 'a': typo: unknown field",
                "backend 'a': num_replicas: must be a whole number from 0 to 1000000 (got -1)",
                "backend 'b': entrypoint: is required",
                "backend 'b': num_replicas: must be a whole number from 0 to 1000000 (got 'two')",
            ]:
                assert expected in err, expected
            file.write_text("[backends.a\nnum_replicas = 1")
            result = await daemon.cli("apply", "-f", str(file))
            assert result.returncode == 2
            assert "not valid TOML" in result.stderr.decode()

            rejected = [
                ("PUT", "/api/v1/backends/a", b"x" * (2 << 20), 413, "TooLarge"),
                ("PUT", "/api/v1/backends/a", b'{"entrypoint": ', 400, "MalformedJSON"),
                ("PUT", "/api/v1/backends/a", b"[" * 100_000, 400, "MalformedJSON"),
                ("PUT", "/api/v1/backends/a", b'{"entrypoint": "m:C", "x": 1}', 422, "Invalid"),
                ("PUT", "/api/v1/backends/a", b'{"num_replicas": 1}', 422, "Invalid"),
                ("PUT", "/api/v1/backends/a b", b'{"entrypoint": "m:C"}', 422, "Invalid"),
                ("POST", "/api/v1/apply", b'{"backends": {"a": 1}}', 422, "Invalid"),
                ("POST", "/api/v1/apply", b'{"backends": {}, "prune": "yes"}', 422, "Invalid"),
                ("GET", "/api/v1/watch?since=x", None, 400, "BadQuery"),
                ("GET", "/api/v1/backends/nope", None, 404, "UnknownBackend"),
                ("DELETE", "/api/v1/backends/nope", None, 404, "UnknownBackend"),
                ("GET", "/api/v1/nothing", None, 404, "NotFound"),
            ]
            for method, path, body, code, kind in rejected:
                got, error = await daemon.http(method, path.replace(" ", "%20"), body)
                assert got == code, (method, path, error)
                assert error["error"]["type"].startswith(kind), (path, error)
            assert await daemon.status() == before


async def test_sigterm_then_restart_adopts_every_replica(state_dir: Path) -> None:
    file = state_dir / "backends.toml"
    file.write_text(manifest(a=trivial(2)))
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            first = Daemon(state_dir)
            await first.start(nursery, "--config", str(file))
            assert (await first.cli("wait", "a")).returncode == 0
            pids = worker_pids(state_dir)
            tags = {r["tag"] for r in (await first.status())["a"]["replicas"]}
            assert await first.stop(signal.SIGTERM) == 0
            assert not (state_dir / "daemon.json").exists()
            assert worker_pids(state_dir) == pids  # the replicas outlive the daemon

        async with running(state_dir) as second:
            assert (await second.cli("wait", "a")).returncode == 0
            assert {r["tag"] for r in (await second.status())["a"]["replicas"]} == tags
            assert worker_pids(state_dir) == pids  # adopted: none restarted
            assert b"adopting 2 replicas" in second.log


async def test_metrics_parse_and_count_what_happened(state_dir: Path) -> None:
    file = state_dir / "backends.toml"
    file.write_text(manifest(a=trivial(2), b=trivial(1, "v7")))
    with trio.fail_after(LIMIT_S):
        async with running(state_dir, "--config", str(file)) as daemon:
            assert (await daemon.cli("wait", "a")).returncode == 0
            assert (await daemon.cli("wait", "b")).returncode == 0
            code, text = await daemon.http("GET", "/metrics")
            assert code == 200
            samples = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
            }
            replicas = "controller_replicas"
            assert samples[(replicas, (("backend", "a"), ("state", "RUNNING"), ("version", "v1")))]
            assert samples[(replicas, (("backend", "b"), ("state", "RUNNING"), ("version", "v7")))]
            assert samples[("controller_replica_start_seconds_count", (("outcome", "ready"),))]
            assert samples[("controller_checkpoint_write_seconds_count", ())] >= 4
            assert samples[("controller_events_handled_total", (("backend", "a"),))] >= 2
            assert ("controller_event_to_action_seconds_count", ()) in samples


async def test_a_bad_config_at_start_stops_before_anything(state_dir: Path) -> None:
    file = state_dir / "bad.toml"
    file.write_text(manifest(a={"entrypoint": "nope", "num_replicas": -2}))
    with trio.fail_after(LIMIT_S):
        result = await trio.run_process(
            [*Daemon(state_dir).cli_argv(), "run", "--config", str(file)],
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 2
    err = result.stderr.decode()
    assert "2 problems" in err
    assert "backend 'a': entrypoint:" in err
    assert not (state_dir / "controller.db").exists()
    assert not (state_dir / "token").exists()


async def test_json_logs_one_object_per_line(state_dir: Path) -> None:
    file = state_dir / "backends.toml"
    file.write_text(manifest(a=trivial(1)))
    with trio.fail_after(LIMIT_S):
        async with running(state_dir, "--config", str(file), "--log-format", "json") as daemon:
            assert (await daemon.cli("wait", "a")).returncode == 0
            lines = [json.loads(line) for line in daemon.log.decode().splitlines()]
    messages = [line["message"] for line in lines]
    assert any(m.startswith("listening on http://127.0.0.1:") for m in messages)
    assert any("RUNNING at" in m for m in messages)
    assert {"time", "level", "logger", "message"} <= set(lines[0])


def _lower(headers: Any) -> dict[str, str]:
    return {key.lower(): value for key, value in headers.items()}
