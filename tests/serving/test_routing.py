"""The ingress's decisions on their own: routes (longest prefix by whole segments), power of two
choices, and each backend's queue (first in, first out, bounded, woken when replicas come or
go). Pure functions get property tests; the queue runs under MockClock."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from controller._routing.table import BackendRoutes, Rejected, RouteInfo
from controller.ingress import RouteTable, choose

_SEGMENT = st.sampled_from(["a", "b", "echo", "v1", "x_y", "~u"])
_PREFIX = st.lists(_SEGMENT, min_size=0, max_size=4).map(lambda parts: "/" + "/".join(parts))


def _reference_match(routes: dict[str, str], path: str) -> str | None:
    """The rule, spelled out slowly: the longest prefix that is the path or an ancestor."""
    best: str | None = None
    for prefix in routes:
        covers = prefix == "/" or path == prefix or path.startswith(prefix + "/")
        if covers and (best is None or len(prefix) > len(best)):
            best = prefix
    return None if best is None else routes[best]


@given(
    routes=st.dictionaries(_PREFIX, st.sampled_from(["p", "q", "r"]), max_size=6),
    path=st.lists(_SEGMENT, max_size=6).map(lambda parts: "/" + "/".join(parts)),
    trailing=st.booleans(),
)
def test_the_longest_prefix_by_whole_segments_wins(
    routes: dict[str, str], path: str, trailing: bool
) -> None:
    table = RouteTable(routes)
    assert table.match(path + ("/" if trailing and path != "/" else "")) == _reference_match(
        routes, path
    )


def test_a_prefix_is_not_a_string_prefix() -> None:
    table = RouteTable({"/echo": "echo", "/": "root"})
    assert table.match("/echo") == "echo"
    assert table.match("/echo/x/y") == "echo"
    assert table.match("/echoes") == "root"
    assert RouteTable({"/echo": "echo"}).match("/echoes") is None


def test_a_route_claimed_twice_goes_to_the_lower_name_everywhere() -> None:
    table, losers = RouteTable.build([("/a", "zed"), ("/a", "alpha"), ("/b", "beta")])
    assert table.routes == {"/a": "alpha", "/b": "beta"}
    assert losers == ["zed"]


@given(
    loads=st.lists(st.integers(0, 10), min_size=0, max_size=12),
    limit=st.integers(1, 10),
    seed=st.integers(0, 2**32),
    excluded=st.sets(st.integers(0, 11), max_size=4),
)
def test_choose_never_picks_a_full_or_excluded_replica_and_waits_only_when_all_are(
    loads: list[int], limit: int, seed: int, excluded: set[int]
) -> None:
    excluded_ = frozenset(i for i in excluded if i < len(loads))
    index = choose(loads, limit, random.Random(seed), excluded_)
    room = [i for i, load in enumerate(loads) if load < limit and i not in excluded_]
    if not room:
        assert index is None
    else:
        assert index in room


@given(loads=st.lists(st.integers(0, 5), min_size=2, max_size=8), seed=st.integers(0, 2**32))
def test_of_two_draws_the_less_loaded_one_is_taken(loads: list[int], seed: int) -> None:
    index = choose(loads, 100, random.Random(seed))
    assert index is not None
    # Never the most loaded replica unless every replica is equally loaded.
    if len(set(loads)) > 1:
        assert loads[index] < max(loads) or loads.count(max(loads)) < len(loads)
        assert not (loads[index] == max(loads) and loads.count(max(loads)) == 1)


def test_a_slow_replica_gets_a_smaller_share() -> None:
    # Replica 0 answers 10x slower: it holds ten times the requests in flight.
    rng = random.Random(1)
    picks = [0, 0, 0, 0]
    for _ in range(10_000):
        loads = [10, 1, 1, 1]
        picks[choose(loads, 100, rng) or 0] += 1
    assert picks[0] == 0  # power of two: the loaded one loses every draw it is in


def test_a_replica_ten_times_slower_is_chosen_only_to_explore() -> None:
    # Nothing in flight anywhere (a light load): the answer times decide.
    rng = random.Random(2)
    picks = [0, 0, 0, 0]
    for _ in range(10_000):
        picks[choose([0, 0, 0, 0], 100, rng, latencies=[0.020, 0.002, 0.002, 0.002]) or 0] += 1
    assert picks[0] < 100  # under 1%: only when a choice goes by load alone (0.5% of them)
    # Once the fast ones hold ten times its load, the slow one is worth it again.
    picks = [0, 0, 0, 0]
    for _ in range(1000):
        picks[choose([0, 12, 12, 12], 100, rng, latencies=[0.020, 0.002, 0.002, 0.002]) or 0] += 1
    assert picks[0] > 400


@given(
    loads=st.lists(st.integers(0, 10), min_size=2, max_size=12),
    latencies=st.lists(st.floats(0, 1), min_size=12, max_size=12),
    limit=st.integers(1, 10),
    seed=st.integers(0, 2**32),
)
def test_weighted_choice_never_picks_a_full_replica(
    loads: list[int], latencies: list[float], limit: int, seed: int
) -> None:
    index = choose(loads, limit, random.Random(seed), latencies=latencies[: len(loads)])
    if all(load >= limit for load in loads):
        assert index is None
    else:
        assert index is not None
        assert loads[index] < limit


def _info(replicas: list[str], *, ongoing: int = 1, queued: int = 2) -> RouteInfo:
    return RouteInfo(
        name="b",
        snapshot_id=1,
        exists=True,
        deleting=False,
        route_prefix="/b",
        max_ongoing_requests=ongoing,
        max_queued_requests=queued,
        replicas=tuple((tag, f"127.0.0.1:{i + 1000}") for i, tag in enumerate(replicas)),
    )


def _backend() -> tuple[BackendRoutes, list[str]]:
    changes: list[str] = []
    backend = BackendRoutes("b", random.Random(0), lambda b: changes.append(b.name))
    return backend, changes


async def test_the_queue_is_first_in_first_out_and_bounded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend, _ = _backend()
    backend.update(_info(["r1"], ongoing=1, queued=2))
    first = backend.try_acquire()
    assert first is not None
    assert first.in_flight == 1
    assert backend.try_acquire() is None
    order: list[int] = []

    async def wait(n: int) -> None:
        slot = await backend.acquire()
        order.append(n)
        backend.release(slot)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, 1)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(wait, 2)
        await trio.testing.wait_all_tasks_blocked()
        assert backend.queued == 2
        with pytest.raises(Rejected) as full:
            await backend.acquire()
        assert full.value.cause == "queue_full"
        backend.release(first)
    assert order == [1, 2]
    assert backend.queued == 0
    assert backend.in_flight() == {}


async def test_a_replica_that_leaves_takes_no_more_but_finishes_what_it_has(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend, _ = _backend()
    backend.update(_info(["r1", "r2"], ongoing=5))
    slots = [backend.try_acquire() for _ in range(4)]
    assert all(s is not None for s in slots)
    backend.update(_info(["r2"], ongoing=5))
    leaving = [s for s in slots if s is not None and s.tag == "r1"]
    assert leaving
    assert all(s.gone for s in leaving)
    for _ in range(10):
        taken = backend.try_acquire()
        if taken is None:
            break
        assert taken.tag == "r2"
    assert "r1" in backend.in_flight()  # counted until its requests end
    for slot in leaving:
        backend.release(slot)
    assert "r1" not in backend.in_flight()


async def test_waiters_hear_at_once_when_no_replica_is_left(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend, _ = _backend()
    backend.update(_info(["r1"], ongoing=1, queued=5))
    assert backend.try_acquire() is not None
    with trio.fail_after(1):
        async with trio.open_nursery() as nursery:

            async def waiter() -> None:
                with pytest.raises(Rejected) as gone:
                    await backend.acquire()
                assert gone.value.cause == "no_replicas"

            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            backend.update(_info([]))
    assert backend.queued == 0


async def test_a_waiter_that_gives_up_leaves_the_queue_and_any_replica_handed_to_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend, _ = _backend()
    backend.update(_info(["r1"], ongoing=1, queued=5))
    held = backend.try_acquire()
    assert held is not None
    with trio.move_on_after(1):
        await backend.acquire()
    assert backend.queued == 0
    assert backend.in_flight() == {"r1": 1}
    backend.release(held)
    assert backend.in_flight() == {}


async def test_a_new_replica_takes_the_queue_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend, changes = _backend()
    backend.update(_info(["r1"], ongoing=1, queued=5))
    assert backend.try_acquire() is not None
    got: list[str] = []
    async with trio.open_nursery() as nursery:

        async def waiter() -> None:
            got.append((await backend.acquire()).tag)

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        backend.update(_info(["r1", "r2"], ongoing=1, queued=5))
    assert got == ["r2"]
    assert changes  # every change of load was told


def test_before_any_answer_the_load_decides() -> None:
    rng = random.Random(3)
    for _ in range(200):
        assert choose([5, 0], 100, rng, latencies=[0.0, 0.0]) == 1


def test_an_access_line_in_json_logs_has_its_fields_as_keys() -> None:
    import json
    import logging

    from controller._daemon.log_format import JSONFormatter

    record = logging.LogRecord("controller.ingress.access", logging.INFO, "", 0, "GET /x", (), None)
    record.fields = {"method": "GET", "status": 200, "duration_ms": 1.5}
    entry = json.loads(JSONFormatter().format(record))
    assert entry["message"] == "GET /x"
    assert (entry["method"], entry["status"], entry["duration_ms"]) == ("GET", 200, 1.5)


def test_a_human_log_line_escapes_what_it_quotes() -> None:
    import logging

    from controller._daemon.log_format import formatter

    # A replica's error quoted in a log line: no terminal control, no second (forged) line.
    error = "boom\n2026-01-01 00:00:00,000 ERROR   forged\x1b[2J \u202eevil"
    record = logging.LogRecord(
        "controller", logging.ERROR, "", 0, "start failed: %s", (error,), None
    )
    line = formatter("human").format(record)
    assert "\n" not in line
    assert line.endswith(
        r"start failed: boom\n2026-01-01 00:00:00,000 ERROR   forged\x1b[2J \u202eevil"
    )


def test_locality_keeps_requests_on_the_node_until_its_replicas_are_full() -> None:
    """With ``prefer_host``, the replicas at the ingress's host take every request while one
    of the two drawn there has room (power of two choices among them); beyond, the choice
    widens to all, so a full node spills over rather than queueing."""
    routes = BackendRoutes("b", random.Random(7), lambda _: None, local_host="10.0.0.1")
    replicas = [("near1", "10.0.0.1:1"), ("near2", "10.0.0.1:2")]
    replicas += [("far1", "10.0.0.2:1"), ("far2", "10.0.0.2:2")]
    routes.update(
        RouteInfo("b", 1, True, False, "/b", 3, 10, tuple(replicas))  # max_ongoing 3
    )
    taken = [routes.try_acquire() for _ in range(6)]
    assert sorted(s.tag for s in taken if s is not None) == ["near1"] * 3 + ["near2"] * 3
    spilled = [routes.try_acquire() for _ in range(6)]
    assert sorted(s.tag for s in spilled if s is not None) == ["far1"] * 3 + ["far2"] * 3
    assert routes.try_acquire() is None  # all full: the request waits
    # Without a preference, the same draws spread over every replica at once.
    plain = BackendRoutes("b", random.Random(7), lambda _: None)
    plain.update(RouteInfo("b", 1, True, False, "/b", 3, 10, tuple(replicas)))
    first = {s.tag for s in (plain.try_acquire() for _ in range(6)) if s is not None}
    assert first & {"far1", "far2"}
