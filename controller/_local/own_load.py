"""A replica's own load, as its worker reads it: ``load()`` called every `LOAD_SAMPLE_S` in the
replica's own process, and each new figure handed on (the worker pushes it to the runtime)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .._model.views.load_report import MAX_LOAD_COUNT
from .user_calls import call, describe

#: How often a replica's own ``load()`` is read (in its own process, on its own thread).
LOAD_SAMPLE_S = 0.1
#: How long a ``load()`` may take before the replica counts as saying nothing (until it returns).
LOAD_HUNG_S = 1.0


async def read_load(instance: object, said: Callable[[int | None], Awaitable[None]]) -> None:
    """For a replica with a ``load()`` method: call it every `LOAD_SAMPLE_S`, and hand `said`
    what it returns (requests it holds, a whole number from 0 to `MAX_LOAD_COUNT`); None once
    it raises or returns anything else, or has not returned within `LOAD_HUNG_S`, so that a
    stale figure does not hold the backend where it was. Returns at once without one."""
    try:
        method = getattr(instance, "load", None)
    except Exception as exc:  # a property that raises: said in the log, and no load
        describe(exc)
        return
    if not callable(method):
        return
    # One call at a time, in a task of its own: a call that hangs is waited for (a sync
    # load() runs in a thread, which nothing can stop), but said to say nothing meanwhile.
    sent, samples = trio.open_memory_channel[int | None](0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_sample, method, sent)
        while True:
            count: int | None = None
            with trio.move_on_after(LOAD_HUNG_S):
                count = await samples.receive()
            await said(count)


async def _sample(method: Callable[[], Any], sent: trio.MemorySendChannel[int | None]) -> None:
    complained = False
    while True:
        count: int | None = None
        try:
            value = await call(method)
        except Exception as exc:
            if not complained:
                complained = True
                describe(exc)  # once, in the replica's log
        else:
            # Anything else, a number past the largest too, says nothing (docs/autoscaling.md).
            if (
                isinstance(value, int)
                and not isinstance(value, bool)
                and 0 <= value <= MAX_LOAD_COUNT
            ):
                count = value
        await sent.send(count)
        await trio.sleep(LOAD_SAMPLE_S)
