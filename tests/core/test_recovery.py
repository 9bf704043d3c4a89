"""Durable intent and recovery: a new controller over the same store and runtime."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import controller
from controller import GoalOutcome, ReplicaState
from controller._backend.turns import TURN_EVERY
from controller._clock import wall_now
from controller._model.records.records import SCHEMA_VERSION
from controller.testing import FakeRuntime, FakeState

from ..conftest import RC, FlakyStore, config, opened, settle


async def test_restart_adopts_live_replicas_without_restarting_them(tmp_path: Path) -> None:
    rt = FakeRuntime(auto_ready=True)
    with controller.SQLiteStore(tmp_path / "state.db") as store:
        async with opened(rt, store) as ctl:
            await (await ctl.deploy("a", config(num_replicas=3), RC)).wait()
            tags = sorted(r.tag for r in ctl.status("a").replicas)
    # A new store object over the same file: nothing carried over in memory.
    with controller.SQLiteStore(tmp_path / "state.db") as store:
        async with opened(rt, store) as ctl:
            status = ctl.status("a")
            assert sorted(r.tag for r in status.replicas) == tags
            assert status.generation == 1
            # Listed to watchers at once, as they may be serving: before any is adopted.
            assert sorted(r.tag for r in ctl.snapshot("a").replicas) == tags
            # Real file I/O runs in a thread, so wait on the controller, not on blocked tasks.
            with trio.fail_after(5):
                await ctl.wait_until(
                    lambda c: {r.state for r in c.status("a").replicas} == {ReplicaState.RUNNING}
                )
            assert len(rt.replicas) == 3  # none restarted, none added
            assert sorted(r.tag for r in ctl.snapshot("a").replicas) == tags
            assert [what for _, _, what in rt.history].count("adopt") == 3


async def test_adopted_replicas_are_recovering_until_confirmed() -> None:
    rt = FakeRuntime()
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        await ctl.deploy("a", config(num_replicas=1), RC)
        await settle()
    (tag,) = rt.tags(FakeState.STARTING)  # its start was in flight when the controller closed
    async with opened(rt, store) as ctl:
        await settle()
        assert [r.state for r in ctl.status("a").replicas] == [ReplicaState.RECOVERING]
        assert ctl.snapshot("a").replicas == ()
        rt.finish_start(tag)
        await settle()
        assert [(r.tag, r.state) for r in ctl.status("a").replicas] == [(tag, ReplicaState.RUNNING)]
        assert len(rt.replicas) == 1  # no duplicate


async def test_replicas_no_intent_names_are_killed_and_missing_ones_started() -> None:
    rt = FakeRuntime(auto_ready=True)
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        await (await ctl.deploy("a", config(num_replicas=2), RC)).wait()
        kept, lost = rt.tags()
    # While the controller is down: one replica dies, and a stranger appears.
    rt.replicas[lost].state = FakeState.DEAD
    stranger = await rt.start_replica(controller.ReplicaSpec("a#stranger", "a", "v1", RC, None, {}))
    assert stranger is not None
    async with opened(rt, store) as ctl:
        await settle()
        assert rt.replicas["a#stranger"].state is FakeState.DEAD
        tags = {r.tag for r in ctl.status("a").replicas}
        assert kept in tags
        assert lost not in tags
        assert len(tags) == 2
        assert {r.state for r in ctl.status("a").replicas} == {ReplicaState.RUNNING}
        assert len(rt.tags()) == 2
        stored = json.loads(store.data["replicas/a"])
        assert {r["tag"] for r in stored["replicas"]} == tags


async def test_a_stop_interrupted_by_a_crash_is_finished_by_the_next_controller(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True, auto_drain=False)
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        await (
            await ctl.deploy("a", config(num_replicas=2, graceful_shutdown_timeout_s=10), RC)
        ).wait()
        await ctl.deploy("a", config(num_replicas=1, graceful_shutdown_timeout_s=10), RC)
        await settle()
        (draining,) = rt.tags(FakeState.DRAINING)
    async with opened(rt, store) as ctl:
        await settle()
        assert ctl.status("a").counts == {ReplicaState.STOPPING: 1, ReplicaState.RUNNING: 1}
        assert draining not in {r.tag for r in ctl.snapshot("a").replicas}
        await trio.sleep(10)
        await settle()
        assert rt.replicas[draining].state is FakeState.DEAD
        assert ctl.status("a").counts == {ReplicaState.RUNNING: 1}


async def test_a_delete_interrupted_by_a_crash_completes_after_restart() -> None:
    rt = FakeRuntime(auto_ready=True, auto_drain=False)
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        await (await ctl.deploy("a", config(num_replicas=2), RC)).wait()
        await ctl.delete("a")
        await settle()
    async with opened(rt, store) as ctl:
        await settle()
        assert ctl.status("a").deleting
        for tag in rt.tags(FakeState.DRAINING):
            rt.finish_drain(tag)
        await settle()
        assert ctl.status().backends == ()
        assert store.data == {}
        assert rt.tags() == []


async def test_recovered_goals_can_be_superseded() -> None:
    rt = FakeRuntime(auto_ready=True)
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        await (await ctl.deploy("a", config(num_replicas=1), RC)).wait()
    async with opened(rt, store) as ctl:
        goal = await ctl.deploy("a", config(num_replicas=2), RC)
        assert await goal.wait() is GoalOutcome.COMPLETED
        assert ctl.status("a").generation == 2


@pytest.mark.parametrize("kept", ["replicas/a", "revisions/a", "events/a"])
async def test_a_backend_s_records_without_its_spec_stop_start_up_and_kill_nothing(
    autojump_clock: trio.testing.MockClock, kept: str
) -> None:
    # Found by an outside attack: a store with a backend's replica record but no spec row was
    # taken, and that backend's live replicas killed as strays.
    store = controller.MemoryStore()
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt, store) as ctl:
        await (await ctl.deploy("a", config(num_replicas=2), RC)).wait()
        await settle()
    live = rt.tags()
    damaged = controller.MemoryStore(
        {k: v for k, v in store.data.items() if k == kept or not k.endswith("/a")}
    )
    with pytest.raises(controller.CheckpointError, match=f"'{kept}' has no spec") as info:
        async with opened(rt, damaged):
            pytest.fail("must not open")
    assert "left untouched" in str(info.value)
    assert damaged.writes == 0
    assert rt.tags() == live  # nothing was killed


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("not json", "is not valid JSON"),
        ('{"name": "a"}', "no schema version"),
        ('{"schema": 99, "name": "a"}', "schema 99, newer than this controller reads"),
        ('{"schema": 1, "name": "a"}', "is corrupt"),
        (
            '{"schema": 1, "name": "a", "generation": 1, "backend_config": {"num_replicas": -2},'
            ' "replica_config": {"entrypoint": "m:C"}}',
            r"corrupt: BackendConfig.num_replicas: must be a whole number",
        ),
    ],
)
async def test_an_unreadable_checkpoint_stops_start_up_and_leaves_data_untouched(
    text: str, match: str
) -> None:
    rt = FakeRuntime(auto_ready=True)
    await rt.start_replica(controller.ReplicaSpec("a#live", "a", "v1", RC, None, {}))
    store = controller.MemoryStore({"spec/a": text})
    with pytest.raises(controller.CheckpointError, match=match) as info:
        async with opened(rt, store):
            pytest.fail("must not open")
    assert "'spec/a'" in str(info.value)
    assert "left untouched" in str(info.value)
    assert store.data == {"spec/a": text}
    assert store.writes == 0
    assert rt.tags() == ["a#live"]  # nothing was killed


async def test_checkpoints_are_json_with_a_schema_version() -> None:
    store = controller.MemoryStore()
    async with opened(store=store) as ctl:
        await (await ctl.deploy("a", config(num_replicas=1, user_config={"x": [1, 2]}), RC)).wait()
    spec = json.loads(store.data["spec/a"])
    assert spec["schema"] == SCHEMA_VERSION
    assert spec["backend_config"]["user_config"] == {"x": [1, 2]}
    assert spec["replica_config"]["entrypoint"] == RC.entrypoint
    replicas = json.loads(store.data["replicas/a"])
    assert replicas["schema"] == SCHEMA_VERSION
    # Fields at their defaults are left out: a replica not stopping says nothing of it.
    assert [r.get("stopping", False) for r in replicas["replicas"]] == [False]


class Ordered:
    """A store and a runtime that check, at each runtime call, what the store already holds."""

    def __init__(self) -> None:
        self.store = controller.MemoryStore()
        self.runtime = FakeRuntime(auto_ready=True, auto_drain=True)
        self.checked: list[str] = []

    def stored(self, tag: str) -> dict[str, object] | None:
        text = self.store.data.get(f"replicas/{tag.partition('#')[0]}")
        records = json.loads(text)["replicas"] if text else []
        return next((r for r in records if r["tag"] == tag), None)

    def __getattr__(self, name: str) -> object:
        return getattr(self.runtime, name)

    async def start_replica(
        self, spec: controller.ReplicaSpec
    ) -> controller.ReplicaInfo | str | None:
        record = self.stored(spec.tag)
        assert record is not None
        assert record.get("stopping", False) is False
        self.checked.append("start")
        return await self.runtime.start_replica(spec)

    async def drain_replica(self, tag: str) -> None:
        record = self.stored(tag)
        assert record is not None
        assert record["stopping"] is True
        self.checked.append("drain")
        await self.runtime.drain_replica(tag)


async def test_intent_reaches_the_store_before_the_runtime_is_asked() -> None:
    ordered = Ordered()
    async with opened(ordered, ordered.store) as ctl:  # type: ignore[arg-type]  # duck-typed runtime
        await (await ctl.deploy("a", config(num_replicas=2), RC)).wait()
        await (await ctl.deploy("a", config(num_replicas=1), RC)).wait()
    assert ordered.checked == ["start", "start", "drain"]


async def test_cached_event_texts_make_the_same_log_as_cattrs() -> None:
    from controller._backend.history import EVENTS_KEPT, EventLog
    from controller._model.records.checkpoint import dump, load
    from controller._model.records.records import EventRecord, EventsRecord

    def as_cattrs(log: EventLog) -> str:
        events = log.events
        records = [EventRecord(round((e.wall_time or 0) * 1000), e.kind, e.message) for e in events]
        return dump(EventsRecord(log.name, records))

    log = EventLog("a")
    assert log.text() == as_cattrs(log)
    for i in range(EVENTS_KEPT + 7):  # past the bound: the oldest texts go with their events
        log.add("Scale", f'event {i}: "quoted", unicode f\u00fcr, \u2028 and a newline\n')
        assert log.text() == as_cattrs(log)
    assert len(log.events) == EVENTS_KEPT
    back = EventLog("a")
    back.restore(load("events/a", log.text(), EventsRecord))
    assert back.text() == log.text()
    back.add("Ready", "after the restore")
    assert back.text() == as_cattrs(back)


def test_cached_replica_entries_make_the_same_checkpoint_as_cattrs() -> None:
    from controller._backend.pages import PAGE_SIZE, Pages
    from controller._model.records.checkpoint import dump, dump_replica, join_replicas, load
    from controller._model.records.records import ReplicaRecord, ReplicasRecord

    records = [ReplicaRecord("a#1", "v1", "d", False), ReplicaRecord("a#2", "gen-3", "e", True)]
    fast = join_replicas("a", ",".join(dump_replica(r) for r in records))
    assert fast == dump(ReplicasRecord("a", records))
    assert load("replicas/a", fast, ReplicasRecord) == ReplicasRecord("a", records)
    assert join_replicas("a", "") == dump(ReplicasRecord("a", []))
    # Over several pages, with entries changed and removed (a page emptied among them): the
    # pages' text is the entries' in the order they were added.
    pages, held = Pages(), {}
    kept: dict[str, ReplicaRecord] = {}
    for i in range(3 * PAGE_SIZE + 7):
        record = ReplicaRecord(f"a#{i}", "v1", "d", False)
        held[record.tag] = pages.add(record.tag)
        pages.set(held[record.tag], record.tag, dump_replica(record))
        kept[record.tag] = record
        if i % 100 == 0:  # texts made on the way are remade where they change
            assert join_replicas("a", pages.joined()) == dump(ReplicasRecord("a", [*kept.values()]))
    for i in range(PAGE_SIZE, 2 * PAGE_SIZE):  # the second page, whole
        pages.remove(held.pop(f"a#{i}"), f"a#{i}")
        del kept[f"a#{i}"]
    for i in range(0, 3 * PAGE_SIZE + 7, 5):
        if f"a#{i}" in kept:
            kept[f"a#{i}"] = ReplicaRecord(f"a#{i}", "v2", "e", True)
            pages.set(held[f"a#{i}"], f"a#{i}", dump_replica(kept[f"a#{i}"]))
        if i % 50 == 0:
            assert pages.joined()  # made between changes too
    pages.remove(held["a#3"], "a#3")
    del kept["a#3"]
    expected = dump(ReplicasRecord("a", list(kept.values())))
    assert join_replicas("a", pages.joined()) == expected


async def test_nothing_starts_until_its_intent_is_durable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    store = FlakyStore()
    async with opened(rt, store) as ctl:
        store.failing = True
        with pytest.raises(controller.StoreError):
            await ctl.deploy("a", config(num_replicas=1), RC)  # the spec itself: refused at once
        store.failing = False
        goal = await ctl.deploy("a", config(num_replicas=1), RC)
        store.failing = True
        await trio.sleep(30)
        # The replica's tag could not be checkpointed: the runtime was never asked.
        assert rt.replicas == {}
        assert ctl.status("a").counts == {ReplicaState.STARTING: 1}
        store.failing = False
        assert await goal.wait() is GoalOutcome.COMPLETED
        assert len(rt.tags()) == 1
        assert trio.current_time() <= 30 + 5.0  # retried with backoff capped at 5 s


async def test_a_stop_taken_over_gets_only_what_is_left_of_its_drain_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Found by an outside attack on standbys: each takeover granted a stop's drain a whole new
    deadline, so takeovers in a row could drain for ever. The stop's start is stored."""
    rt = FakeRuntime(auto_ready=True, auto_drain=False)  # drains never finish on their own
    store = controller.MemoryStore()
    cfg = controller.BackendConfig(num_replicas=1, graceful_shutdown_timeout_s=20)
    async with controller.open_controller(runtime=rt, store=store) as ctl:
        await (await ctl.deploy("a", cfg, RC)).wait()
        await ctl.delete("a")
        await trio.testing.wait_all_tasks_blocked()
    (tag,) = rt.tags(FakeState.DRAINING)
    record = json.loads(store.data["replicas/a"])
    [entry] = record["replicas"]
    assert entry["stopping"] is True
    # As if the stop had begun 15 s before the next controller took over.
    entry["stopping_ms"] = round((wall_now() - 15) * 1000)
    store.data["replicas/a"] = json.dumps(record)
    async with controller.open_controller(runtime=rt, store=store) as ctl:
        began = trio.current_time()
        await rt.wait_until(lambda r: r.replicas[tag].state is FakeState.DEAD)
        killed = rt.replicas[tag].killed_at
        assert killed is not None
        # 20 - 15: the controller's wall clock follows the MockClock (the start is in whole ms)
        assert killed - began == pytest.approx(5, abs=0.001)


async def test_a_recovery_of_many_backends_lets_the_loop_go_on(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by a trial: a restart over 3,000 backends answered no request (and renewed its
    # lease late) while it restored them all in one step.
    store = controller.MemoryStore()
    rt = FakeRuntime(auto_ready=True)
    n = 4 * TURN_EVERY
    async with opened(rt, store) as ctl:
        await ctl.apply({f"b{i}": (config(num_replicas=0), RC) for i in range(n)})
        await trio.testing.wait_all_tasks_blocked()
    restored = 0
    made = controller.Controller._restored

    def counted(self: controller.Controller, *args: Any) -> Any:
        nonlocal restored
        restored += 1
        return made(self, *args)

    monkeypatch.setattr(controller.Controller, "_restored", counted)
    seen: list[int] = []

    async def other_task() -> None:
        while True:
            seen.append(restored)
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_task)
        async with opened(rt, store) as again:
            assert len(again.status().backends) == n
        nursery.cancel_scope.cancel()
    # Between two turns of the other task, at most two of recovery's (trio runs a round's
    # tasks in a random order): without turns, all of them at once.
    assert restored == n
    assert max(b - a for a, b in itertools.pairwise(seen)) <= 2 * TURN_EVERY
