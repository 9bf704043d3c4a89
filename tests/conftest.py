from __future__ import annotations

import collections
import contextlib
import os
import secrets
import select
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

import controller
from controller._ports.wrap import StoreWrapper
from controller.testing import FakeRuntime, FakeState

from .daemons import ingress_pids
from .workers import Harness, worker_pids

T = TypeVar("T")

RC = controller.ReplicaConfig("app.replica:Echo")

#: What the reliability suites counted (crash points, histories, inputs): printed at the end of
#: the run, for RELIABILITY.md (``nox -s reliability``).
FIGURES: dict[str, str] = {}


def pytest_sessionfinish(session: pytest.Session) -> None:
    # A worker of a parallel run (pytest-xdist) hands its figures to the run that prints them.
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["figures"] = dict(FIGURES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    FIGURES.update(getattr(node, "workeroutput", {}).get("figures", {}))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("reliability figures")
        for what, figure in sorted(FIGURES.items()):
            terminalreporter.write_line(f"{what}: {figure}")


#: Every process the tests start inherits this mark in its environment, so that one left behind
#: is found even once it has left the process tree (a daemon's ingress processes outlive it).
_MARK = f"{os.getpid()}-{secrets.token_hex(4)}"
os.environ["CONTROLLER_TEST_RUN"] = _MARK
#: How long a process found at a test's end may take to finish exiting (one killed by the
#: test's own clean-up a moment ago) before it counts as left behind.
LEFTOVER_GRACE_S = 3.0


def _ours() -> dict[int, str]:
    """This run's processes of the project (daemons, workers, fork servers, ingress processes,
    the tests' helpers), alive now, with their command lines. Ray's and the browser's are not
    counted: their clusters and browsers live for a module, and they pool their own workers."""
    found = {}
    mark = f"CONTROLLER_TEST_RUN={_MARK}\0".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if mark not in Path(f"/proc/{entry}/environ").read_bytes():
                continue
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode().split("\0")
            if state not in ("Z", "X") and any(map(_of_ours, argv)):
                found[int(entry)] = " ".join(argv).strip()
    return found


def _of_ours(arg: str) -> bool:
    """An argument that makes a process ours: a module of the package (``-m controller...``,
    or the name a process gives itself), or a script of the tests."""
    return arg.split(".")[0] == "controller" or arg.startswith(_TESTS)


_TESTS = str(Path(__file__).parent) + os.sep


def _gone_within(pids: set[int], limit_s: float) -> set[int]:
    """Those of `pids` still running after `limit_s` (each waited on through a pidfd)."""
    fds = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            fds[os.pidfd_open(pid)] = pid
    try:
        deadline = time.monotonic() + limit_s
        while fds and (left := deadline - time.monotonic()) > 0:
            for fd in select.select(list(fds), [], [], left)[0]:
                del fds[fd]
                os.close(fd)
        return set(fds.values())
    finally:
        for fd in fds:
            os.close(fd)


@pytest.fixture(autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """Fail a test that leaves a process of ours running (after its fixtures' own clean-up),
    and kill what it left, so that the next test starts clean."""
    before = set(_ours())
    yield
    found = {pid: line for pid, line in _ours().items() if pid not in before}
    left = _gone_within(set(found), LEFTOVER_GRACE_S) if found else set()
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"the test left processes behind (killed now): {[found[p] for p in left]}"


#: What makes a test slow: a fixture that starts real processes (workers, a daemon's state, a Ray
#: cluster, a browser), or a module whose tests start them in their bodies. ``-m "not slow"``
#: (``nox -s quick``) runs the rest: the in-process suite, for the edit-test loop.
SLOW_FIXTURES = frozenset({"state_dir", "runtime_dir", "cluster", "browser", "daemon"})
SLOW_MODULES = frozenset(
    {
        "test_aio",
        "test_api_contract",
        "test_examples",
        "test_ingress_attack",
        "test_kill9",
        "test_rollout_api",
        "test_runtime_fencing",
        "test_soak",
        "test_standby_daemon",
    }
)


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")


def pytest_report_header() -> str | None:
    from .pristine import NOTICE

    return NOTICE


#: Files handed out first, before xdist's order (most tests first): one long test each, which
#: otherwise goes out among the last files and runs alone at the end. Measured on 2 cores, 4
#: processes: the schemathesis run (63 s) started at 404 s and ended the suite at 467 s, while
#: the other three processes had ended by 413 s.
START_FIRST = ("tests/daemon/test_api_contract.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # xdist's own order, by number of tests (``nox -s tests`` turns its reordering off, which
    # would undo this one), but for `START_FIRST`. A file's tests stay together: the sort is
    # stable, and each file's key is the same for all its tests.
    counts = collections.Counter(item.nodeid.split("::")[0] for item in items)

    def order(item: pytest.Item) -> tuple[bool, int]:
        path = item.nodeid.split("::")[0]
        return path not in START_FIRST, -counts[path]

    items.sort(key=order)
    for item in items:
        module = _module(item)
        fixtures = set(getattr(item, "fixturenames", ()))
        if module in SLOW_MODULES or fixtures & SLOW_FIXTURES:
            item.add_marker(pytest.mark.slow)


# -- The fixtures of the modules that start real processes: LocalRuntime's workers (a runtime
# dir, and a harness on it), and daemons (a state dir). Modules with a set-up of their own
# define a fixture of the same name (tests/local/test_fork_server.py, tests/ingress/test_ingress.py,
# tests/on_ray/test_ray_runtime.py), which pytest uses there instead.


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    # Short, because Unix socket paths are limited to 107 bytes.
    path = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    yield path
    leftovers = _kill_leftover_workers(path)
    shutil.rmtree(path, ignore_errors=True)
    assert leftovers == set(), "a test left worker processes behind"


def _kill_leftover_workers(path: Path) -> set[int]:
    """The workers of `path` still running after the grace a loaded machine needs (one killed
    by the test may not be reaped yet, as `no_process_left_behind` allows), killed now."""
    leftovers = _gone_within(set(worker_pids(path)), LEFTOVER_GRACE_S)
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return leftovers


@pytest.fixture
async def harness(runtime_dir: Path, tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(runtime_dir, tmp_path / "events.jsonl")
    yield h
    h.store.close()


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dm", dir="/tmp"))  # short: Unix socket paths
    yield path
    leftovers = _kill_leftover_workers(path)
    # A daemon stopped by a signal leaves its ingress processes serving, by design (the next
    # one adopts them); a test that shut its daemon down checks that none is left itself.
    for pid in ingress_pids(path):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)
    assert leftovers == set(), "a test left worker processes behind"


def config(**kwargs: object) -> controller.BackendConfig:
    kwargs.setdefault("version", "v1")
    return controller.BackendConfig(**kwargs)


#: Virtual seconds after which a test counts as deadlocked (a week: no test needs near that).
DEADLOCK_LIMIT_S = 7 * 24 * 3600

#: No jitter, so that backoff waits are exact under MockClock: 1 s, 2 s, 4 s... capped at 60 s.
EXACT = controller.RestartPolicy(jitter=0.0)


@asynccontextmanager
async def opened(
    runtime: controller.Runtime | None = None,
    store: controller.Store | None = None,
    policy: controller.RestartPolicy = EXACT,
) -> AsyncIterator[controller.Controller]:
    # A deadline far beyond any test's needs: under autojump_clock a test that deadlocks would
    # otherwise spin forever (with no deadline, there is nothing to jump to); with one, the clock
    # jumps there and the test fails with TooSlowError. On the real clock it never fires.
    with trio.fail_after(DEADLOCK_LIMIT_S):
        async with controller.open_controller(
            runtime=runtime if runtime is not None else FakeRuntime(auto_ready=True),
            store=store if store is not None else controller.MemoryStore(),
            restart_policy=policy,
            seed=0,
        ) as ctl:
            yield ctl


async def deploy_ready(
    ctl: controller.Controller, rt: FakeRuntime, cfg: controller.BackendConfig, name: str = "a"
) -> controller.Goal:
    """Deploy, finish every start by hand, and wait for the goal."""
    goal = await ctl.deploy(name, cfg, RC)
    await settle()
    for tag in rt.tags(FakeState.STARTING):
        rt.finish_start(tag)
    assert await goal.wait() is controller.GoalOutcome.COMPLETED
    return goal


async def serving(ctl: controller.Controller, name: str, count: int) -> None:
    """Wait until the controller's watch snapshot of `name` lists `count` replicas."""
    snapshot = ctl.snapshot(name)
    while len(snapshot.replicas) != count:
        snapshot = (await ctl.listen_for_change({name: snapshot.snapshot_id}))[name]


async def settle() -> None:
    """Let every task run until all are blocked (on the runtime, a timer or an event)."""
    await trio.testing.wait_all_tasks_blocked()


class HeldSpecWrites(StoreWrapper):
    """A store whose next write of a spec waits, once `hold` is set, until it is released."""

    def __init__(self, inner: controller.Store):
        super().__init__(inner)
        self.hold: trio.Event | None = None
        self.holding = trio.Event()

    async def around(self, op: str, keys: Sequence[str], work: Callable[[], Awaitable[T]]) -> T:
        hold = self.hold
        if hold is not None and op == "write" and any(k.startswith("spec/") for k in keys):
            self.hold = None
            self.holding.set()
            await hold.wait()
        return await work()


class FlakyStore:
    """A MemoryStore whose writes fail while `failing` is set; it keeps the keys of each batch
    it wrote."""

    def __init__(self) -> None:
        self.inner = controller.MemoryStore()
        self.data = self.inner.data
        self.failing = False
        self.batches: list[list[str]] = []

    async def read_all(self) -> dict[str, str]:
        return await self.inner.read_all()

    async def write(self, changes: Mapping[str, str | None]) -> None:
        await trio.lowlevel.checkpoint()
        if self.failing:
            raise controller.StoreError("disk full")
        self.batches.append(list(changes))
        await self.inner.write(changes)
