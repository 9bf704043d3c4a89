"""Turns of the loop: what wakes thousands of backends at once is spread over rounds of trio's
scheduler, so the sockets are looked at between them (a prune of 5,000 backends held the
daemon's loop for over a second a round). FakeRuntime and MemoryStore under MockClock."""

from __future__ import annotations

import gc
import time

import pytest
import trio
import trio.testing

import controller
from controller._backend import turns
from controller._backend.loop import Backend
from controller._backend.turns import PER_ROUND, YOUNG_EVERY_S, Turns

from ..conftest import RC, config, opened


class Rounds(trio.abc.Instrument):
    """Counts the rounds of the scheduler: each begins after a look at the sockets."""

    def __init__(self) -> None:
        self.now = 0

    def after_io_wait(self, timeout: float) -> None:
        self.now += 1


async def test_a_turn_lets_so_many_go_on_a_round_in_the_order_they_came() -> None:
    rounds = Rounds()
    trio.lowlevel.add_instrument(rounds)
    turns = Turns(per_round=4)
    went: list[tuple[int, int]] = []

    async def one(i: int) -> None:
        await turns.take()
        went.append((i, rounds.now))

    try:
        async with trio.open_nursery() as nursery:
            for i in range(18):
                nursery.start_soon(one, i)
                # Each comes in a round of its own: the order they ask in is known.
                await trio.testing.wait_all_tasks_blocked()
    finally:
        trio.lowlevel.remove_instrument(rounds)
    assert [i for i, _ in went] == list(range(18))
    per_round = [sum(1 for _, r in went if r == n) for n in {r for _, r in went}]
    assert max(per_round) <= 4


async def test_a_lone_turn_costs_one_checkpoint() -> None:
    turns = Turns(per_round=1)
    with trio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(trio.Cancelled):
            await turns.take()  # a checkpoint: a cancelled caller stops there
    await turns.take()  # and the token went back


async def test_a_prune_of_many_backends_passes_so_many_a_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rounds = Rounds()
    passes: dict[int, int] = {}
    pass_of = Backend._pass

    async def counted(self: Backend) -> bool:
        passes[rounds.now] = passes.get(rounds.now, 0) + 1
        return await pass_of(self)

    n = 6 * PER_ROUND
    async with opened() as ctl:
        applied = await ctl.apply({f"b{i}": (config(num_replicas=0), RC) for i in range(n)})
        for goal in applied.goals.values():
            assert await goal.wait() is controller.GoalOutcome.COMPLETED
        monkeypatch.setattr(Backend, "_pass", counted)
        trio.lowlevel.add_instrument(rounds)
        try:
            pruned = await ctl.apply({}, prune=True)
            for goal in pruned.deleted.values():
                assert await goal.wait() is controller.GoalOutcome.COMPLETED
        finally:
            trio.lowlevel.remove_instrument(rounds)
        assert ctl.status().backends == ()
    # Each backend passed at least twice (the delete, then the forgetting), never all at once.
    assert sum(passes.values()) >= 2 * n
    assert max(passes.values()) <= PER_ROUND


def test_between_turns_the_young_generation_is_collected_at_most_every_50_ms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A prune frees as many old objects as it makes new ones, so the collector's count never
    trips: the young generation grew to 300,000 objects and its collection held the loop for
    200-400 ms (issue 43). Between turns it is collected, on the real clock, and the middle
    generation once ten young collections counted towards it, as the threshold would."""
    now = [1000.0]
    collected: list[int] = []
    counts = [(0, 0, 0)]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    monkeypatch.setattr(gc, "collect", collected.append)
    monkeypatch.setattr(gc, "get_count", lambda: counts[0])
    monkeypatch.setattr(gc, "get_threshold", lambda: (10_000, 10, 100))
    young = turns._Young()
    young.between_turns()
    young.between_turns()  # the same instant: nothing more
    now[0] += YOUNG_EVERY_S / 2
    young.between_turns()
    assert collected == [0]
    now[0] += YOUNG_EVERY_S
    counts[0] = (500, 10, 3)
    young.between_turns()
    assert collected == [0, 1]
