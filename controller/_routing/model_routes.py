"""One router's knowledge of where a multiplexed backend's models are, and its choice of a
replica for a request that names its model. Each replica's models are what its newest answer
said (or the controller's snapshot, for one not heard from yet), plus this router's guesses:
a replica sent a model it did not hold is taken to load it at once, so that the model's next
requests follow it there. Pure: no trio, no I/O; changed by its router's tasks alone."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Sequence
from typing import Protocol

import attrs

from .choice import choose_near
from .models import Held, parse_held, spreads_at

#: What a replica not heard from yet is taken to have room for.
UNHEARD_CAPACITY = 1 << 30
#: The most models a router guesses a replica holds beyond what it last said (the models it
#: sent it since): past this, it starts again from the one it sends now. (A replica whose code
#: is not multiplexed never says: the guesses are all there is of it.)
MAX_GUESSED = 64
#: The models whose requests a router counts (more are routed, not counted).
MAX_MODEL_COUNTS = 1_000


class Placed(Protocol):
    """A replica as its router keeps it (``table.Slot``): where it is in the list, and what it
    holds."""

    index: int
    held: Held | None


@attrs.define(eq=False)
class ModelRoutes:
    holders: dict[str, list[int]] = attrs.field(factory=dict)
    """The indices of the replicas that hold each model (or are taken to)."""
    requests: dict[str, int] = attrs.field(factory=dict)
    """Requests that named each model (at most `MAX_MODEL_COUNTS` models)."""

    def choose(
        self,
        model: str,
        slots: Sequence[Placed],
        loads: Sequence[int],
        limit: int,
        rng: random.Random,
        skip: frozenset[int],
        allowed: frozenset[int] | None,
    ) -> tuple[int | None, str | None]:
        """The replica for a request naming `model` (an index into `slots`, whose requests in
        flight are `loads`, each at most `limit`; none in `skip`, and only those `allowed` if
        given), and what the choice was (``model_held``, ``model_load``): power of two choices
        among those that hold it, while one of them has fewer than ``spreads_at(limit)`` in
        flight, or one of them still loads it; else (none holds it, or all are that busy) the
        least loaded other with room, preferring one with room for another model (nothing
        evicted), which loads it; else a holder with room; None if all are full."""
        holders = [
            i
            for i in self.holders.get(model, ())
            if i not in skip and (allowed is None or i in allowed)
        ]
        if holders and min(loads[i] for i in holders) < spreads_at(limit):
            pick = choose_near(holders, loads, limit, rng)
            if pick is not None:
                return pick, "model_held"
        # Its holders are busy, but one is loading it still: its requests wait for that load
        # (another replica's would end no sooner, and would hold a second copy for good).
        pending = [i for i in holders if model in _loading(slots[i])]
        if pending:
            pick = choose_near(pending, loads, limit, rng)
            if pick is not None:
                return pick, "model_held"
        other = self._loader_for(
            model, slots, loads, limit, rng, skip | frozenset(holders), allowed
        )
        if other is not None:
            return other, "model_load"
        if holders:
            pick = choose_near(holders, loads, limit, rng)
            return pick, None if pick is None else "model_held"
        return None, None

    def _loader_for(
        self,
        model: str,
        slots: Sequence[Placed],
        loads: Sequence[int],
        limit: int,
        rng: random.Random,
        skip: frozenset[int],
        allowed: frozenset[int] | None,
    ) -> int | None:
        """The least loaded replica with room that is not in `skip` (one with room for another
        model first; of equal load, the one holding fewest), from a random start so that ties
        spread; it is taken to hold `model` from now on (so that the requests for it that follow
        go there too, until it says)."""
        count = len(slots)
        if count == 0:
            return None
        start = int(rng.random() * count)
        best, best_rank = -1, (2, limit, 0)
        for step in range(count):
            i = (start + step) % count
            if i in skip or loads[i] >= limit or (allowed is not None and i not in allowed):
                continue
            held = slots[i].held
            if held is None:
                rank = (0, loads[i], 0)
            else:
                rank = (0 if held.has_room else 1, loads[i], len(held.models))
            if rank < best_rank:
                best, best_rank = i, rank
        if best < 0:
            return None
        slot = slots[best]
        # Not heard from yet: taken to hold this model alone, until its first answer says.
        known = slot.held if slot.held is not None else Held(-1, UNHEARD_CAPACITY, frozenset())
        said = known.capacity if known.generation >= 0 else 0
        if len(known.models) >= said + MAX_GUESSED:
            known = Held(known.generation, known.capacity, frozenset())
        self.set_held(slot, known.with_model(model))
        return best

    def heard(self, slot: Placed, value: bytes) -> None:
        """`slot`'s answer said what it holds (a ``HELD_HEADER`` value): taken if newer than
        what was known."""
        held = parse_held(value)
        if held is None:
            return
        known = slot.held
        if known is not None and known.generation > held.generation:
            return
        if known != held:
            self.set_held(slot, held)

    def set_held(self, slot: Placed, held: Held) -> None:
        before = slot.held.models if slot.held is not None else frozenset()
        slot.held = held
        holders = self.holders
        for model in before - held.models:
            indices = holders.get(model)
            if indices is not None:
                with contextlib.suppress(ValueError):
                    indices.remove(slot.index)
                if not indices:
                    del holders[model]
        for model in held.models - before:
            holders.setdefault(model, []).append(slot.index)

    def index(self, slots: Sequence[Placed]) -> None:
        """The holders anew, from what each of `slots` holds (their indices moved)."""
        holders: dict[str, list[int]] = {}
        for slot in slots:
            if slot.held is not None:
                for model in slot.held.models:
                    holders.setdefault(model, []).append(slot.index)
        self.holders = holders

    def asked(self, model: str) -> None:
        counts = self.requests
        if model in counts or len(counts) < MAX_MODEL_COUNTS:
            counts[model] = counts.get(model, 0) + 1


def _loading(slot: Placed) -> frozenset[str]:
    return frozenset() if slot.held is None else slot.held.loading
