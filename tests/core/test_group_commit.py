"""Group commit: a crash costs the store one commit before its replacement is started, and a
burst of crashes costs about one, not one each (SQLite, synchronous=FULL: a commit is an
fsync). Counted with ``SQLiteStore.transactions``; the real clock, as the store works in a
thread, each test bounded."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

import trio
import trio.testing

import controller
from controller._ports.wrap import RuntimeWrapper, StoreWrapper
from controller.testing import FakeRuntime

from ..conftest import RC, config, serving

T = TypeVar("T")
AT_ONCE = controller.RestartPolicy(initial_delay_s=0.0, jitter=0.0)


class InFlight(StoreWrapper):
    """Counts the writes under way, so that a test can start from a quiet store."""

    def __init__(self, inner: controller.SQLiteStore):
        super().__init__(inner)
        self.writing = 0
        self.idle = trio.Event()

    async def around(self, op: str, keys: Sequence[str], work: Callable[[], Awaitable[T]]) -> T:
        if op != "write":
            return await work()
        self.writing += 1
        try:
            return await work()
        finally:
            self.writing -= 1
            if not self.writing:
                self.idle.set()
                self.idle = trio.Event()

    async def quiet(self) -> None:
        """Until no write is under way and none is about to be: every task is blocked (on an
        event, as nothing here has a timer) and no write is in the store's thread."""
        while True:
            await trio.testing.wait_all_tasks_blocked()
            if not self.writing:
                return
            await self.idle.wait()


class CommitsAtStart(RuntimeWrapper):
    """Notes, at each start the controller asks for, how many commits the store had made."""

    def __init__(self, inner: FakeRuntime, store: controller.SQLiteStore):
        super().__init__(inner)
        self.store = store
        self.at_start: dict[str, int] = {}

    async def around(self, op: str, tag: str | None, work: Callable[[], Awaitable[T]]) -> T:
        if op == "start" and tag is not None:
            self.at_start[tag] = self.store.transactions
        return await work()


async def test_writes_that_arrive_during_a_commit_share_the_next_one(tmp_path: Path) -> None:
    with controller.SQLiteStore(tmp_path / "s.db") as store:
        await store.write({"alone": "1"})
        assert store.transactions == 1
        # 50 writers at once: the first commits alone (nothing else is queued when it begins),
        # the 49 that arrive while its commit is in flight go together in the next.
        async with trio.open_nursery() as nursery:
            for i in range(50):
                nursery.start_soon(store.write, {f"k{i}": str(i)})
        assert store.transactions == 3
        assert len(await store.read_all()) == 51


async def test_one_crash_is_one_commit_and_a_burst_about_one(tmp_path: Path) -> None:
    fake = FakeRuntime(auto_ready=True)
    full = controller.SQLiteStore(tmp_path / "s.db", synchronous="FULL")
    with full as store, trio.fail_after(60):
        rt = CommitsAtStart(fake, store)
        counted = InFlight(store)
        async with controller.open_controller(
            runtime=rt, store=counted, restart_policy=AT_ONCE
        ) as ctl:
            for name in ("a", "b", "c", "d"):
                await (await ctl.deploy(name, config(num_replicas=20), RC)).wait()
            for name in ("a", "b", "c", "d"):
                await serving(ctl, name, 20)

            async def crash(victims: list[str]) -> dict[str, int]:
                """Crash `victims` at once; the commits each replacement's start waited for."""
                await counted.quiet()
                before, started = store.transactions, set(rt.at_start)
                for tag in victims:
                    fake.crash(tag)
                for name in {tag.split("#")[0] for tag in victims}:
                    await serving_without(ctl, name, 20, victims)
                new = {t: n - before for t, n in rt.at_start.items() if t not in started}
                assert len(new) == len(victims)
                return new

            # One crash: its replacement is started after exactly one commit (its intent).
            (one,) = (await crash([ctl.snapshot("a").replicas[0].tag])).values()
            assert one == 1
            # Ten crashes in one backend: one pass, one intent, one commit for all ten.
            burst = await crash([r.tag for r in ctl.snapshot("b").replicas[:10]])
            assert set(burst.values()) == {1}
            # One crash in each of three backends at once: three writers, whose writes arrive
            # together; the first commits alone and the other two share the next.
            spread = await crash([ctl.snapshot(n).replicas[0].tag for n in ("b", "c", "d")])
            assert max(spread.values()) <= 2


async def serving_without(
    ctl: controller.Controller, name: str, count: int, gone: list[str]
) -> None:
    snapshot = ctl.snapshot(name)
    while len(snapshot.replicas) != count or {r.tag for r in snapshot.replicas} & set(gone):
        snapshot = (await ctl.listen_for_change({name: snapshot.snapshot_id}))[name]
