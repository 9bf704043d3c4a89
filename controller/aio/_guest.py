"""The controller in trio's guest mode, inside a stock asyncio loop (``asyncio.run``, uvicorn).

Trio runs as a guest of the asyncio loop on its thread: no second thread and no second loop. Only
in a process that never imported trio_asyncio (which replaces asyncio's loop policy).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import outcome
import trio

from .._policy import RestartPolicy
from .._runtime import Runtime
from .._store import Store
from ._bridge import AioController, host


@asynccontextmanager
async def open_in_guest_mode(
    *,
    runtime: Runtime,
    store: Store,
    restart_policy: RestartPolicy | None = None,
) -> AsyncIterator[AioController]:
    """``async with open_in_guest_mode(runtime=..., store=...) as ctl:`` from asyncio code.

    Starts a trio guest run on the running asyncio loop, opens the controller in it, and on exit
    closes the controller and waits until the guest run has ended: no task is left behind.
    Replicas keep running, as after any controller close.
    """
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[AioController] = loop.create_future()
    finished: asyncio.Future[outcome.Outcome[None]] = loop.create_future()
    stop = trio.Event()
    token: list[trio.lowlevel.TrioToken] = []

    def on_ready(facade: AioController) -> None:
        token.append(trio.lowlevel.current_trio_token())
        ready.set_result(facade)

    kwargs: dict[str, Any] = {"runtime": runtime, "store": store, "restart_policy": restart_policy}
    trio.lowlevel.start_guest_run(
        host,
        kwargs,
        on_ready,
        stop,
        run_sync_soon_threadsafe=loop.call_soon_threadsafe,
        run_sync_soon_not_threadsafe=loop.call_soon,
        done_callback=finished.set_result,
        host_uses_signal_set_wakeup_fd=True,  # asyncio.run owns the wakeup fd
    )
    # Opening fails before it is ready (a store it cannot read): the run ends with that error.
    either: list[asyncio.Future[Any]] = [ready, finished]
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        ready.cancel()
        finished.result().unwrap()
        raise RuntimeError("the controller's trio run ended before it opened")
    try:
        yield ready.result()
    finally:
        if not finished.done():
            token[0].run_sync_soon(stop.set)
        # Shielded, so that a cancelled caller still waits for trio to finish closing.
        (await asyncio.shield(finished)).unwrap()
