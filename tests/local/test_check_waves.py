"""Health checks taken as waves (issue 31): a runtime checks the replicas due together in one
call (``check_health_replicas``), LocalRuntime writes every request before it waits for any and
reads every monitor connection with one task (``check_wave``, ``LinkReader``), and what the
wrappers around a runtime (fencing, metrics) and the controller's wave task make of it."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest
import trio
import trio.testing

import controller
from controller import FencedError, ReplicaError
from controller._api.metrics import Metrics
from controller._backend import events as ev
from controller._backend.tasks import checks
from controller._leadership.fencing import FencedRuntime
from controller._local.check_wave import check_wave
from controller._local.link import MonitorLink
from controller._local.link_reader import LinkReader
from controller._local.wire import LineStream, check_passed, parse_check_request
from controller._ports.wrap import RuntimeWrapper
from controller.testing import FakeRuntime

from ..workers import LIMIT_S, Deaths, Harness, checked, spec

Results = list[tuple[str, Exception | None]]


Pairs = list[tuple[MonitorLink, trio.SocketStream]]


@pytest.fixture
async def links() -> AsyncIterator[Callable[[int], Pairs]]:
    """Make `count` monitor links, each with the worker's end of its connection; those ends
    are closed after the test."""
    made: Pairs = []

    def make(count: int) -> Pairs:
        pairs = []
        for i in range(count):
            ours, theirs = trio.socket.socketpair()
            link = MonitorLink(f"t#{i}", LineStream(trio.SocketStream(ours)), checks=True)
            pairs.append((link, trio.SocketStream(theirs)))
        made.extend(pairs)
        return pairs

    yield make
    for link, far in made:
        await far.aclose()
        await link.close()


@contextlib.asynccontextmanager
async def read(pairs: Pairs) -> AsyncIterator[trio.Nursery]:
    """Every link of `pairs` read by one LinkReader (within 5 s); yields the nursery, which
    is cancelled at the end."""
    reader = LinkReader()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.serve)
            for link, _ in pairs:
                nursery.start_soon(reader.read, link, lambda load, served, models: None)
            yield nursery
            nursery.cancel_scope.cancel()


async def _ident(far: trio.SocketStream) -> int:
    """The id of the one check request `far` has been sent."""
    line = b""
    while not line.endswith(b"\n"):
        line += await far.receive_some(4096)
    asked = parse_check_request(line.rstrip(b"\n"))
    assert asked is not None
    return asked[0]


async def test_a_wave_is_asked_at_once_and_reported_as_its_answers_come(
    tmp_path: Path, links: Callable[[int], Pairs]
) -> None:
    pairs = links(3)
    reports: list[Results] = []
    async with read(pairs) as nursery:
        asked = [(link.tag, link) for link, _ in pairs]
        nursery.start_soon(check_wave, asked, 7, tmp_path, reports.append)
        # Every request is out before any answer.
        idents = [await _ident(far) for _, far in pairs]
        (_, a), (_, b), (_, c) = pairs
        # Both written before the reader can run (send_all would let it run in between).
        os.write(a.socket.fileno(), check_passed(idents[0]))
        os.write(b.socket.fileno(), check_passed(idents[1]))
        await trio.testing.wait_all_tasks_blocked()
        # The two that came together are one report.
        assert reports == [[("t#0", None), ("t#1", None)]]
        await c.send_all(b'{"check":%d,"ok":false,"error_type":"E","message":"m"}\n' % idents[2])
        await trio.testing.wait_all_tasks_blocked()
        assert len(reports) == 2
        ((tag, error),) = reports[1]
        assert tag == "t#2"
        assert isinstance(error, ReplicaError)
        assert error.summary == "E: m"


async def test_a_wave_cut_by_its_deadline_forgets_the_checks_left(
    tmp_path: Path, links: Callable[[int], Pairs]
) -> None:
    pairs = links(2)
    reports: list[Results] = []
    async with read(pairs) as nursery:
        (quick, quick_far), (slow, slow_far) = pairs
        late: list[int] = []
        deadline = trio.CancelScope()

        async def worker_ends() -> None:
            await quick_far.send_all(check_passed(await _ident(quick_far)))
            late.append(await _ident(slow_far))  # and not answered in time:
            await trio.testing.wait_all_tasks_blocked()
            deadline.cancel()  # the wave's deadline comes

        nursery.start_soon(worker_ends)
        with deadline:
            await check_wave([("q", quick), ("s", slow)], 1, tmp_path, reports.append)
        assert deadline.cancelled_caught
        assert reports == [[("q", None)]]
        assert not slow._waiting  # forgotten
        await slow_far.send_all(check_passed(late[0]))
        await trio.testing.wait_all_tasks_blocked()
        assert reports == [[("q", None)]]  # its late answer is dropped
        assert not slow.ended  # and the connection lives on


async def test_a_connection_that_ends_in_a_wave_fails_its_check_as_a_death(
    tmp_path: Path, links: Callable[[int], Pairs]
) -> None:
    pairs = links(1)
    ((link, far),) = pairs
    reports: list[Results] = []
    async with read(pairs) as nursery:

        async def worker_dies() -> None:
            await _ident(far)
            await far.aclose()

        nursery.start_soon(worker_dies)
        await check_wave([("t#0", link)], 1, tmp_path, reports.append)
        ((tag, error),) = reports[0]
        assert tag == "t#0"
        assert isinstance(error, ReplicaError)
        assert error.error_type == "WorkerDied"
        # A check asked of it now is answered at once, in the same way.
        await check_wave([("t#0", link)], 1, tmp_path, reports.append)
        assert isinstance(reports[1][0][1], ReplicaError)


async def test_one_reader_reads_every_link_and_ends_each_alone(
    links: Callable[[int], Pairs],
) -> None:
    pairs = links(3)
    loads: list[tuple[str, int | None]] = []
    ended: list[str] = []
    reader = LinkReader()

    async def held(link: MonitorLink) -> None:
        await reader.read(link, lambda load, served, models: loads.append((link.tag, load)))
        ended.append(link.tag)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.serve)
            for link, _ in pairs:
                nursery.start_soon(held, link)
            (_, a), (broken, b), (_, c) = pairs
            # A load split over two writes is one line; two links' lines in one wake-up.
            await a.send_all(b'{"lo')
            await trio.testing.wait_all_tasks_blocked()
            await a.send_all(b'ad":3}\n')
            await c.send_all(b'{"load":null}\n')
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(loads, key=str) == sorted([("t#0", 3), ("t#2", None)], key=str)
            # One link breaks the protocol: it alone ends, and says why.
            await b.send_all(b"not json\n")
            await trio.testing.wait_all_tasks_blocked()
            assert ended == ["t#1"]
            assert "broke the protocol" in broken.why
            # Another's worker ends: it alone ends.
            await c.aclose()
            await trio.testing.wait_all_tasks_blocked()
            assert ended == ["t#1", "t#2"]
            await a.send_all(b'{"load":5}\n')
            await trio.testing.wait_all_tasks_blocked()
            assert loads[-1] == ("t#0", 5)
            nursery.cancel_scope.cancel()


async def test_a_wave_of_real_workers_in_one_call(harness: Harness, tmp_path: Path) -> None:
    steer = tmp_path / "steer"
    rt = harness.runtime
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(rt.serve, Deaths())
            for tag in ("a#1", "a#2", "a#3"):
                await rt.start_replica(spec(tag, checked(steer)))
            passed: Results = []
            await rt.check_health_replicas(["a#1", "a#2", "a#3"], passed.extend)
            assert sorted(passed, key=str) == [("a#1", None), ("a#2", None), ("a#3", None)]
            # One fails its check, one is killed; the third passes, in the same wave.
            pid = rt._workers["a#2"].pid
            await trio.Path(f"{steer}.{pid}").write_text("fail the disk is full")
            victim = rt._workers["a#3"].pid
            os.kill(victim, signal.SIGKILL)
            got: Results = []
            await rt.check_health_replicas(["a#1", "a#2", "a#3"], got.extend)
            outcome = dict(got)
            assert len(got) == 3
            assert outcome["a#1"] is None
            failed = outcome["a#2"]
            assert isinstance(failed, ReplicaError)
            assert failed.summary == "RuntimeError: the disk is full"
            dead = outcome["a#3"]
            assert isinstance(dead, ReplicaError)
            assert dead.error_type in ("WorkerDied", "ReplicaGone")
            for tag in ("a#1", "a#2", "a#3"):
                await rt.kill_replica(tag)
            nursery.cancel_scope.cancel()


# -- the controller's side ---------------------------------------------------------------------


class Batched:
    """A runtime's batch as a test steers it: reports what `bursts` say, one burst a call of
    ``go``, and then waits (or raises `fails`)."""

    def __init__(self, fails: Exception | None = None) -> None:
        self.asked: list[list[str]] = []
        self.fails = fails
        self.bursts: trio.MemorySendChannel[Results]
        self._bursts: trio.MemoryReceiveChannel[Results]
        self.bursts, self._bursts = trio.open_memory_channel(10)

    async def check_health_replicas(
        self, tags: Sequence[str], report: controller.CheckReport
    ) -> None:
        self.asked.append(list(tags))
        async for burst in self._bursts:
            if self.fails is not None:
                raise self.fails
            report(burst)

    async def check_health_replica(self, tag: str) -> None:
        raise AssertionError("a runtime with a batch is never asked one by one")

    def fence(self, epoch: int) -> None:
        pass


async def test_the_wave_task_sends_one_event_a_burst_and_the_rest_late_at_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runtime = Batched()
    sent: list[ev.Event] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(checks, runtime, ["a", "b", "c"], 5.0, sent.append)  # type: ignore[arg-type]
        await trio.testing.wait_all_tasks_blocked()
        assert runtime.asked == [["a", "b", "c"]]
        failed = ReplicaError("b", "E", "m")
        await runtime.bursts.send([("a", None), ("b", failed), ("a", None)])  # "a" once only
        await trio.testing.wait_all_tasks_blocked()
        assert sent == [ev.HealthChecked([("a", None), ("b", "E: m")])]
    # Its deadline: "c" never answered.
    assert trio.current_time() == pytest.approx(5.0)
    assert sent[1:] == [
        ev.HealthChecked([("c", "HealthCheckTimeout: no answer within health_check_timeout_s=5")])
    ]


async def test_a_batch_that_raises_fails_every_check_left_with_its_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runtime = Batched(fails=RuntimeError("the runtime's bug"))
    sent: list[ev.Event] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(checks, runtime, ["a", "b"], 5.0, sent.append)  # type: ignore[arg-type]
        await trio.testing.wait_all_tasks_blocked()
        await runtime.bursts.send([])
    assert sent == [
        ev.HealthChecked(
            [("a", "RuntimeError: the runtime's bug"), ("b", "RuntimeError: the runtime's bug")]
        )
    ]
    assert trio.current_time() == 0.0  # at once, not at the deadline


async def test_fake_runtime_checks_a_wave_as_it_checks_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    sent: list[ev.Event] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(rt.serve, lambda tag, reason: None)
        for tag in ("a#1", "a#2", "a#3"):
            await rt.start_replica(
                controller.ReplicaSpec(tag, "a", "v1", controller.ReplicaConfig("x:Y"), None, {})
            )
        rt.replicas["a#2"].health_error = ("RuntimeError", "sick")
        rt.replicas["a#3"].health_hangs = True
        await checks(rt, ["a#1", "a#2", "a#3", "gone#1"], 3.0, sent.append)
        nursery.cancel_scope.cancel()
    first, late = sent
    assert isinstance(first, ev.HealthChecked)
    assert dict(first.results) == {
        "gone#1": "ReplicaGone: the runtime has no such replica",
        "a#1": None,
        "a#2": "RuntimeError: sick",
    }
    assert late == ev.HealthChecked(
        [("a#3", "HealthCheckTimeout: no answer within health_check_timeout_s=3")]
    )
    assert trio.current_time() == pytest.approx(3.0)
    assert [len(rt.replicas[t].health_checks) for t in ("a#1", "a#2", "a#3")] == [1, 1, 1]


async def test_a_fenced_leader_steps_down_on_a_refused_check_in_a_wave() -> None:
    runtime = Batched()
    told: list[FencedError] = []
    fenced = FencedRuntime(runtime, 3, told.append)  # type: ignore[arg-type]
    reports: list[Results] = []
    refusal = FencedError("check of replica b", 3, 4)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fenced.check_health_replicas, ["a", "b"], reports.append)
            await trio.testing.wait_all_tasks_blocked()
            await runtime.bursts.send([("a", None), ("b", refusal)])
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert told == [refusal]
    assert reports == [[("a", None)]]  # the refusal is not a failed check


async def test_the_daemons_metrics_time_each_check_of_a_wave() -> None:
    runtime = Batched()
    metrics = Metrics()
    timed = metrics.wrap_runtime(runtime)  # type: ignore[arg-type]
    assert isinstance(timed, RuntimeWrapper)
    reports: list[Results] = []
    deadline = trio.CancelScope()

    async def wave() -> None:
        with deadline:
            await timed.check_health_replicas(["a", "b", "c"], reports.append)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wave)
            await trio.testing.wait_all_tasks_blocked()
            await runtime.bursts.send([("a", None), ("b", ReplicaError("b", "E", "m"))])
            await trio.testing.wait_all_tasks_blocked()
            deadline.cancel()  # "c" times out
    assert [[tag for tag, _ in burst] for burst in reports] == [["a", "b"]]
    counts = {
        sample.labels["outcome"]: sample.value
        for family in metrics.registry.collect()
        if family.name.endswith("health_check_seconds")
        for sample in family.samples
        if sample.name.endswith("_count")
    }
    assert counts == {"ok": 1, "failed": 1, "timed_out": 1}


async def test_a_worker_killed_while_its_child_holds_the_connection_is_seen_dead_at_once(
    harness: Harness,
) -> None:
    # Found by a trial: a replica that forked (multiprocessing, a fork in the user's code) left
    # a child holding the monitor connection open, so a kill -9 of the worker went unseen until
    # its checks were late, and it was then "drained" for its whole grace.
    rt = harness.runtime
    deaths = Deaths()
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(rt.serve, deaths)
            await rt.start_replica(spec("f#1", controller.ReplicaConfig("replicas:Forks")))
            pid = rt._workers["f#1"].pid
            try:
                os.kill(pid, signal.SIGKILL)  # the worker alone: its child lives on
                await deaths.wait(lambda: deaths.told)
                ((tag, how),) = deaths.told
                assert tag == "f#1"
                assert "SIGKILL" in how
                got: Results = []
                await rt.check_health_replicas(["f#1"], got.extend)
                assert isinstance(got[0][1], ReplicaError)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)  # the child, in the worker's group
            nursery.cancel_scope.cancel()
