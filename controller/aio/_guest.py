"""The controller in trio's guest mode, inside a stock asyncio loop (``asyncio.run``, uvicorn).

Trio runs as a guest of the asyncio loop on its thread: no second thread and no second loop. Only
in a process that never imported trio_asyncio (which replaces asyncio's loop policy).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import outcome
import trio

from .._model.decisions.policy import RestartPolicy
from .._ports.runtime import Runtime
from .._ports.store import Store
from ._bridge import AioController, Opening, host


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
    finished: asyncio.Future[outcome.Outcome[None]] = loop.create_future()
    opening = Opening(runtime, store, restart_policy)
    trio.lowlevel.start_guest_run(
        host,
        *opening.host_args,
        run_sync_soon_threadsafe=loop.call_soon_threadsafe,
        run_sync_soon_not_threadsafe=loop.call_soon,
        done_callback=finished.set_result,
        host_uses_signal_set_wakeup_fd=True,  # asyncio.run owns the wakeup fd
    )
    facade = await opening.wait(finished, lambda: finished.result().unwrap())
    try:
        yield facade
    finally:
        if not finished.done():
            opening.request_stop()
        # Shielded, so that a cancelled caller still waits for trio to finish closing.
        (await asyncio.shield(finished)).unwrap()
