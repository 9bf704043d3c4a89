"""LocalRuntime's workers as the tests see them: found in the OS process table, and a runtime
dir with its store and a LocalRuntime on it (``Harness``, which the ``harness`` fixture of
tests/conftest.py makes, on its ``runtime_dir``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import trio

import controller
from controller import ReplicaState
from controller._ports.wrap import RuntimeWrapper

HERE = Path(__file__).parent
T = TypeVar("T")
LIMIT_S = 30  # generous: CI machines are slow at spawning Python


def worker_pids(runtime_dir: Path) -> dict[int, str]:
    """Every worker process of `runtime_dir` in the OS process table, with its state letter:
    spawned ones by their command line, and forked ones (which have the fork server's command
    line) by the pid files they write, which are removed when they are gone."""
    forked = set()
    for pid_file in runtime_dir.rglob("*.pid"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            forked.add(int(pid_file.read_text().split()[0]))
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        ours = b"controller.worker" in cmdline or (
            b"controller._local.zygote_main" in cmdline and int(entry) in forked
        )
        if ours and str(runtime_dir).encode() in cmdline:
            state = next(
                line.split()[1] for line in status.splitlines() if line.startswith("State:")
            )
            found[int(entry)] = state
    return found


def is_zombie_or_gone(pid: int) -> str:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return "gone"
    return next(line.split()[1] for line in status.splitlines() if line.startswith("State:"))


class Harness:
    """A runtime dir, its store and a LocalRuntime on it: workers spawned by default
    (tests/local/test_local_runtime.py tests the spawn path), forked in
    tests/local/test_fork_server.py."""

    def __init__(self, runtime_dir: Path, record: Path, *, fork_server: bool = False):
        self.runtime_dir = runtime_dir
        self.workdir = runtime_dir / "w"
        self.record = str(record)
        self.fork_server = fork_server
        self.store = controller.SQLiteStore(runtime_dir / "state.db")
        self.runtime = self.local()

    def local(
        self, *, term_timeout_s: float = 2.0, fork_server: bool | None = None
    ) -> controller.LocalRuntime:
        """Another LocalRuntime on the same dir (a controller reopened there)."""
        return controller.LocalRuntime(
            self.workdir,
            pythonpath=[HERE],
            fork_server=self.fork_server if fork_server is None else fork_server,
            term_timeout_s=term_timeout_s,
        )

    def recorder(self, **kwargs: object) -> controller.ReplicaConfig:
        return controller.ReplicaConfig(
            "replicas:Recorder", init_kwargs={"path": self.record, **kwargs}
        )


async def all_running(ctl: controller.Controller, name: str) -> None:
    """Wait until every replica of `name` is RUNNING: adopted, after a restart (the watch lists
    replicas that served before that, so it cannot tell)."""
    await ctl.wait_until(
        lambda c: {r.state for r in c.status(name).replicas} == {ReplicaState.RUNNING}
    )


class WaitsForTheForkServer(RuntimeWrapper):
    """Starts only once the fork server is ready, so that every worker is forked."""

    def __init__(self, inner: controller.LocalRuntime) -> None:
        super().__init__(inner)
        self.local = inner

    async def around(self, op: str, tag: str | None, work: Callable[[], Awaitable[T]]) -> T:
        if op == "start":
            assert await self.local.wait_fork_server_ready()
        return await work()


def checked(path: Path) -> controller.ReplicaConfig:
    return controller.ReplicaConfig("replicas:CheckedByFile", init_kwargs={"path": str(path)})


def spec(tag: str, entry: controller.ReplicaConfig) -> controller.ReplicaSpec:
    return controller.ReplicaSpec(tag, tag.split("#")[0], "v1", entry, None, {})


class Deaths:
    def __init__(self) -> None:
        self.told: list[tuple[str, str]] = []
        self.loads: list[tuple[str, int | None]] = []
        self.changed = trio.Event()

    def __call__(self, tag: str, reason: str) -> None:
        self.told.append((tag, reason))
        self.changed.set()

    def load(self, tag: str, ongoing: int | None, served: int | None = None) -> None:
        self.loads.append((tag, ongoing))
        self.changed.set()

    async def wait(self, predicate: object) -> None:
        while not predicate():  # type: ignore[operator]
            self.changed = trio.Event()
            await self.changed.wait()
