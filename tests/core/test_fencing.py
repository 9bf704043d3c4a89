"""Two leaders at once, in one process under MockClock: a stale leader (one that slept through
its lease and does not know it yet) against the one that took over. Every command of the stale
one is counted with the fault injector, and none of them takes effect; then random histories
with leader changes interleaved keep every invariant of the plain histories."""

from __future__ import annotations

import os
from collections.abc import Callable

import attrs
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import controller
from controller._leadership.fencing import FencedRuntime, FencedStore
from controller._model.decisions.lease import Lease
from controller._model.values.errors import FencedError
from controller.testing import FakeRuntime, FakeState, FaultInjector

from ..conftest import DEADLOCK_LIMIT_S, EXACT, RC
from ..histories import check_agreement, quiet, step

#: Reads change nothing: whoever makes them.
READS = ("store.read_all", "runtime.list_replicas")


async def claim(store: controller.MemoryStore, holder: str) -> int:
    """`holder` takes the lease over whatever is there (its claim rules are tested apart)."""
    seen = await store.read_lease()
    epoch = (seen.epoch if seen is not None else 0) + 1
    assert await store.claim_lease(seen, Lease(epoch=epoch, holder=holder, duration_s=2.0))
    return epoch


def leader(
    store: controller.MemoryStore,
    runtime: FakeRuntime,
    epoch: int,
    faults: FaultInjector,
    on_fenced: Callable[[FencedError], None],
) -> tuple[controller.Runtime, controller.Store]:
    """What a daemon leading at `epoch` opens its controller over (counted by `faults`)."""
    return (
        faults.runtime(FencedRuntime(runtime.view(), epoch, on_fenced)),
        faults.store(FencedStore(store, epoch, on_fenced)),
    )


def took_effect(faults: FaultInjector, since: int) -> list[str]:
    """Steps begun after step `since` that changed something (reads change nothing). One begun
    before (a start in flight when another took over) was the leader's to make."""
    return [
        what
        for number, what, error in faults.outcomes
        if number > since and error is None and not what.startswith(READS)
    ]


async def test_a_stale_leader_s_writes_and_commands_take_no_effect(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = controller.MemoryStore()
    rt = FakeRuntime(auto_ready=True)
    cfg = controller.BackendConfig(num_replicas=3, version="v1", health_check_period_s=10)
    old_faults, new_faults = FaultInjector(), FaultInjector()
    refused: list[FencedError] = []
    async with trio.open_nursery() as nursery:
        old_epoch = await claim(store, "old")
        old_scope = trio.CancelScope()
        old_open = trio.Event()
        old_ctl: list[controller.Controller] = []

        def old_fenced(exc: FencedError) -> None:
            refused.append(exc)
            old_scope.cancel()

        async def old_leader() -> None:
            runtime, fenced_store = leader(store, rt, old_epoch, old_faults, old_fenced)
            with old_scope:
                async with controller.open_controller(
                    runtime=runtime, store=fenced_store, restart_policy=EXACT
                ) as ctl:
                    old_ctl.append(ctl)
                    goal = await ctl.deploy("a", cfg, RC)
                    await goal.wait()
                    old_open.set()
                    await trio.sleep_forever()

        nursery.start_soon(old_leader)
        await old_open.wait()
        before = {t: r.spec.version for t, r in rt.replicas.items()}
        # The old leader sleeps through its lease (it acts on nothing meanwhile, and does not
        # know): another claims, recovers and changes the backend.
        new_epoch = await claim(store, "new")
        since = old_faults.steps
        writes_before = store.writes
        runtime, fenced_store = leader(store, rt, new_epoch, new_faults, lambda exc: None)
        async with controller.open_controller(
            runtime=runtime, store=fenced_store, restart_policy=EXACT
        ) as new:
            assert {r.tag for r in new.status("a").replicas} == set(before)  # adopted
            goal = await new.deploy("a", attrs.evolve(cfg, num_replicas=4, user_config=2), RC)
            assert await goal.wait() is controller.GoalOutcome.COMPLETED
            wrote = store.writes - writes_before
            # The old one wakes: a replica dies (both hear it), its health checks come due,
            # and someone asks it for a change.
            victim = sorted(before)[0]
            rt.crash(victim)
            await trio.sleep(30)
            assert refused, "the old leader was never refused"
            assert old_scope.cancelled_caught or old_scope.cancel_called
            # Nothing of the old epoch took effect, counted step by step.
            assert took_effect(old_faults, since) == []
            tried = [(what, error) for n, what, error in old_faults.outcomes if n > since]
            assert tried, "the old leader tried nothing: the test proves nothing"
            assert {error for _, error in tried} <= {"FencedError", None}, tried
            assert store.fenced >= 1  # its intent writes reached the store, and were refused
            # The new one made its change and replaced the dead replica; the store is its.
            await trio.testing.wait_all_tasks_blocked()
            status = new.status("a")
            assert len(status.replicas) == 4
            assert victim not in {r.tag for r in status.replicas}
            live = [r for r in rt.replicas.values() if r.state is FakeState.READY]
            assert [r.user_config for r in live] == [2] * 4
            assert all(r.epoch == new_epoch for r in live)
            for op, tag, epoch in rt.fenced:
                assert epoch == old_epoch, (op, tag)
            assert wrote >= 1
        nursery.cancel_scope.cancel()


OPS_WITH_LEADERS = st.sampled_from(
    ["deploy", "deploy", "delete", "finish_starts", "finish_drains", "crash", "unhealthy", "sleep"]
)

EXAMPLES = 60 * int(os.environ.get("RELIABILITY_SCALE", "1"))


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_random_histories_with_leader_changes(data: st.DataObject) -> None:
    """The plain histories' steps, with leader changes between them: the old leader stays
    running (stale, as after a pause) until the store or a replica refuses it. After every step
    the newest leader and the runtime agree; once quiet, everything converges; no step of a
    stale leader ever takes effect."""

    async def main() -> None:
        rt = FakeRuntime(auto_ready=False, auto_drain=False)
        store = controller.MemoryStore()
        latest: dict[str, object] = {}
        leaders = data.draw(st.integers(1, 4), label="leaders")
        steps = data.draw(st.integers(1, 24), label="steps")
        stale: list[tuple[FaultInjector, int]] = []  # each old leader, stale from its step
        previous: FaultInjector | None = None
        with trio.fail_after(DEADLOCK_LIMIT_S):
            async with trio.open_nursery() as nursery:
                for life in range(leaders):
                    epoch = await claim(store, f"d{life}")
                    if previous is not None:
                        # The leader before is stale from here on (it still runs).
                        stale.append((previous, previous.steps))
                    faults = previous = FaultInjector()
                    scope = trio.CancelScope()
                    opened: trio.Event = trio.Event()
                    holder: list[controller.Controller] = []

                    async def run(
                        faults: FaultInjector = faults,
                        scope: trio.CancelScope = scope,
                        opened: trio.Event = opened,
                        holder: list[controller.Controller] = holder,
                        epoch: int = epoch,
                    ) -> None:
                        runtime, fenced_store = leader(
                            store, rt, epoch, faults, lambda exc: scope.cancel()
                        )
                        with scope:
                            async with controller.open_controller(
                                runtime=runtime, store=fenced_store, restart_policy=EXACT, seed=0
                            ) as ctl:
                                holder.append(ctl)
                                opened.set()
                                await trio.sleep_forever()
                        opened.set()

                    nursery.start_soon(run)
                    await opened.wait()
                    assert holder, "a new leader failed to open"
                    ctl = holder[0]
                    for _ in range(steps // leaders):
                        await step(data, ctl, rt, latest)
                        await trio.testing.wait_all_tasks_blocked()
                        check_agreement(ctl, rt)
                        for old, since in stale:
                            assert took_effect(old, since) == []
                    if life == leaders - 1:
                        await quiet(ctl, rt, latest)
                        for old, since in stale:
                            assert took_effect(old, since) == []
                nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
