"""Turns on the controller's one loop: work that thousands of tasks must do at once is spread
over many rounds of trio's scheduler, and its sockets (a lease renewal, an API request) are
looked at between rounds."""

from __future__ import annotations

import gc
import time
from collections.abc import Generator
from typing import TypeVar, final

import trio

T = TypeVar("T")

#: How many backends a pass handles between two turns of the rest of the loop (each costs up to
#: ~0.5 ms, so a turn comes every few tens of milliseconds).
TURN_EVERY = 64

#: How many tasks go on after a turn in each round (a backend's pass after a burst of events
#: costs ~0.2 ms at rest, so a round of them stays within a few milliseconds).
PER_ROUND = 32


#: While work goes in turns, the young generation of Python's collector is collected at most
#: this often.
YOUNG_EVERY_S = 0.05


@final
class _Young:
    """Collects the young generation between turns, at most every `YOUNG_EVERY_S`.

    The collector counts allocations less deallocations, so work that frees as many old
    objects as it makes new ones (a prune of 10,000 backends) never reaches the young
    threshold: the young generation grew to 300,000 objects, and its collection, when it came,
    held the loop for 200 to 400 ms. Collected between turns, it holds what 50 ms made, and
    the middle generation what ten such collections kept."""

    def __init__(self) -> None:
        self._last = 0.0

    def between_turns(self) -> None:
        now = time.monotonic()  # not trio's clock: the cost is real whatever the test's clock
        if now - self._last >= YOUNG_EVERY_S:
            self._last = now
            # Every collection of the young generation counts one towards the middle's, which
            # would otherwise come when the threshold next trips, over all that was promoted
            # since (110 collections' survivors: 200 ms). It comes as often as by itself.
            middle = gc.get_count()[1] >= gc.get_threshold()[1]
            gc.collect(1 if middle else 0)


_young = _Young()


async def take_turns(done: int) -> None:
    """After every `TURN_EVERY` items of a pass (`done` so far), let the other tasks run: an
    apply of thousands of backends must not hold up a lease renewal or a request for seconds."""
    if done % TURN_EVERY == 0:
        _young.between_turns()
        await trio.lowlevel.checkpoint()


async def in_turns(steps: Generator[None, None, T]) -> T:
    """Run `steps` (a generator that yields between its steps and returns a result) with a
    turn of the rest of the loop at each step; its result. A thread would do as well on the
    real clock, but under a test's MockClock a thread at work looks like every task asleep,
    and the clock jumps."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: T = done.value
            return result
        _young.between_turns()
        await trio.lowlevel.checkpoint()


@final
class Turns:
    """At most `per_round` of the tasks that `take` a turn go on in each round of the scheduler.

    trio runs every task that is ready, one after the other, before it looks at its sockets
    again. One event can make thousands ready at once: a prune of 5,000 backends hands each its
    delete, and the store write that lands for all of them wakes them all again. Each round of
    5,000 passes held the loop for most of a second, with no request answered and no lease
    renewed. A turn is a token held from one round to the next and given back as its task goes
    on, so the rest wait, in order, for the rounds after. A task that finds a token free pays
    one checkpoint.
    """

    def __init__(self, per_round: int = PER_ROUND):
        self._tokens = trio.Semaphore(per_round)

    async def take(self) -> None:
        """Wait for a turn: what the caller does up to its next checkpoint is that turn."""
        async with self._tokens:
            if self._tokens.statistics().tasks_waiting:
                _young.between_turns()  # thousands at once: the heap churns
