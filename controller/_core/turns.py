"""Long synchronous passes over a manifest's backends give the loop's other tasks their turn."""

from __future__ import annotations

import trio

#: How many backends a pass handles between two turns of the rest of the loop (each costs up to
#: ~0.5 ms, so a turn comes every few tens of milliseconds).
TURN_EVERY = 64


async def take_turns(done: int) -> None:
    """After every `TURN_EVERY` items of a pass (`done` so far), let the other tasks run: an
    apply of thousands of backends must not hold up a lease renewal or a request for seconds."""
    if done % TURN_EVERY == 0:
        await trio.lowlevel.checkpoint()
