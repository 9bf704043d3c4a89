"""The capacity gate of an autoscaled backend, decided: how far the autoscaler's count may go on
the runtime now, and whether to ask the runtime for room.

A load spike must not start more workers than the machine holds: past the replicas held, the
count grows only on an answer to this very count younger than `RECHECK_ROOM_S` (other backends
take room meanwhile: an older answer, or one for another count, is asked again). Asking is the
executor's act; the answer comes back as an event, taken by ``answered``.
"""

from __future__ import annotations

import math

import attrs

#: How often a backend held below its autoscaler's count by capacity asks the runtime again.
RECHECK_ROOM_S = 1.0


@attrs.frozen
class Gate:
    """What the gate remembers between passes."""

    fits: int | None = None
    """The most replicas that fit, by the last answer (None: not asked yet)."""
    asked: int = 0
    """The count last asked about."""
    asked_at: float = -math.inf
    pending: bool = False
    """A question is on its way: the count is not final until it answers."""
    answered: int = 0
    """The count the last answer was for."""
    short: bool = False
    """The last count fell short of what was wanted, on an answer."""

    @property
    def next_at(self) -> float:
        """When to ask again, while the last answer falls short (an answer on its way wakes the
        loop itself)."""
        return self.asked_at + RECHECK_ROOM_S if self.short else math.inf


def gate_count(gate: Gate, wanted: int, held: int, now: float) -> tuple[int, Gate, int | None]:
    """The count to work toward now for `wanted`, with `held` replicas there already; the gate
    after; and the count to ask the runtime about (None: no question now)."""
    if wanted <= held:
        return wanted, attrs.evolve(gate, short=False), None
    fresh = gate.answered == wanted and now < gate.asked_at + RECHECK_ROOM_S
    if fresh and gate.fits is not None:
        count = max(held, min(wanted, gate.fits))
        return count, attrs.evolve(gate, short=count < wanted), None
    if gate.pending:
        return held, attrs.evolve(gate, short=False), None
    asking = attrs.evolve(gate, pending=True, asked=wanted, asked_at=now, answered=0, short=False)
    return held, asking, wanted


def answered(gate: Gate, wanted: int, room: int) -> Gate:
    """The gate once the runtime said `room` replicas fit, asked about `wanted` (an answer to a
    question since replaced only ends the wait)."""
    if wanted != gate.asked:
        return attrs.evolve(gate, pending=False)
    return attrs.evolve(gate, pending=False, fits=room, answered=wanted)
