"""Routing by model, as one router decides it (``BackendRoutes``): requests go where their model
is held, a model held nowhere goes to the least loaded replica with room for it (and the
requests for it that follow go there too), a hot model spreads, and the newest word of a
replica wins. Pure decisions, no clock: through real workers in
tests/serving/test_multiplexing_workers.py."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller._http.errors import Reply
from controller._routing.model_routes import MAX_GUESSED
from controller._routing.models import Held, parse_held, requested_model, spreads_at
from controller._routing.table import BackendRoutes, RouteInfo, Slot

LIMIT = 10


def routes(n: int, seed: int = 0) -> BackendRoutes:
    backend = BackendRoutes("m", random.Random(seed), lambda _: None)
    replicas = tuple((f"m#{i}", f"127.0.0.1:{9000 + i}") for i in range(n))
    backend.update(RouteInfo("m", 1, True, False, "/m", LIMIT, 1000, replicas))
    return backend


def say(backend: BackendRoutes, tag: str, generation: int, *models: str, room: int = 4) -> None:
    held = Held(generation, room, frozenset(models))
    backend.heard(backend.by_tag[tag], held.header())


def take(backend: BackendRoutes, model: str) -> Slot:
    slot = backend.try_acquire(model=model)
    assert slot is not None
    return slot


def test_before_any_replica_says_a_model_goes_to_one_replica_which_then_holds_it() -> None:
    backend = routes(4)
    first = take(backend, "a")
    # The first burst for a model does not scatter over every replica (each would load it).
    assert {take(backend, "a").tag for _ in range(spreads_at(LIMIT) - 2)} == {first.tag}
    assert backend.counts["model_load"] == 1
    assert backend.held_models()[first.tag].models == {"a"}


def test_what_a_router_guesses_of_a_replica_that_never_says_stays_bounded() -> None:
    backend = routes(1)
    slot = backend.slots[0]
    for i in range(1000):
        backend.release(take(backend, f"m{i}"))
    assert slot.held is not None
    assert 1 <= len(slot.held.models) <= MAX_GUESSED
    assert sum(len(v) for v in backend.models.holders.values()) == len(slot.held.models)


def test_requests_go_to_the_replicas_holding_their_model() -> None:
    backend = routes(6)
    say(backend, "m#1", 1, "a", "b")
    say(backend, "m#4", 1, "a")
    say(backend, "m#2", 1, "c")
    picked: Counter[str] = Counter()
    for _ in range(200):
        slot = take(backend, "a")
        picked[slot.tag] += 1
        backend.release(slot)
    assert set(picked) == {"m#1", "m#4"}
    assert backend.counts["model_held"] == 200


def test_a_model_held_nowhere_goes_to_the_least_loaded_with_room_and_its_next_requests_follow() -> (
    None
):
    backend = routes(3)
    say(backend, "m#0", 1, "a", "b", room=2)  # full: loading another evicts one
    say(backend, "m#1", 1, "c", room=2)  # room for one more
    say(backend, "m#2", 1, "d", room=2)
    busy = take(backend, "d")  # m#2 now has one in flight
    assert busy.tag == "m#2"
    first = take(backend, "z")
    assert first.tag == "m#1"  # room for a model, and the least loaded of those
    assert backend.counts["model_load"] == 1
    # The router takes it to hold "z" now: the requests that follow go there, not elsewhere.
    assert {take(backend, "z").tag for _ in range(3)} == {"m#1"}


def test_a_hot_model_spreads_once_every_holder_is_busy() -> None:
    backend = routes(4)
    say(backend, "m#0", 1, "hot")
    threshold = spreads_at(LIMIT)
    held = [take(backend, "hot") for _ in range(threshold)]
    assert {s.tag for s in held} == {"m#0"}
    spread = take(backend, "hot")
    assert spread.tag != "m#0"  # every holder at the threshold: another loads it
    # Now two hold it, and the less busy of them takes the next.
    assert take(backend, "hot").tag == spread.tag
    assert sorted(backend.models.holders["hot"]) == sorted([0, spread.index])


def test_a_model_still_loading_does_not_spread_however_busy_its_holder() -> None:
    backend = routes(4)
    first = take(backend, "hot")  # held nowhere: one replica is taken to load it
    # Every request for it waits for that load: no second replica loads it meanwhile (its
    # load would end no sooner, and it would keep a second copy for good).
    assert {take(backend, "hot").tag for _ in range(LIMIT - 2)} == {first.tag}
    assert backend.counts["model_load"] == 1
    # The replica says it is loading it: still none, until it is full.
    backend.heard(first, Held(1, 4, frozenset({"hot"}), frozenset({"hot"})).header())
    assert take(backend, "hot").tag == first.tag
    assert backend.counts["model_load"] == 1
    # Full (max_ongoing_requests in flight): only then does one go elsewhere, and load it.
    spilled = take(backend, "hot")
    assert spilled.tag != first.tag
    assert backend.counts["model_load"] == 2


def test_full_replicas_make_a_model_request_wait_then_it_goes_to_a_holder() -> None:
    backend = routes(2)
    say(backend, "m#0", 1, "a")
    say(backend, "m#1", 1, "b")
    taken = [backend.try_acquire() for _ in range(2 * LIMIT)]
    assert all(taken)
    assert backend.try_acquire(model="a") is None  # no room anywhere: it waits in line
    other = next(s for s in taken if s is not None and s.tag == "m#1")
    backend.release(other)
    # Room on m#1 only: no holder of "a" has room, so m#1 takes it and loads it.
    slot = backend.try_acquire(model="a")
    assert slot is not None
    assert slot.tag == "m#1"


def test_the_newest_word_of_a_replica_wins_whoever_carried_it() -> None:
    backend = routes(2)
    say(backend, "m#0", 5, "a")
    say(backend, "m#0", 4, "b")  # older: an answer that was on its way
    assert backend.held_models()["m#0"].models == {"a"}
    say(backend, "m#0", 6, "b")
    assert backend.held_models()["m#0"].models == {"b"}
    assert take(backend, "b").tag == "m#0"
    assert "a" not in backend.models.holders


def test_a_replica_that_leaves_takes_its_models_out_of_the_choice() -> None:
    backend = routes(3)
    say(backend, "m#2", 1, "a")
    replicas = tuple((f"m#{i}", f"127.0.0.1:{9000 + i}") for i in range(2))
    backend.update(RouteInfo("m", 2, True, False, "/m", LIMIT, 1000, replicas))
    assert "a" not in backend.models.holders
    assert take(backend, "a").tag in {"m#0", "m#1"}


def test_held_headers_are_read_strictly() -> None:
    assert parse_held(b"3 4 a b") == Held(3, 4, frozenset({"a", "b"}))
    held = Held(3, 4, frozenset({"a", "b"}), frozenset({"b"}))
    assert held.header() == b"3 4 a ~b"
    assert parse_held(held.header()) == held
    for bad in (b"", b"x 4 a", b"3 0 a", b"-1 4", b"3 4 a\xff", b"3 4 " + b"x" * 200):
        assert parse_held(bad) is None


@pytest.mark.parametrize("value", [b"", b"a b", b"x" * 129, b"\xc3\xa9"])
def test_a_request_naming_a_bad_model_is_refused_before_routing(value: bytes) -> None:
    with pytest.raises(Reply) as raised:
        requested_model([(b"host", b"x"), (b"x-model-id", value)])
    assert raised.value.status == 400
    assert "x-model-id: must be 1 to 128 characters" in str(raised.value)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["say", "take", "release"]),
            st.integers(0, 4),
            st.sampled_from("abcdefg"),
        ),
        max_size=60,
    )
)
def test_the_holders_index_always_matches_what_each_replica_is_known_to_hold(
    steps: list[tuple[str, int, str]],
) -> None:
    backend = routes(5)
    generation = 0
    taken: list[Slot] = []
    for op, i, model in steps:
        if op == "say":
            generation += 1
            say(backend, f"m#{i}", generation, model, chr(ord(model) + 1))
        elif op == "take":
            slot = backend.try_acquire(model=model)
            if slot is not None:
                taken.append(slot)
        elif taken:
            backend.release(taken.pop(i % len(taken)))
        index = {
            m: sorted(s.index for s in backend.slots if s.held is not None and m in s.held.models)
            for s in backend.slots
            if s.held is not None
            for m in s.held.models
        }
        holders = {m: sorted(ix) for m, ix in backend.models.holders.items()}
        assert holders == index
