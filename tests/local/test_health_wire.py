"""Health checks over a worker's monitor connection (issue 31): on real worker processes, what
the checks must keep (fencing, a hung check failing alone, the user's error text, a death seen
at once, workers started by an older version), and the wire's two ends in-process."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
import trio.testing

import controller
from controller import FencedError, ReplicaError
from controller._local.layout import socket_path
from controller._local.link import ENDED, MonitorLink
from controller._local.wire import (
    MONITOR_CHECKS,
    LineStream,
    WireError,
    check_passed,
    check_request,
    decode,
    parse_check_passed,
    parse_check_request,
)
from controller._local.worker import Worker

from ..workers import LIMIT_S, Deaths, Harness, checked, spec, worker_pids

CHECKED = controller.ReplicaConfig("replicas:CheckedByFile", init_kwargs={"path": ""})


def write(path: str, text: str) -> None:
    Path(path).write_text(text)


async def test_a_check_goes_over_the_monitor_connection_and_carries_the_users_error(
    harness: Harness, tmp_path: Path
) -> None:
    steer = tmp_path / "steer"
    rt = harness.runtime
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(rt.serve, Deaths())
            await rt.start_replica(spec("a#1", checked(steer)))
            # No new connection can reach the worker now: its checks still pass, over the
            # connection the runtime holds.
            os.unlink(socket_path(rt.runtime_dir, "a#1"))
            for _ in range(3):
                await rt.check_health_replica("a#1")
            steer.write_text("fail the disk is full")
            with pytest.raises(ReplicaError) as failed:
                await rt.check_health_replica("a#1")
            assert failed.value.error_type == "RuntimeError"
            assert failed.value.message == "the disk is full"
            assert "check_health" in (failed.value.traceback or "")
            steer.unlink()
            await rt.check_health_replica("a#1")  # and it passes again
            await rt.kill_replica("a#1")  # its socket gone, it is signalled
            assert worker_pids(harness.runtime_dir) == {}
            nursery.cancel_scope.cancel()


async def test_a_check_from_a_stale_epoch_is_refused_over_the_monitor(harness: Harness) -> None:
    stale, leader = harness.local(), harness.local()
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            stale.fence(1)
            await nursery.start(stale.serve, Deaths())
            await stale.start_replica(spec("a#1", CHECKED))
            await stale.check_health_replica("a#1")
            leader.fence(2)
            await nursery.start(leader.serve, Deaths())
            await leader.adopt_replica("a#1")  # raises the worker's epoch to 2
            with pytest.raises(FencedError) as refused:
                await stale.check_health_replica("a#1")
            assert refused.value.newer == 2
            await leader.check_health_replica("a#1")  # the leader's pass, on its own link
            link = leader._workers["a#1"].link
            assert link is not None
            assert link.checks
            await leader.kill_replica("a#1")
            nursery.cancel_scope.cancel()


async def test_a_hung_check_fails_alone_and_holds_up_nothing(
    harness: Harness, tmp_path: Path
) -> None:
    slow, other = tmp_path / "slow", tmp_path / "other"
    rt = harness.runtime
    deaths = Deaths()
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(rt.serve, deaths)
            await rt.start_replica(spec("a#1", checked(slow)))
            await rt.start_replica(spec("b#1", checked(other)))
            slow.write_text("slow 3")  # sync user code, in the worker's thread
            os.mkfifo(f"{slow}.entered")
            hung = trio.Event()

            async def hangs() -> None:
                with trio.move_on_after(1.0) as scope:
                    await rt.check_health_replica("a#1")
                assert scope.cancelled_caught  # the check's own timeout, as the wave's
                hung.set()

            nursery.start_soon(hangs)
            entered = Path(f"{slow}.entered")
            assert await trio.to_thread.run_sync(entered.read_text) == "in"
            slow.unlink()
            # The next check of the same replica waits for the one running (a hung check holds
            # one thread, not one a period), and fails at its own timeout too...
            with trio.move_on_after(0.3) as joined:
                await rt.check_health_replica("a#1")
            assert joined.cancelled_caught
            # ... while the other replica's checks pass, and the worker answers a connection of
            # its own and goes on pushing its load.
            for _ in range(3):
                await rt.check_health_replica("b#1")
            hello = LineStream(await trio.open_unix_socket(socket_path(rt.runtime_dir, "a#1")))
            await hello.send({"op": "hello"})
            assert (await hello.receive())["state"] == "ready"
            await hello.aclose()
            seen = len(deaths.loads)
            await deaths.wait(lambda: len([t for t, _ in deaths.loads[seen:] if t == "a#1"]) > 1)
            await hung.wait()
            link = rt._workers["a#1"].link
            assert link is not None
            assert not link._waiting  # both forgotten at their timeouts
            await rt.check_health_replica("a#1")  # the slow one's answer, or a new one: passed
            assert deaths.told == []
            await rt.kill_replica("a#1")
            await rt.kill_replica("b#1")
            nursery.cancel_scope.cancel()


async def test_a_death_is_seen_at_once_and_fails_the_check_waiting(
    harness: Harness, tmp_path: Path
) -> None:
    steer = tmp_path / "steer"
    rt = harness.runtime
    deaths = Deaths()
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(rt.serve, deaths)
            await rt.start_replica(spec("a#1", checked(steer)))
            (pid,) = worker_pids(harness.runtime_dir)
            steer.write_text("slow 600")
            os.mkfifo(f"{steer}.entered")
            outcome: list[BaseException] = []

            async def waits() -> None:
                try:
                    await rt.check_health_replica("a#1")
                except ReplicaError as exc:
                    outcome.append(exc)

            async with trio.open_nursery() as checks:
                checks.start_soon(waits)
                entered = Path(f"{steer}.entered")
                assert await trio.to_thread.run_sync(entered.read_text) == "in"
                os.killpg(pid, signal.SIGKILL)
            await deaths.wait(lambda: deaths.told)
            assert deaths.told[0][0] == "a#1"
            (error,) = outcome
            assert isinstance(error, ReplicaError)
            assert error.error_type == "WorkerDied"
            # A later check is told it is gone, not left waiting.
            with pytest.raises(ReplicaError):
                await rt.check_health_replica("a#1")
            nursery.cancel_scope.cancel()


async def test_a_worker_of_an_older_version_is_adopted_and_checked_as_before(
    harness: Harness,
) -> None:
    old = controller.ReplicaConfig("old_wire_replica:OldWorker")
    first, second = harness.local(), harness.local()
    deaths = Deaths()
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            async with trio.open_nursery() as before:
                await before.start(first.serve, Deaths())
                await first.start_replica(spec("a#1", old))
                before.cancel_scope.cancel()  # a restart: the worker lives on
            # Its import made it speak the old wire: its hello says nothing of checks.
            lines = LineStream(await trio.open_unix_socket(socket_path(first.runtime_dir, "a#1")))
            await lines.send({"op": "hello"})
            assert MONITOR_CHECKS not in await lines.receive()
            await lines.aclose()
            await nursery.start(second.serve, deaths)
            await second.adopt_replica("a#1")
            link = second._workers["a#1"].link
            assert link is not None
            assert not link.checks
            for _ in range(3):
                await second.check_health_replica("a#1")
            # Had a check gone over its monitor connection, that connection would have ended,
            # and the runtime would have taken the worker for dead.
            await trio.testing.wait_all_tasks_blocked(0.2)
            assert deaths.told == []
            assert not link.ended
            await second.kill_replica("a#1")
            nursery.cancel_scope.cancel()


async def test_through_the_controller_a_hung_check_times_out_alone_and_errors_keep_their_text(
    harness: Harness, tmp_path: Path
) -> None:
    steer = tmp_path / "steer"
    config = controller.BackendConfig(
        num_replicas=2,
        version="v1",
        health_check_period_s=0.5,
        health_check_timeout_s=0.5,
        health_check_failure_threshold=1000,  # kept, so that its checks go on failing
    )

    def failures(tag: str, text: str) -> int:
        return sum(
            1
            for e in ctl.status("a").events
            if e.kind == "Unhealthy" and f"replica {tag}:" in e.message and text in e.message
        )

    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            await (await ctl.deploy("a", config, checked(steer))).wait()
            hung, other = ctl.status("a").replicas
            assert hung.pid is not None
            assert other.pid is not None
            write(f"{steer}.{hung.pid}", "slow 600")
            await ctl.wait_until(lambda c: failures(hung.tag, "HealthCheckTimeout") >= 3)
            # Its checks time out one by one; the other replica's, due with them, pass.
            healthy = {r.tag: r.healthy for r in ctl.status("a").replicas}
            assert healthy == {hung.tag: False, other.tag: True}
            assert failures(other.tag, "") == 0
            write(f"{steer}.{other.pid}", "fail the disk is full")
            error = "RuntimeError: the disk is full"  # the user's text, through the controller
            await ctl.wait_until(lambda c: failures(other.tag, error) > 0)
            await (await ctl.delete("a", force=True)).wait()


# -- the wire, in-process ------------------------------------------------------------------------


def test_check_lines_read_back() -> None:
    assert parse_check_request(check_request(7, 3)[:-1]) == (7, 3)
    assert parse_check_passed(check_passed(12)[:-1]) == 12
    for line in (b"", b"?", b"?1", b"?a 1", b"?1 -1", b"+", b"+x", b"{}"):
        assert parse_check_request(line) is None
    assert parse_check_passed(b"?1 2") is None


async def _pair() -> tuple[MonitorLink, trio.SocketStream]:
    ours, theirs = trio.socket.socketpair()
    return MonitorLink("t#1", LineStream(trio.SocketStream(ours)), checks=True), trio.SocketStream(
        theirs
    )


async def _asked(far: trio.SocketStream, buffer: bytearray) -> tuple[int, int]:
    while b"\n" not in buffer:
        buffer += await far.receive_some(4096)
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    asked = parse_check_request(line)
    assert asked is not None
    return asked


async def test_a_link_wakes_each_check_with_its_own_answer_and_forgets_one_cut() -> None:
    link, far = await _pair()
    loads: list[int | None] = []
    answers: dict[str, object] = {}
    buffer = bytearray()

    async def ask(name: str) -> None:
        answers[name] = await link.check(5)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(link.read, lambda load, served, models: loads.append(load))
            nursery.start_soon(ask, "first")
            first = await _asked(far, buffer)
            assert first[1] == 5
            with trio.move_on_after(0.05):  # cut: its answer, when it comes, is dropped
                await link.check(5)
            cut = await _asked(far, buffer)
            nursery.start_soon(ask, "third")
            third = await _asked(far, buffer)
            # Answered out of order, a load between them: each wakes its own check.
            await far.send_all(
                b'{"check":%d,"ok":false,"error_type":"E","message":"m"}\n' % third[0]
                + b'{"load":4}\n'
                + check_passed(cut[0])
                + check_passed(first[0])
            )
            await trio.testing.wait_all_tasks_blocked()
            assert answers["first"] is None
            third_answer = answers["third"]
            assert isinstance(third_answer, dict)
            assert third_answer["message"] == "m"
            assert loads == [4]
            assert not link._waiting
            # The worker's end wakes a check waiting, and answers later ones at once.
            nursery.start_soon(ask, "last")
            await _asked(far, buffer)
            await far.aclose()
            await trio.testing.wait_all_tasks_blocked()
            assert answers["last"] is ENDED
            assert await link.check(5) is ENDED
            nursery.cancel_scope.cancel()


async def test_a_link_keeps_what_a_full_socket_did_not_take_and_sends_it_in_order() -> None:
    link, far = await _pair()
    ours = link.lines.stream
    assert isinstance(ours, trio.SocketStream)
    ours.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    answered: list[int] = []
    count = 3000  # more than the socket's buffers hold unread

    async def ask(n: int) -> None:
        assert await link.check(n) is None
        answered.append(n)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(link.read, lambda load, served, models: None)
            for n in range(count):
                nursery.start_soon(ask, n)
            await trio.testing.wait_all_tasks_blocked()
            assert link._unsent  # the socket was full: the rest waits, in order
            buffer = bytearray()
            idents = []
            for _ in range(count):
                ident, _epoch = await _asked(far, buffer)
                idents.append(ident)
                await far.send_all(check_passed(ident))
            assert idents == list(range(count))  # whole lines, in the order asked
            while len(answered) < count:
                await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        await far.aclose()
    assert sorted(answered) == list(range(count))
    assert not link._unsent


@contextlib.asynccontextmanager
async def _monitored(instance: object) -> AsyncIterator[tuple[Worker, LineStream]]:
    """A ready worker of epoch 3 hosting `instance`, serving a monitor connection; yields it
    and the runtime's end of that connection (within 5 s)."""
    worker = Worker({"tag": "t#1", "epoch": 3})
    worker.instance = instance
    worker.ready.set()
    ours, theirs = trio.socket.socketpair()
    with trio.fail_after(5):
        async with (
            trio.SocketStream(ours) as near,
            trio.SocketStream(theirs) as far,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(worker.monitor, LineStream(near))
            yield worker, LineStream(far)
            nursery.cancel_scope.cancel()


async def test_a_worker_answers_on_its_monitor_and_refuses_a_stale_epoch() -> None:
    async with _monitored(object()) as (worker, lines):  # no check_health: answered without a task
        await lines.send_line(check_request(1, 3) + b"junk\n" + check_request(2, 2))
        assert await lines.receive_line() == check_passed(1)[:-1]
        refusal = decode(await lines.receive_line())
        assert refusal["check"] == 2
        assert refusal["fenced"] is True
        assert refusal["epoch"] == 3
        await lines.send_line(check_request(3, 4))  # a newer leader's check raises it
        assert await lines.receive_line() == check_passed(3)[:-1]
        assert worker.epoch == 4
        assert worker.hello()[MONITOR_CHECKS] is True


def test_numbers_too_long_for_the_wire_are_no_protocol_line() -> None:
    # int() refuses strings of more than 4,300 digits: such a line must be no line, not a crash.
    digits = b"9" * 5000
    assert parse_check_passed(b"+" + digits) is None
    assert parse_check_request(b"?" + digits + b" 1") is None
    assert parse_check_request(b"?1 " + digits) is None
    assert parse_check_request(b"?1 " + b"9" * 20) is None  # past any epoch
    assert parse_check_request(b"?1 " + b"9" * 19) == (1, 10**19 - 1)
    for line in (b'{"load": ' + digits + b"}", b"[" * 100_000):
        with pytest.raises(WireError):
            decode(line)


@pytest.mark.parametrize(
    "line", [b"+" + b"9" * 5000, b"[" * 100_000, b'{"check": 1, "ok": ' + b"1" * 5000 + b"}"]
)
async def test_a_worker_that_breaks_the_monitor_protocol_fails_its_checks_and_says_why(
    line: bytes,
) -> None:
    link, far = await _pair()
    buffer = bytearray()
    answers: list[object] = []

    async def ask() -> None:
        answers.append(await link.check(1))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(link.read, lambda load, served, models: None)
            nursery.start_soon(ask)
            await _asked(far, buffer)
            await far.send_all(line + b"\n")
            await trio.testing.wait_all_tasks_blocked()
            # The reader ended, not the runtime: the waiting check is told, with the reason.
            assert answers == [ENDED]
            assert link.ended
            assert "broke the protocol" in link.why
        await far.aclose()


async def test_a_worker_ignores_check_lines_with_numbers_too_long() -> None:
    async with _monitored(object()) as (worker, lines):
        await lines.send_line(b"?" + b"9" * 5000 + b" 3\n?1 " + b"9" * 5000 + b"\n")
        await lines.send_line(check_request(2, 3))
        assert await lines.receive_line() == check_passed(2)[:-1]
        assert worker.epoch == 3


class _RaisingProperty:
    @property
    def check_health(self) -> None:
        raise RuntimeError("looked up, and failed")

    @property
    def load(self) -> None:
        raise RuntimeError("no load here")


async def test_a_check_health_property_that_raises_is_the_users_failed_check() -> None:
    async with _monitored(_RaisingProperty()) as (worker, lines):
        await worker.push_load()  # returns: no load, and the worker lives on
        await lines.send_line(check_request(1, 3))
        answer = decode(await lines.receive_line())
        assert answer["check"] == 1
        assert answer["error_type"] == "RuntimeError"
        assert answer["message"] == "looked up, and failed"


class _Exits:
    """A replica whose checks raise what would end a process, each in turn."""

    def __init__(self) -> None:
        self.raised = iter([SystemExit(5), KeyboardInterrupt(), GeneratorExit("gone")])

    def check_health(self) -> None:
        raise next(self.raised)


async def test_a_check_that_raises_system_exit_fails_and_the_worker_lives_on() -> None:
    # Found by a trial: sys.exit, KeyboardInterrupt or GeneratorExit from check_health ended the
    # worker, and the error never showed (the death said only "exited with code 1").
    async with _monitored(_Exits()) as (_, lines):
        for ident, (kind, message) in enumerate(
            [("SystemExit", "5"), ("KeyboardInterrupt", ""), ("GeneratorExit", "gone")]
        ):
            await lines.send_line(check_request(ident, 3))
            answer = decode(await lines.receive_line())
            assert answer["check"] == ident
            assert answer["error_type"] == kind
            assert answer["message"] == message


async def test_a_check_cut_short_by_one_connection_is_run_again_for_another() -> None:
    worker = Worker({"tag": "t#1", "epoch": 3})
    release = trio.Event()
    runs: list[int] = []

    class Slow:
        async def check_health(self) -> None:
            runs.append(len(runs))
            await release.wait()

    worker.instance = Slow()
    worker.ready.set()
    pairs = [trio.socket.socketpair() for _ in range(2)]
    fars = [LineStream(trio.SocketStream(b)) for _, b in pairs]

    async def serve(near: trio.SocketStream) -> None:
        async with near:
            with contextlib.suppress(WireError):  # how a monitor ends when its runtime hangs up
                await worker.monitor(LineStream(near))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            for near, _ in pairs:
                nursery.start_soon(serve, trio.SocketStream(near))
            await fars[0].send_line(check_request(1, 3))
            await trio.testing.wait_all_tasks_blocked()
            await fars[1].send_line(check_request(1, 3))  # waits on the first one's check
            await trio.testing.wait_all_tasks_blocked()
            assert runs == [0]
            await fars[0].aclose()  # the first asker hangs up: its check is cut short
            await trio.testing.wait_all_tasks_blocked()
            assert runs == [0, 1]  # the second runs its own, not "cut short"
            release.set()
            assert await fars[1].receive_line() == check_passed(1)[:-1]
            await fars[1].aclose()


def test_an_exception_class_name_of_megabytes_is_cut() -> None:
    from controller._ports.hosting import MAX_TYPE_NAME, describe_error

    error = type("E" * 300_000, (Exception,), {})("m")
    described = describe_error(error, "")
    assert len(described["error_type"]) == MAX_TYPE_NAME + 3
    assert described["message"] == "m"
