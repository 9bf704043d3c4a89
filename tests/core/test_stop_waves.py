"""Stops made durable together run as one wave (one drain scope, one scope for the kills): each
replica of a wave is still drained, killed and reported on its own time."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from controller._backend.tasks import KILL_TIMEOUT_S
from controller.testing import FakeRuntime, FakeState

from ..conftest import RC, config, opened, settle


async def test_each_replica_of_a_wave_is_killed_as_its_own_drain_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True, auto_drain=False)
    async with opened(rt) as ctl:
        await (
            await ctl.deploy("a", config(num_replicas=3, graceful_shutdown_timeout_s=100), RC)
        ).wait()
        goal = await ctl.deploy("a", config(num_replicas=0, graceful_shutdown_timeout_s=100), RC)
        await rt.wait_until(lambda r: len(r.tags(FakeState.DRAINING)) == 3)
        began = trio.current_time()
        first, second, slow = sorted(rt.tags(FakeState.DRAINING))
        await trio.sleep(5)
        rt.finish_drain(first)
        await settle()
        # Killed and gone at once, not when the wave's last drain ends.
        assert rt.replicas[first].killed_at == began + 5
        assert {r.tag for r in ctl.status("a").replicas} == {second, slow}
        await trio.sleep(5)
        rt.finish_drain(second)
        await settle()
        assert rt.replicas[second].killed_at == began + 10
        assert rt.replicas[slow].state is FakeState.DRAINING
        await goal.wait()  # the last one at the drain's deadline
        assert rt.replicas[slow].killed_at == began + 100
        assert ctl.status("a").replicas == ()


class StuckKill:
    """A runtime (a FakeRuntime's, duck-typed) whose kill of one replica never returns."""

    def __init__(self, inner: FakeRuntime):
        self.inner = inner
        self.stuck = ""

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def kill_replica(self, tag: str) -> None:
        if tag == self.stuck:
            await trio.sleep_forever()
        await self.inner.kill_replica(tag)


async def test_a_kill_that_never_returns_is_given_up_on_and_holds_back_no_other(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    stuck = StuckKill(FakeRuntime(auto_ready=True))
    rt = stuck.inner
    async with opened(stuck) as ctl:  # type: ignore[arg-type]  # duck-typed runtime
        await (
            await ctl.deploy("a", config(num_replicas=2, graceful_shutdown_timeout_s=0), RC)
        ).wait()
        stuck.stuck, other = sorted(rt.tags(FakeState.READY))
        began = trio.current_time()
        goal = await ctl.deploy("a", config(num_replicas=0, graceful_shutdown_timeout_s=0), RC)
        await rt.wait_until(lambda r: r.replicas[other].state is FakeState.DEAD)
        await settle()
        assert rt.replicas[other].killed_at == began
        assert [r.tag for r in ctl.status("a").replicas] == [stuck.stuck]
        await goal.wait()
        # Given up on, and reported stopped, KILL_TIMEOUT_S after its kill began.
        assert trio.current_time() == began + KILL_TIMEOUT_S
        assert ctl.status("a").replicas == ()
        assert rt.replicas[stuck.stuck].state is FakeState.READY
    assert f"replica {stuck.stuck}: kill did not finish within 30s" in caplog.text


async def test_a_close_kills_no_replica_of_a_wave_still_draining_and_finishes_a_kill_begun(
    autojump_clock: trio.testing.MockClock,
) -> None:
    stuck = StuckKill(FakeRuntime(auto_ready=True, auto_drain=False))
    rt = stuck.inner
    async with opened(stuck) as ctl:  # type: ignore[arg-type]  # duck-typed runtime
        await (
            await ctl.deploy("a", config(num_replicas=2, graceful_shutdown_timeout_s=100), RC)
        ).wait()
        await ctl.deploy("a", config(num_replicas=0, graceful_shutdown_timeout_s=100), RC)
        await rt.wait_until(lambda r: len(r.tags(FakeState.DRAINING)) == 2)
        killing, draining = sorted(rt.tags(FakeState.DRAINING))
        stuck.stuck = killing
        rt.finish_drain(killing)
        await settle()  # its kill has begun, and hangs
        closed_at = trio.current_time()
    # The close waited for the kill begun (up to its bound), and left the drain as it was, for
    # the next controller to finish.
    assert trio.current_time() == closed_at + KILL_TIMEOUT_S
    assert rt.replicas[draining].state is FakeState.DRAINING
    assert rt.replicas[draining].killed_at is None


async def test_a_forced_delete_during_a_graceful_scale_down_kills_every_replica_at_once(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # A forced delete during a graceful scale-down: the drains under way are cut, their kills
    # follow at once, and what it stops itself drains not at all.
    caplog.set_level(logging.INFO, logger="controller")
    rt = FakeRuntime(auto_ready=True, auto_drain=False)
    async with opened(rt) as ctl:
        await (
            await ctl.deploy("a", config(num_replicas=3, graceful_shutdown_timeout_s=100), RC)
        ).wait()
        await ctl.deploy("a", config(num_replicas=1, graceful_shutdown_timeout_s=100), RC)
        await rt.wait_until(lambda r: len(r.tags(FakeState.DRAINING)) == 2)
        t0 = trio.current_time()
        await (await ctl.delete("a", force=True)).wait()
        assert trio.current_time() == t0
        assert all(r.killed_at == t0 for r in rt.replicas.values())
        assert not rt.tags(FakeState.READY)
    assert "drain not done" not in caplog.text  # cut, not timed out
