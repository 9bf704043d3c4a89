"""``Controller.apply`` and what a deploy promises around it: all or nothing, one store batch,
no two deploys taking the same last room, and specs stored that can never run. Also what status
tells a person: tracebacks, versions in log lines, messages, events kept across a restart.
FakeRuntime and MemoryStore under MockClock."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest
import trio
import trio.testing

import controller
from controller._api.views import status_json
from controller._cli.output import ready_column
from controller.testing import FakeRuntime, FakeState

from ..conftest import RC, HeldSpecWrites, config, opened, settle


class Batches:
    """A MemoryStore that remembers each write's keys, and can hold writes until released."""

    def __init__(self) -> None:
        self.inner = controller.MemoryStore()
        self.batches: list[set[str]] = []
        self.gate: trio.Event | None = None

    async def read_all(self) -> dict[str, str]:
        return await self.inner.read_all()

    async def write(self, changes: Mapping[str, str | None]) -> None:
        if self.gate is not None:
            await self.gate.wait()
        self.batches.append(set(changes))
        await self.inner.write(changes)


def pair(n: int, version: str = "v1") -> tuple[controller.BackendConfig, controller.ReplicaConfig]:
    return config(num_replicas=n, version=version), RC


async def test_apply_writes_every_spec_in_one_batch_and_prunes_in_it_too() -> None:
    store = Batches()
    async with opened(FakeRuntime(auto_ready=True), store) as ctl:
        applied = await ctl.apply({"a": pair(1), "b": pair(2)})
        # Each spec with the revision it makes, in the same batch.
        assert {"spec/a", "spec/b", "revisions/a", "revisions/b"} in store.batches
        assert applied.changed == {"a", "b"}
        assert [await goal.wait() for goal in applied.goals.values()] == [
            controller.GoalOutcome.COMPLETED
        ] * 2
        store.batches.clear()
        again = await ctl.apply({"a": pair(1), "c": pair(1)}, prune=True)
        assert again.changed == {"c"}  # a is unchanged: the same goal, no write of its spec
        assert again.goals["a"] is applied.goals["a"]
        assert set(again.deleted) == {"b"}
        assert {"spec/c", "revisions/c", "spec/b"} in store.batches
        assert not any("spec/a" in batch for batch in store.batches)
        await again.deleted["b"].wait()
        assert [b.name for b in ctl.status().backends] == ["a", "c"]


async def test_a_prune_deletes_a_backend_whose_deploy_was_under_way() -> None:
    # Found by an audit: what POST /shutdown does (apply nothing, prune) chose what to delete
    # from the backends it saw, so a new backend whose spec was being written lived on.
    rt = FakeRuntime(auto_ready=True)
    store = HeldSpecWrites(controller.MemoryStore())
    async with opened(rt, store) as ctl:
        await (await ctl.deploy("a", config(num_replicas=1), RC)).wait()
        release = store.hold = trio.Event()
        pruned: list[controller.Applied] = []

        async def prune() -> None:
            pruned.append(await ctl.apply({}, prune=True))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ctl.deploy, "b", config(num_replicas=1), RC)
            await store.holding.wait()  # b's spec is being written
            nursery.start_soon(prune)
            try:
                await settle()
                waited = not pruned  # for b's deploy to land
            finally:
                release.set()  # (the write is shielded: held, it would outlast any deadline)
        assert waited
        assert sorted(pruned[0].deleted) == ["a", "b"]
        await settle()
        assert all(b.deleting or b.name not in ("a", "b") for b in ctl.status().backends)


async def test_a_controller_closed_while_a_new_backend_is_written_says_so() -> None:
    # Found by the apply benchmark: a leader that lost its lease while a new backend's spec was
    # being written answered 500 ("Nursery is closed to new arrivals"), not "closed" (503).
    memory = controller.MemoryStore()
    store = HeldSpecWrites(memory)
    errors: list[BaseException] = []
    async with trio.open_nursery() as nursery:
        async with opened(FakeRuntime(auto_ready=True), store) as ctl:
            release = store.hold = trio.Event()

            async def deploy() -> None:
                try:
                    await ctl.deploy("a", config(num_replicas=1), RC)
                except controller.ControllerError as exc:
                    errors.append(exc)

            nursery.start_soon(deploy)
            await store.holding.wait()
        release.set()  # the write lands after the controller closed
    assert [type(e) for e in errors] == [controller.ControllerClosedError]
    assert "is stored" in str(errors[0])
    assert "spec/a" in memory.data  # stored: the next controller carries it out


async def test_apply_is_all_or_nothing() -> None:
    rt = FakeRuntime(auto_ready=True, max_replicas=3)
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        with pytest.raises(controller.InfeasibleError) as caught:
            await ctl.apply({"a": pair(2), "b": pair(2)})  # each fits alone, not together
        assert "backend 'b'" in str(caught.value)
        assert "'replica_slots': 3.0" in str(caught.value)
        assert store.data == {}
        assert ctl.status().backends == ()
        assert rt.replicas == {}


async def test_two_deploys_cannot_both_take_the_last_room() -> None:
    store = Batches()
    async with opened(FakeRuntime(auto_ready=True, max_replicas=3), store) as ctl:
        await (await ctl.deploy("a", *pair(2))).wait()
        store.gate = trio.Event()  # both writes in flight at once
        outcomes: dict[str, str] = {}

        async def deploy(name: str) -> None:
            try:
                await ctl.deploy(name, *pair(1))
                outcomes[name] = "deployed"
            except controller.InfeasibleError:
                outcomes[name] = "refused"

        async with trio.open_nursery() as nursery:
            nursery.start_soon(deploy, "b")
            nursery.start_soon(deploy, "c")
            await settle()
            store.gate.set()
        assert sorted(outcomes.values()) == ["deployed", "refused"]


async def test_a_stored_spec_that_cannot_be_placed_starts_nothing_until_one_that_fits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = controller.MemoryStore()
    async with opened(FakeRuntime(auto_ready=True, max_replicas=100), store) as ctl:
        await (await ctl.deploy("a", *pair(8))).wait()
    smaller = FakeRuntime(auto_ready=True, max_replicas=5)  # a machine with fewer slots
    async with opened(smaller, store) as ctl:
        await settle()
        status = ctl.status("a")
        assert (status.state, status.reason) == (
            controller.BackendState.DEPLOY_FAILED,
            "Infeasible",
        )
        assert "cannot place 8 more replicas" in (status.last_error or "")
        assert smaller.replicas == {}
        # It holds no room it cannot have: another backend may take it.
        await (await ctl.deploy("b", *pair(4))).wait()
        await (await ctl.deploy("a", *pair(1))).wait()
        assert len(smaller.tags(FakeState.READY)) == 5


async def test_the_user_traceback_reaches_the_goal_and_the_status(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    trace = 'Traceback (most recent call last):\n  File "app.py", line 3\nValueError: bad port\n'
    async with opened(rt) as ctl:
        goal = await ctl.deploy("a", *pair(1))
        for _ in range(3):
            await rt.wait_until(lambda r: bool(r.tags(FakeState.STARTING)))
            rt.fail_start(rt.tags(FakeState.STARTING)[0], "ValueError", "bad port", trace)
        with pytest.raises(controller.GoalFailed) as caught:
            await goal.wait()
        assert caught.value.traceback == trace
        assert ctl.status("a").last_traceback == trace


async def test_a_new_deploy_does_not_show_the_failure_of_the_one_before(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        goal = await ctl.deploy("a", *pair(1))
        for _ in range(3):
            await rt.wait_until(lambda r: bool(r.tags(FakeState.STARTING)))
            rt.fail_start(rt.tags(FakeState.STARTING)[0], "ValueError", "bad port")
        with pytest.raises(controller.GoalFailed):
            await goal.wait()
        assert "bad port" in ctl.status("a").message
        await ctl.deploy("a", *pair(1, "v2"))
        status = ctl.status("a")
        assert "bad port" not in status.message, status.message
        assert status.last_error == "ValueError: bad port"  # the latest failure, still known


async def test_messages_count_in_words(autojump_clock: trio.testing.MockClock) -> None:
    async with opened(FakeRuntime(auto_ready=True, auto_drain=False)) as ctl:
        await (await ctl.deploy("a", *pair(1))).wait()
        assert ctl.status("a").message == "1/1 replica of version v1 running"
        await ctl.delete("a")
        await settle()
        assert ctl.status("a").message == "deleting; 1 replica left"


async def test_a_rollout_shows_ready_of_any_version_and_of_the_target(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="controller")
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        cfg = config(num_replicas=2, version="v1", max_surge=1, max_unavailable=0)
        await (await ctl.deploy("a", cfg, RC)).wait()
        rt.auto_ready = False
        await ctl.deploy(
            "a", config(num_replicas=2, version="v2", max_surge=1, max_unavailable=0), RC
        )
        await settle()
        view = status_json(ctl.status("a"))
        assert (view["ready"], view["ready_of_version"]) == (2, 0)
        assert ready_column(view) == "2/2 (0/2 v2)"
        rt.finish_start(rt.tags(FakeState.STARTING)[0])
        await settle()
        # Each log line names the version of what it stops, and of what it starts.
        assert "backend a: starting 1 (version v2)\n" in caplog.text
        assert "backend a: stopping 1 (version v1)\n" in caplog.text
        assert ready_column(status_json(ctl.status("a"))) == "2/2 (1/2 v2)"


async def test_events_survive_a_restart() -> None:
    store = controller.MemoryStore()
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt, store) as ctl:
        await (await ctl.deploy("a", *pair(1))).wait()
        await settle()  # the writer stores the last event
        before = ctl.status("a").events
    async with opened(rt, store) as ctl:
        after = ctl.status("a").events
        assert [(e.kind, e.message) for e in after[: len(before)]] == [
            (e.kind, e.message) for e in before
        ]
        # Kept to the millisecond: compared as whole milliseconds (round(t, 3) of a float can
        # fall either side of a half, 1796065957.4525 read back as ...452 or ...453).
        assert [round((e.wall_time or 0) * 1000) for e in after[: len(before)]] == [
            round((e.wall_time or 0) * 1000) for e in before
        ]
        assert after[len(before)].kind == "Recovered"


async def test_a_failed_deploy_holds_no_room_it_does_not_use(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(max_replicas=3)
    async with opened(rt) as ctl:
        goal = await ctl.deploy("a", *pair(3))
        await rt.wait_until(lambda r: len(r.tags(FakeState.STARTING)) == 3)
        for tag in rt.tags(FakeState.STARTING):
            rt.fail_start(tag, "ValueError", "bad port")
        with pytest.raises(controller.GoalFailed):
            await goal.wait()
        await settle()
        events = [e.message for e in ctl.status("a").events]
        assert any(m.endswith("; no new start until the next deploy") for m in events), events
        rt.auto_ready = True
        await (await ctl.deploy("b", *pair(2))).wait()  # a holds nothing now


async def test_a_refused_rollout_says_where_its_count_comes_from() -> None:
    async with opened(FakeRuntime(auto_ready=True, max_replicas=4)) as ctl:
        await (await ctl.deploy("a", *pair(4))).wait()
        with pytest.raises(controller.InfeasibleError) as caught:
            await ctl.deploy("a", *pair(4, "v2"))  # max_surge 0.25: one more at the peak
        assert "num_replicas 4 and 1 more while the new version rolls out (max_surge)" in str(
            caught.value
        )


async def test_a_forced_delete_cuts_short_the_drains_under_way(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True, auto_drain=False)
    async with opened(rt) as ctl:
        cfg = config(num_replicas=1, version="v1", graceful_shutdown_timeout_s=100)
        await (await ctl.deploy("a", cfg, RC)).wait()
        await ctl.delete("a")
        await rt.wait_until(lambda r: bool(r.tags(FakeState.DRAINING)))
        t0 = trio.current_time()
        await (await ctl.delete("a", force=True)).wait()
        (replica,) = rt.replicas.values()
        assert replica.killed_at == t0  # not at the drain's deadline, 100 s on


async def test_a_goal_resolves_only_once_what_its_outcome_wrote_is_stored(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Found by an outside review: a goal completed before its events ("reached") and the
    # replicas' record were stored, so a program that read the store (or crashed) right after
    # could miss them. Now its waiters are woken by the write that holds them.
    rt = FakeRuntime()
    store = Batches()
    async with opened(rt, store) as ctl:
        goal = await ctl.deploy("a", config(num_replicas=1), RC)
        await settle()
        store.gate = trio.Event()  # the backend's next writes wait
        rt.finish_start(rt.tags(FakeState.STARTING)[0])
        await settle()
        assert not goal.done  # reached, but what says so is not stored yet
        store.gate.set()
        assert await goal.wait() is controller.GoalOutcome.COMPLETED
        stored = await store.read_all()
        assert "generation 1 reached" in stored["events/a"]
