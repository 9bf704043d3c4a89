"""The lease and the leadership: the pure decisions, the stores' atomic steps (MemoryStore and a
real SQLite file, two connections as two daemons have), and ``Leadership`` under MockClock."""

from __future__ import annotations

import math
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

import controller
from controller._backend.turns import TURN_EVERY
from controller._leadership.keeper import Leadership
from controller._leadership.standby import store_view
from controller._model.decisions.lease import (
    MAX_COUNT,
    Lease,
    LeaseTiming,
    Watched,
    claim_at,
    claimed,
    renewed,
    same_grant,
    watch,
)
from controller._model.values.errors import FencedError
from controller._ports.store import LeaseStore
from controller._routing.sources import REPORT_TIMEOUT_S, SourceError
from controller._stores.sqlite import SQLiteStore
from controller.ingress import HTTPSource
from controller.testing import FakeRuntime

from ..conftest import RC

TIMING = LeaseTiming(duration_s=2.0, renew_s=0.5)


def lease(epoch: int = 1, holder: str = "a", renewals: int = 0, **kw: object) -> Lease:
    return Lease(epoch=epoch, holder=holder, duration_s=2.0, renewals=renewals, **kw)  # type: ignore[arg-type]


# -- the pure part --


def test_timing_refuses_a_renewal_too_slow_for_the_lease() -> None:
    with pytest.raises(controller.ConfigError, match="lease_renew_s: must be at most a third"):
        LeaseTiming(duration_s=1.0, renew_s=0.5)
    with pytest.raises(controller.ConfigError, match="lease_duration_s"):
        LeaseTiming(duration_s=math.inf)
    with pytest.raises(controller.ConfigError, match="lease_renew_s"):
        LeaseTiming(renew_s=0)
    assert LeaseTiming().renew_deadline_s == 1.5


def test_a_damaged_lease_is_a_store_error() -> None:
    for text in (
        "[]",
        "{}",
        '{"epoch": -1, "holder": "a", "duration_s": 1}',
        '{"epoch": true, "holder": "a", "duration_s": 1}',
        '{"epoch": 1, "holder": "a", "duration_s": "inf"}',
        "not json",
    ):
        with pytest.raises(controller.StoreError, match="the stored lease cannot be read"):
            Lease.from_json(text)
    original = lease(3, address="http://127.0.0.1:7070", pid=12)
    assert Lease.from_json(original.to_json()) == original


@given(
    renewals=st.lists(st.floats(0, 10), max_size=20),
    now=st.floats(0, 100),
)
def test_a_standby_never_claims_a_live_lease_early(renewals: list[float], now: float) -> None:
    """Whenever the lease moved last (as the standby saw it), a claim is allowed no sooner than
    its duration after that."""
    seen: Watched | None = None
    t = 0.0
    current = lease()
    for gap in renewals:
        t += gap
        current = renewed(current, wall=t, address=None)
        seen = watch(seen, current, t)
    seen = watch(seen, current, t)
    assert claim_at(seen, "b") == seen.since + 2.0
    assert seen.since == t
    # The same lease read again later does not restart the wait.
    assert watch(seen, current, t + now) is seen


def test_a_standby_claims_at_once_what_is_released_missing_or_its_own() -> None:
    assert claim_at(Watched(None, 5.0), "b") == -math.inf
    assert claim_at(Watched(lease(released=True), 5.0), "b") == -math.inf
    assert claim_at(Watched(lease(holder="b"), 5.0), "b") == -math.inf
    assert claim_at(Watched(lease(holder="a"), 5.0), "b") == 7.0


def test_a_claim_takes_the_next_epoch() -> None:
    new = claimed(lease(7), holder="b", duration_s=3.0, pid=1, wall=10.0, address="x")
    assert (new.epoch, new.holder, new.renewals, new.address) == (8, "b", 0, "x")
    assert claimed(None, holder="b", duration_s=3.0, pid=1, wall=0.0).epoch == 1
    assert same_grant(lease(1), lease(1, pid=9))
    assert not same_grant(lease(1), lease(1, renewals=1))
    assert not same_grant(lease(1), None)


# -- the stores --


def stores(tmp_path: Path) -> list[tuple[LeaseStore, LeaseStore]]:
    """Two handles on one store, as two daemons have: MemoryStore shared, and two SQLite
    connections to one file."""
    memory = controller.MemoryStore()
    path = tmp_path / "c.db"
    return [(memory, memory), (SQLiteStore(path), SQLiteStore(path))]


async def test_a_claim_is_a_compare_and_set(tmp_path: Path) -> None:
    for a, b in stores(tmp_path):
        assert await a.read_lease() is None
        first = lease(1, "a")
        assert await a.claim_lease(None, first)
        # b read nothing before a's claim: its claim over nothing fails.
        assert not await b.claim_lease(None, lease(1, "b"))
        assert await b.read_lease() == first
        # a renews: b's claim over what it read before the renewal fails too.
        again = renewed(first, wall=1.0, address="http://a")
        await a.renew_lease(again)
        assert not await b.claim_lease(first, lease(2, "b"))
        assert await b.claim_lease(again, lease(2, "b"))
        assert (await a.read_lease()) == lease(2, "b")


async def test_a_stale_epoch_can_neither_write_nor_renew(tmp_path: Path) -> None:
    for a, b in stores(tmp_path):
        await a.claim_lease(None, lease(1, "a"))
        await a.write_fenced(1, {"k": "from a"})
        assert await b.claim_lease(lease(1, "a"), lease(2, "b"))
        with pytest.raises(FencedError, match="epoch 1 is no longer the leader's") as caught:
            await a.write_fenced(1, {"k": "stale", "other": "stale"})
        assert caught.value.newer == 2
        with pytest.raises(FencedError):
            await a.renew_lease(renewed(lease(1, "a"), wall=2.0, address=None))
        assert await b.read_all() == {"k": "from a"}
        assert (await b.read_lease()) == lease(2, "b")
        await b.write_fenced(2, {"k": "from b"})
        assert await a.read_all() == {"k": "from b"}


async def test_sqlite_groups_writes_of_one_epoch_and_keeps_epochs_apart(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "c.db")
    await store.claim_lease(None, lease(2, "b"))
    outcomes: dict[str, object] = {}

    async def write(epoch: int, key: str) -> None:
        try:
            await store.write_fenced(epoch, {key: "x"})
            outcomes[key] = "ok"
        except FencedError as exc:
            outcomes[key] = exc.newer

    async with trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(write, 1 if i % 2 else 2, f"k{i}")
    assert outcomes == {f"k{i}": 2 if i % 2 else "ok" for i in range(10)}
    assert set(await store.read_all()) == {f"k{i}" for i in range(0, 10, 2)}
    assert store.transactions <= 6


async def test_many_claims_at_once_make_one_leader(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    handles = [SQLiteStore(path) for _ in range(8)]
    won: list[str] = []

    async def claim(i: int, store: SQLiteStore) -> None:
        seen = await store.read_lease()
        if claim_at(Watched(seen, 0.0), f"d{i}") > 0:
            return  # one leads already (as the campaign decides)
        new = claimed(seen, holder=f"d{i}", duration_s=2.0, pid=i, wall=0.0)
        if await store.claim_lease(seen, new):
            won.append(new.holder)

    async with trio.open_nursery() as nursery:
        for i, store in enumerate(handles):
            nursery.start_soon(claim, i, store)
    held = await handles[0].read_lease()
    assert held is not None
    assert won == [held.holder]
    assert held.epoch == 1


# -- Leadership, under MockClock --


def leads(leadership: Leadership) -> bool:
    return leadership.leading


async def test_a_standby_takes_over_once_the_leader_stops_renewing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = controller.MemoryStore()
    a = Leadership(store, "host:/a", TIMING, address="http://a")
    b = Leadership(store, "host:/b", TIMING, address="http://b")
    assert (await a.campaign()).epoch == 1
    assert trio.current_time() == 0
    b_lease: list[Lease] = []
    async with trio.open_nursery() as nursery:
        with a.leading_scope() as a_scope:

            async def stand_by() -> None:
                b_lease.append(await b.campaign())

            nursery.start_soon(stand_by)
            async with trio.open_nursery() as inner:
                inner.start_soon(a.keep)
                # A renews for a minute: B never claims meanwhile.
                with trio.move_on_after(60):
                    await trio.sleep_forever()
                assert not b_lease
                assert a.renewals in (119, 120)  # every 0.5 s (the one at 60 s may be next)
                assert b.seen is not None
                assert b.seen.address == "http://a"
                # A dies (its renewals stop, at 60 s, right after its last one).
                inner.cancel_scope.cancel()
        assert not a_scope.cancelled_caught
    taken_at = trio.current_time()
    assert b_lease[0].epoch == 2
    assert b_lease[0].holder == "host:/b"
    # B saw the last renewal (59.5 s or 60 s) within one read period of it, and claimed its
    # duration later.
    assert 59.5 + 2.0 <= taken_at <= 60 + 2.0 + 0.5


async def test_a_leader_that_cannot_renew_stops_before_a_standby_may_claim(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = controller.MemoryStore()
    hold = trio.Event()

    class Stalled:
        """The store as the leader's own connection sees it: its renewals hang from 10 s."""

        def __getattr__(self, name: str) -> object:
            return getattr(store, name)

        async def renew_lease(self, new: Lease) -> None:
            if trio.current_time() >= 10:
                await hold.wait()
            await store.renew_lease(new)

    a = Leadership(Stalled(), "host:/a", TIMING)  # type: ignore[arg-type]
    b = Leadership(store, "host:/b", TIMING)
    await a.campaign()
    stopped_at = claimed_at = -1.0
    async with trio.open_nursery() as nursery:

        async def stand_by() -> None:
            nonlocal claimed_at
            await b.campaign()
            claimed_at = trio.current_time()

        nursery.start_soon(stand_by)
        with a.leading_scope() as scope:
            async with trio.open_nursery() as inner:
                inner.start_soon(a.keep)
                await trio.Event().wait()  # until the scope is cancelled
        stopped_at = trio.current_time()
        assert scope.cancelled_caught
        assert not a.leading
    # The last renewal that worked began at 9.5 s: A stops at 9.5 + 1.5, B claims from 9.5 + 2.
    assert stopped_at == 11.0
    assert claimed_at >= 11.5
    hold.set()


async def _held_up(clock: trio.testing.MockClock, seconds: float) -> tuple[bool, bool, bool]:
    """A leads, B stands by; at 10.25 s (between two of A's renewals) the whole loop is held up
    for `seconds` (time passes with no task running, as in a long collection). Whether, at
    20 s, A leads, B leads, and A's scope was cancelled."""
    store = controller.MemoryStore()
    a = Leadership(store, "host:/a", TIMING)
    b = Leadership(store, "host:/b", TIMING)
    await a.campaign()
    b_leads = False
    async with trio.open_nursery() as nursery:

        async def stand_by() -> None:
            nonlocal b_leads
            await b.campaign()
            b_leads = True

        nursery.start_soon(stand_by)
        with a.leading_scope() as scope:
            async with trio.open_nursery() as inner:
                inner.start_soon(a.keep)
                await trio.sleep(10.25)
                clock.jump(seconds)  # no task runs meanwhile: every timer is late at once
                await trio.sleep(20 - trio.current_time())
                inner.cancel_scope.cancel()
        a_leads = a.leading
        nursery.cancel_scope.cancel()
    return a_leads, b_leads, scope.cancelled_caught


async def test_a_leader_held_up_past_its_renew_deadline_renews_and_keeps_leading(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Held up until 1.85 s after A's last renewal (at 10 s): past its renew deadline (1.5 s),
    short of the lease (2 s), which is as soon as B may claim: the renewal, late, finds the
    lease still A's, so A goes on leading and B never claims."""
    assert await _held_up(autojump_clock, 1.6) == (True, False, False)


@pytest.mark.parametrize("seconds", [2.1, 2.5, 5.0])
async def test_a_leader_held_up_past_its_lease_leaves_exactly_one_leader(
    autojump_clock: trio.testing.MockClock, seconds: float
) -> None:
    """Held up past the lease, A and B wake together: whichever compare-and-set lands first
    wins, and the other does not lead (A's late renewal refused, or B's claim beaten)."""
    a_leads, b_leads, a_stopped = await _held_up(autojump_clock, seconds)
    assert a_leads != b_leads
    assert a_stopped == b_leads


async def test_a_fenced_renewal_stops_the_leader_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = controller.MemoryStore()
    a = Leadership(store, "host:/a", TIMING)
    first = await a.campaign()
    with a.leading_scope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.keep)
            await trio.sleep(0.75)  # between two renewals
            # Another daemon claimed over what it read (a pause of A's, say).
            seen = await store.read_lease()
            assert seen is not None
            assert await store.claim_lease(
                seen, claimed(seen, holder="host:/b", duration_s=2, pid=2, wall=0)
            )
            await trio.Event().wait()  # until the scope is cancelled
    assert scope.cancelled_caught
    assert trio.current_time() == 1.0  # the next renewal found it
    assert a.refusals == 1
    assert first.epoch == 1
    assert store.fenced == 1


async def test_a_restart_on_the_same_state_dir_takes_its_lease_back_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = controller.MemoryStore()
    assert (await Leadership(store, "host:/a", TIMING).campaign()).epoch == 1
    # kill -9, and the same state dir again (its lock proves the first is gone).
    again = await Leadership(store, "host:/a", TIMING).campaign()
    assert (again.epoch, trio.current_time()) == (2, 0)


async def test_a_released_lease_is_taken_at_once(autojump_clock: trio.testing.MockClock) -> None:
    store = controller.MemoryStore()
    a = Leadership(store, "host:/a", TIMING)
    b = Leadership(store, "host:/b", TIMING)
    await a.campaign()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(b.campaign)
        with a.leading_scope():
            async with trio.open_nursery() as inner:
                inner.start_soon(a.keep)
                await trio.sleep(30)
                assert not b.leading
                inner.cancel_scope.cancel()
        await a.release()
        released_at = trio.current_time()
    assert leads(b)
    assert trio.current_time() - released_at <= 0.5
    seen = await store.read_lease()
    assert seen is not None
    assert (seen.epoch, seen.holder) == (2, "host:/b")


# -- a standby's view of the store --


async def test_a_standby_s_view_shows_what_the_leader_wrote(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    store = controller.MemoryStore()
    auto = controller.AutoscalingConfig(min_replicas=3, max_replicas=8)
    async with controller.open_controller(runtime=rt, store=store) as ctl:
        plain = controller.BackendConfig(num_replicas=2, version="v1", route_prefix="/p")
        await (await ctl.deploy("plain", plain, RC)).wait()
        scaled = controller.BackendConfig(version="v1", autoscaling=auto)
        await (await ctl.deploy("auto", scaled, RC)).wait()
        await trio.sleep(1)  # the addresses reach the store after the replicas serve
        view = await store_view(store.data, [])
        for name in ("plain", "auto"):
            leader, seen = ctl.status(name), view.status(name)
            assert (seen.state, seen.desired, seen.goal_done) == (
                leader.state,
                leader.desired,
                True,
            )
            assert seen.observed_generation == seen.generation == leader.generation
            assert {r.tag for r in seen.replicas} == {r.tag for r in leader.replicas}
            # In no particular order (the order replicas came to serve, on the leader).
        assert set(ctl.snapshot(name).replicas) == set(view.snapshot(name).replicas)
        assert view.status("auto").autoscaler is not None
        assert view.status("auto").autoscaler.capped_at is None  # type: ignore[union-attr]
        # Mid-rollout, as the leader last wrote it: not converged, not done.
        rt.auto_ready = False
        await ctl.deploy("plain", attrs.evolve(plain, version="v2", max_surge=1), RC)
        await trio.testing.wait_all_tasks_blocked()
        during = (await store_view(store.data, [])).status("plain")
        assert not during.goal_done
        assert during.state is not controller.BackendState.HEALTHY
        assert len((await store_view(store.data, [])).snapshot("plain").replicas) == 2


async def test_a_standby_s_view_of_many_backends_is_built_while_its_loop_goes_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Found by a trial: a standby rebuilt its view of 16,000 backends in one step of 6 s, its
    # API unanswered meanwhile (and again at every change the leader made).
    store = controller.MemoryStore()
    async with controller.open_controller(runtime=FakeRuntime(), store=store) as ctl:
        zero = controller.BackendConfig(num_replicas=0, version="v1")
        await ctl.apply({f"b{i}": (zero, RC) for i in range(4 * TURN_EVERY)})
        await trio.testing.wait_all_tasks_blocked()
    turns = 0

    async def other_task() -> None:
        nonlocal turns
        while True:
            turns += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_task)
        await trio.lowlevel.checkpoint()  # it has begun (it never blocks: no waiting for that)
        before = turns
        view = await store_view(store.data, [])
        during = turns - before
        nursery.cancel_scope.cancel()
    assert len(view.status().backends) == 4 * TURN_EVERY
    assert during >= 4  # at least a turn for each TURN_EVERY backends restored


async def test_a_view_of_a_damaged_store_is_refused() -> None:
    with pytest.raises(controller.CheckpointError):
        await store_view({"spec/a": "{not json"}, [])


def test_a_claim_goes_above_what_the_replicas_saw_and_stops_at_the_limit() -> None:
    # A store put back from a backup holds epoch 3; the replicas were commanded by 9 since.
    assert claimed(lease(3), holder="b", duration_s=2, pid=1, wall=0, floor=9).epoch == 10
    assert claimed(lease(3), holder="b", duration_s=2, pid=1, wall=0, floor=1).epoch == 4
    with pytest.raises(controller.StoreError, match="past the limit"):
        claimed(lease(MAX_COUNT - 1), holder="b", duration_s=2, pid=1, wall=0)
    with pytest.raises(controller.StoreError, match="at its limit"):
        Lease.from_json(lease(MAX_COUNT).to_json())


async def test_a_leader_refused_by_a_replica_claims_above_the_replica_s_epoch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = controller.MemoryStore()
    a = Leadership(store, "host:/a", TIMING)
    first = await a.campaign()
    with a.leading_scope() as scope:
        # A replica says a newer epoch commanded it than the store holds (a store put back).
        a.fenced(FencedError("drain of replica x", first.epoch, 41))
        await trio.sleep(1)
    assert scope.cancelled_caught
    assert (await a.campaign()).epoch == 42


async def test_a_load_report_to_a_daemon_that_never_answers_fails_in_time() -> None:
    """Found by an outside attack: a report to a stalled leader (a standby's ingress sends its
    load there) timed out into an UnboundLocalError that killed the whole process."""
    async with trio.open_nursery() as nursery:

        async def stalled(stream: trio.SocketStream) -> None:
            await trio.sleep_forever()  # takes the connection, never answers

        listeners = await nursery.start(trio.serve_tcp, stalled, 0)
        port = listeners[0].socket.getsockname()[1]
        source = HTTPSource(f"http://127.0.0.1:{port}", "token")
        report = controller.LoadReport("ingress-1", "a", {}, 0)
        with trio.fail_after(REPORT_TIMEOUT_S + 5):
            with pytest.raises(SourceError, match="not answered within"):
                await source.report([report])
        nursery.cancel_scope.cancel()
