"""Watch: long-poll snapshots whose ids only grow."""

from __future__ import annotations

import trio
import trio.testing

import controller
from controller._backend.snapshot import HELD_PUBLISH_S
from controller._model.records.code_report import CodeReport
from controller._model.records.multiplexing import ReplicaModels
from controller.testing import FakeRuntime, FakeState

from ..conftest import RC, config, opened, settle


async def test_listen_returns_at_once_with_anything_newer() -> None:
    async with opened() as ctl:
        await (await ctl.deploy("a", config(num_replicas=2), RC)).wait()
        out = await ctl.listen_for_change({"a": 0})
        assert set(out) == {"a"}
        assert len(out["a"].replicas) == 2
        assert out["a"].backend_config == config(num_replicas=2)
        # Everything, for a watcher that holds nothing yet.
        assert set(await ctl.listen_for_change()) == {"a"}
        # A watcher of every backend that is up to date on "a" wakes for a new backend "b".
        await ctl.deploy("b", config(num_replicas=0), RC)
        held = {"a": ctl.snapshot("a").snapshot_id}
        assert set(await ctl.listen_for_change(held, all_backends=True)) == {"b"}
        assert await ctl.listen_for_change({"b": 0}) == {"b": ctl.snapshot("b")}


async def test_listen_wakes_on_a_change_of_the_running_set() -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl, trio.open_nursery() as nursery:
        await ctl.deploy("a", config(num_replicas=2), RC)
        await settle()
        held = ctl.snapshot("a")
        got: list[controller.BackendSnapshot] = []

        async def watcher() -> None:
            got.append((await ctl.listen_for_change({"a": held.snapshot_id}))["a"])

        nursery.start_soon(watcher)
        await settle()
        assert got == []  # STARTING replicas are not a change watchers see
        first = rt.tags(FakeState.STARTING)[0]
        rt.finish_start(first)
        await settle()
        assert [r.tag for r in got[0].replicas] == [first]
        assert got[0].snapshot_id > held.snapshot_id


async def test_a_slow_watcher_catches_up_in_one_step_and_never_goes_back() -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        await ctl.deploy("a", config(num_replicas=3), RC)
        await settle()
        start = ctl.snapshot("a").snapshot_id
        for tag in rt.tags(FakeState.STARTING):
            rt.finish_start(tag)
            await settle()
        out = await ctl.listen_for_change({"a": start})
        assert len(out["a"].replicas) == 3  # the newest, not the next
        newer = await ctl.listen_for_change({"a": out["a"].snapshot_id - 1})
        assert newer["a"] == out["a"]


async def test_watch_iterator_yields_the_latest_and_sees_a_delete(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with opened() as ctl, trio.open_nursery() as nursery:
        seen: list[controller.BackendSnapshot] = []
        done = trio.Event()

        async def follow() -> None:
            async for snapshot in ctl.watch("a"):
                seen.append(snapshot)
                if not snapshot.exists and len(seen) > 1:
                    done.set()
                    return

        nursery.start_soon(follow)
        await settle()
        await (await ctl.deploy("a", config(num_replicas=2), RC)).wait()
        await settle()
        await (await ctl.delete("a")).wait()
        await done.wait()
        ids = [s.snapshot_id for s in seen]
        assert ids == sorted(set(ids))
        assert max(len(s.replicas) for s in seen) == 2
        assert not seen[-1].exists
        assert seen[-1].replicas == ()


async def test_unknown_backend_snapshot_is_empty() -> None:
    async with opened() as ctl:
        snap = ctl.snapshot("ghost")
        assert (snap.snapshot_id, snap.exists, tuple(snap.replicas)) == (0, False, ())
        with trio.move_on_after(0.01) as scope:
            await ctl.listen_for_change({"ghost": 0})
        assert scope.cancelled_caught


async def test_changes_since_one_cursor_covers_every_backend(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with opened() as ctl:
        await (await ctl.deploy("a", config(), RC)).wait()
        await (await ctl.deploy("b", config(), RC)).wait()
        everything = await ctl.changes_since(0)
        assert [s.name for s in everything] == ["a", "b"]
        cursor = max(s.snapshot_id for s in everything)
        with trio.move_on_after(5) as waited:
            await ctl.changes_since(cursor)
        assert waited.cancelled_caught  # nothing newer: it waits
        await (await ctl.delete("a")).wait()
        [tombstone] = await ctl.changes_since(cursor)
        assert tombstone.name == "a"
        assert not tombstone.exists


async def test_what_replicas_hold_of_their_models_is_published_at_most_once_a_second(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The first change of what a replica holds is published at once; one within a second of
    it waits for a tick at the second's end, which brings the latest; no change, no tick."""
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        await (await ctl.deploy("a", config(num_replicas=1), RC)).wait()
        (tag,) = [r.tag for r in ctl.status("a").replicas]

        def holds(*models: str, generation: int) -> None:
            said = ReplicaModels(generation, 4, tuple(models))
            rt.report_load(tag, 0, code=CodeReport(models=said))

        def published() -> frozenset[str]:
            return ctl.snapshot("a").held[tag].models

        t0 = trio.current_time()
        holds("m1", generation=1)
        await settle()
        assert published() == {"m1"}
        holds("m1", "m2", generation=2)
        holds("m1", "m2", "m3", generation=3)
        await settle()
        assert published() == {"m1"}  # within the second: not yet
        ids = ctl.snapshot("a").snapshot_id
        await trio.sleep_until(t0 + HELD_PUBLISH_S)
        await settle()
        assert published() == {"m1", "m2", "m3"}  # the tick brought the latest
        assert ctl.snapshot("a").snapshot_id == ids + 1
        await trio.sleep(10 * HELD_PUBLISH_S)
        assert ctl.snapshot("a").snapshot_id == ids + 1  # nothing changed since: no snapshot
