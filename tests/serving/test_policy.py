"""A backend's request policies on their own: the config blocks' rules, rendezvous hashing with
bounded load, the retry budget, token buckets. Pure decisions get property tests; what reads
the clock runs under MockClock, at exact virtual times. Through a real ingress and real
replicas: tests/ingress/test_policy_ingress.py."""

from __future__ import annotations

import math
import random

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import controller
from controller._http.errors import Reply
from controller._http.framing import RequestHead
from controller._model.config.policies import RetryPolicy
from controller._model.values.fields import fields_of
from controller._routing.policy import Buckets, Ring, bounded, choose_by_key, session_key
from controller._routing.table import BackendRoutes, RouteInfo, Slot
from controller.ingress._policies import admit

KEYS = [b"user-%d" % i for i in range(20_000)]


def tags(n: int, salt: str = "") -> list[str]:
    return [f"api#{salt}{i:04x}" for i in range(n)]


# -- the config blocks --


@pytest.mark.parametrize(
    ("fields", "field", "rule"),
    [
        ({"affinity": {}}, "BackendConfig.affinity.header", "a header or a cookie must be given"),
        ({"affinity": {"header": "Content-Length"}}, "BackendConfig.affinity.header", "frames"),
        ({"affinity": {"cookie": "a b"}}, "BackendConfig.affinity.cookie", "cookie name"),
        ({"affinity": {"header": "x", "load_factor": 0.5}}, "affinity.load_factor", "from 1"),
        ({"affinity": {"header": "x", "ring": 1}}, "BackendConfig.affinity.ring", "unknown"),
        ({"retries": {"max_retries": 11}}, "BackendConfig.retries.max_retries", "0 to 10"),
        ({"retries": {"budget_percent": 101}}, "retries.budget_percent", "from 0 to 100"),
        ({"retries": {"min_retry_concurrency": -1}}, "min_retry_concurrency", "whole number"),
        ({"retries": 3}, "BackendConfig.retries", "mapping of field names"),
        ({"rate_limit": {}}, "BackendConfig.rate_limit.requests_per_s", "is required"),
        ({"rate_limit": {"requests_per_s": 0}}, "rate_limit.requests_per_s", "above 0"),
        ({"rate_limit": {"requests_per_s": 1, "burst": 0}}, "rate_limit.burst", "1 to"),
        ({"rate_limit": {"requests_per_s": 1, "header": "Host\n"}}, "rate_limit.header", "name"),
        ({"affinity": {"header": "X-Controller-Side"}}, "affinity.header", "sets itself"),
        ({"rate_limit": {"requests_per_s": 1, "header": "x-request-timeout-ms"}}, "header", "sets"),
    ],
)
def test_a_wrong_policy_is_refused_naming_its_field_and_rule(
    fields: dict[str, object], field: str, rule: str
) -> None:
    with pytest.raises(controller.ConfigError) as raised:
        controller.BackendConfig(**fields)
    assert field in raised.value.field
    assert rule in str(raised.value)


def test_the_policies_defaults_and_their_json_round_trip() -> None:
    config = controller.BackendConfig()
    assert config.retries == RetryPolicy(max_retries=3, budget_percent=20, min_retry_concurrency=3)
    assert config.affinity is None
    assert config.rate_limit is None
    given = controller.BackendConfig.from_dict(
        {
            "affinity": {"cookie": "session", "header": "X-User"},
            "rate_limit": {"requests_per_s": 2.5, "header": "X-Api-Key"},
            "retries": {"max_retries": 0},
        }
    )
    assert given.affinity is not None
    assert given.affinity.header == "x-user"  # header names in lower case, as read
    assert given.rate_limit is not None
    assert given.rate_limit.capacity == 3  # a second's worth, rounded up
    assert controller.BackendConfig.from_dict(fields_of(given)) == given


# -- rendezvous hashing with bounded load --


@pytest.mark.parametrize("n", range(1, 11))
def test_an_added_replica_takes_at_most_one_nth_of_the_keys_and_only_for_itself(n: int) -> None:
    before, after = Ring(tags(n)), Ring([*tags(n), "api#new"])
    moved = [key for key in KEYS if before.owner(key) != after.owner(key)]
    assert len(moved) <= len(KEYS) / n
    assert len(moved) >= len(KEYS) / (n + 1) / 2  # it does take its share
    assert {after.owner(key) for key in moved} == {n}  # every moved key went to the new one


@settings(deadline=None)  # a busy machine's milliseconds are not the property
@given(n=st.integers(2, 12), gone=st.integers(0, 11), salt=st.text("abc", max_size=3))
def test_a_replica_that_leaves_gives_away_only_its_own_keys(n: int, gone: int, salt: str) -> None:
    gone %= n
    names = tags(n, salt)
    before = Ring(names)
    after = Ring([t for i, t in enumerate(names) if i != gone])
    keys = KEYS[:2000]
    for key in keys:
        owner = before.owner(key)
        assert owner is not None
        if owner != gone:
            # The same replica, at its index in the shorter list.
            assert after.owner(key) == owner - (owner > gone)


def test_keys_spread_evenly() -> None:
    ring = Ring(tags(8))
    shares = [0] * 8
    for key in KEYS:
        owner = ring.owner(key)
        assert owner is not None
        shares[owner] += 1
    assert max(shares) < 1.1 * len(KEYS) / 8
    assert min(shares) > 0.9 * len(KEYS) / 8


@settings(deadline=None)
@given(
    n=st.integers(1, 8),
    factor=st.sampled_from([1.0, 1.25, 2.0]),
    events=st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=200),
)
def test_no_replica_takes_a_keyed_request_past_the_bound(
    n: int, factor: float, events: list[tuple[int, bool]]
) -> None:
    """A few hot keys, requests arriving and ending at random: every keyed request goes to a
    replica under the bound (its owner's if it is), and waits only if all are at the limit."""
    ring, limit = Ring(tags(n)), 10
    loads = [0] * n
    for key, arrives in events:
        if not arrives:
            busy = [i for i, load in enumerate(loads) if load]
            if busy:
                loads[random.Random(key).choice(busy)] -= 1
            continue
        bound = min(bounded(loads, factor), limit)
        index, owner = choose_by_key(ring, b"hot-%d" % key, loads, limit, factor)
        if index is None:
            assert all(load >= bound for load in loads)
            continue
        assert loads[index] < bound
        assert owner == (index == ring.owner(b"hot-%d" % key))
        if loads[ring.owner(b"hot-%d" % key) or 0] < bound:
            assert owner  # the owner, whenever it has room
        loads[index] += 1


def test_one_hot_key_spills_to_its_next_replicas_not_all_onto_one() -> None:
    ring = Ring(tags(4))
    loads = [0] * 4
    for _ in range(100):
        index, _ = choose_by_key(ring, b"celebrity", loads, 1000, 1.25)
        assert index is not None
        loads[index] += 1
    assert max(loads) <= math.ceil(1.25 * 100 / 4)
    assert loads[ring.owner(b"celebrity") or 0] == max(loads)


def test_a_request_s_key_is_its_header_else_its_cookie() -> None:
    policy = controller.BackendConfig(affinity={"header": "X-User", "cookie": "sid"}).affinity
    assert session_key(policy, [(b"x-user", b"ann"), (b"cookie", b"sid=7")]) == b"ann"
    assert session_key(policy, [(b"cookie", b'a=1; sid="7"')]) == b"7"
    assert session_key(policy, [(b"x-user", b"")]) is None
    assert session_key(None, [(b"x-user", b"ann")]) is None


# -- the router's table: affinity, the retry budget --


def routes(n: int, **fields: object) -> BackendRoutes:
    backend = BackendRoutes("api", random.Random(0), lambda _: None)
    info = RouteInfo(
        "api",
        1,
        True,
        False,
        "/api",
        fields.pop("max_ongoing", 100),  # type: ignore[arg-type]
        1000,
        tuple((tag, f"127.0.0.1:{9000 + i}") for i, tag in enumerate(tags(n))),
        **fields,  # type: ignore[arg-type]
    )
    backend.update(info)
    return backend


def test_a_key_stays_on_its_replica_while_it_lives_and_has_room() -> None:
    affinity = controller.BackendConfig(affinity={"header": "x-user"}).affinity
    backend = routes(5, affinity=affinity)
    homes = {}
    for key in KEYS[:200]:
        slot = backend.try_acquire(key=key)
        assert slot is not None
        homes[key] = slot.tag
        backend.release(slot)
    for key in KEYS[:200]:
        slot = backend.try_acquire(key=key)
        assert slot is not None
        assert slot.tag == homes[key]
        backend.release(slot)
    assert backend.counts == {"keyed": 400}


@settings(deadline=None)
@given(
    arrivals=st.lists(st.sampled_from(["start", "fail", "end"]), max_size=300),
    percent=st.sampled_from([0.0, 20.0, 50.0]),
    least=st.integers(0, 4),
)
def test_retries_in_flight_never_exceed_the_budget(
    arrivals: list[str], percent: float, least: int
) -> None:
    """Requests start (taking a place), fail and ask to be tried again, or end: retries in
    flight stay within max(least, percent of those under way), checked as each one starts."""
    policy = RetryPolicy(max_retries=10, budget_percent=percent, min_retry_concurrency=least)
    backend = routes(20, retries=policy)
    under_way: list[tuple[Slot, bool]] = []  # (slot, retrying)
    for step in arrivals:
        if step == "start":
            taken = backend.try_acquire()
            if taken is not None:
                under_way.append((taken, False))
        elif under_way and step == "fail":
            slot, retrying = under_way.pop(0)
            why = backend.retry(1, retrying)
            if why is None:
                if not retrying:
                    active = sum(backend.in_flight().values())
                    assert backend.retrying - 1 < max(least, percent * active / 100)
                under_way.append((slot, True))
            else:
                assert "retry budget is spent" in why
                backend.release(slot)
                if retrying:
                    backend.retry_done()
        elif under_way:
            slot, retrying = under_way.pop()
            backend.release(slot)
            if retrying:
                backend.retry_done()
    assert backend.retrying == sum(1 for _, retrying in under_way if retrying)


def test_a_request_is_tried_on_at_most_max_retries_others() -> None:
    backend = routes(6, retries=RetryPolicy(max_retries=2))
    assert backend.retry(1, False) is None
    assert backend.retry(2, True) is None
    assert backend.retry(3, True) == "tried 3 replicas (retries.max_retries=2)"
    backend.retry_done()
    few = routes(2)
    assert few.retry(2, False) == "tried every replica (2)"


# -- token buckets, at exact virtual times --


def test_a_bucket_gives_a_burst_then_one_token_each_period() -> None:
    buckets = Buckets(rate=2.0, capacity=3)
    assert [buckets.take(b"k", 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take(b"k", 0.0) == 0.5  # the next token in half a second
    assert buckets.take(b"k", 0.25) == 0.25
    assert buckets.take(b"k", 0.5) == 0.0
    assert buckets.take(b"other", 0.5) == 0.0  # keys apart
    assert buckets.take(b"k", 10.0) == 0.0  # full again, not more than full
    assert [buckets.take(b"k", 10.0) for _ in range(3)] == [0.0, 0.0, 0.5]


def test_buckets_remember_a_bounded_number_of_keys_least_recent_first_forgotten() -> None:
    buckets = Buckets(rate=1.0, capacity=1, max_keys=100)
    for i in range(10_000):
        buckets.take(b"%d" % i, 0.0)
    assert len(buckets) == 100
    assert buckets.take(b"9999", 0.0) == 1.0  # recent: remembered, empty
    assert buckets.take(b"0", 0.0) == 0.0  # long forgotten: a full bucket again


def head(*headers: tuple[bytes, bytes]) -> RequestHead:
    return RequestHead(b"GET", b"/api", list(headers))


async def test_the_ingress_admits_by_client_or_key_and_says_when_to_come_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limit = controller.BackendConfig(
        rate_limit={"requests_per_s": 0.5, "burst": 2, "header": "x-api-key"}
    ).rate_limit
    backend = routes(1, rate_limit=limit)
    admit(backend, head(), "10.0.0.1")
    admit(backend, head(), "10.0.0.1")
    with pytest.raises(Reply) as refused:
        admit(backend, head(), "10.0.0.1")
    assert (refused.value.status, refused.value.extra["retry_after"]) == (429, 2)
    assert "requests_per_s=0.5 (burst=2) per header x-api-key" in str(refused.value)
    admit(backend, head(), "10.0.0.2")  # another client
    admit(backend, head((b"x-api-key", b"k1")), "10.0.0.1")  # a key is its own
    admit(backend, head((b"x-api-key", b"k1 ")), "10.0.0.1")  # the same key: its last token
    with pytest.raises(Reply):
        admit(backend, head((b"x-api-key", b" k1\t")), "10.0.0.1")
    await trio.sleep(1.5)
    with pytest.raises(Reply) as refused:
        admit(backend, head(), "10.0.0.1")
    assert refused.value.extra["retry_after"] == 1  # 0.5 s to go, rounded up
    await trio.sleep(0.5)
    admit(backend, head(), "10.0.0.1")
    assert backend.counts == {"rate_limited": 3}
    # The block taken away: nothing is refused (or counted) any more.
    backend.update(RouteInfo("api", 2, True, False, "/api", 100, 1000, (), rate_limit=None))
    for _ in range(5):
        admit(backend, head(), "10.0.0.1")
    assert backend.counts == {"rate_limited": 3}


def test_a_manifest_names_every_fault_of_a_policy_block_at_once() -> None:
    from controller._model.config.manifest import parse_manifest

    fields = {
        "entrypoint": "m:C",
        "retries": {"max_retries": 1e9, "budget_percent": 150, "min_retry_concurrency": 0.5},
        "rate_limit": {"burst": 0, "bogus": 1},
        "affinity": {"load_factor": 2},
    }
    with pytest.raises(controller.ManifestError) as raised:
        parse_manifest({"backends": {"a": fields}}, "f.toml")
    problems = "\n".join(raised.value.problems)
    for said in (
        "retries.max_retries: must be a whole number from 0 to 10",
        "retries.budget_percent: must be a number from 0 to 100",
        "retries.min_retry_concurrency: must be a whole number",
        "rate_limit.burst: must be a whole number from 1",
        "rate_limit.bogus: unknown field",
        "affinity.header: a header or a cookie must be given",
    ):
        assert said in problems, (said, problems)
