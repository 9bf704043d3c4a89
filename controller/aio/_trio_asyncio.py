"""The controller for asyncio code running under trio-asyncio (``trio_asyncio.run``, or a trio
program inside ``trio_asyncio.open_loop()``).

asyncio's loop is then trio-asyncio's, which runs inside trio: the controller's trio tasks and
the app's asyncio tasks share one trio run and one clock, so ``trio.testing.MockClock`` drives
``asyncio.sleep`` as well. Importing this module imports trio_asyncio.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio_asyncio

from .._policy import RestartPolicy
from .._runtime import Runtime
from .._store import Store
from ._bridge import AioController, host


@asynccontextmanager
async def open_under_trio_asyncio(
    *,
    runtime: Runtime,
    store: Store,
    restart_policy: RestartPolicy | None = None,
) -> AsyncIterator[AioController]:
    """``async with open_under_trio_asyncio(runtime=..., store=...) as ctl:`` from asyncio code
    under a trio-asyncio loop. On exit the controller closes and its trio side has ended."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[AioController] = loop.create_future()
    stop = trio.Event()
    token: list[trio.lowlevel.TrioToken] = []

    def on_ready(facade: AioController) -> None:
        token.append(trio.lowlevel.current_trio_token())
        ready.set_result(facade)

    kwargs: dict[str, Any] = {"runtime": runtime, "store": store, "restart_policy": restart_policy}
    hosting = asyncio.ensure_future(trio_asyncio.trio_as_aio(host)(kwargs, on_ready, stop))
    await asyncio.wait([ready, hosting], return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        ready.cancel()
        hosting.result()  # raises what ended it
        raise RuntimeError("the controller's trio side ended before it opened")
    try:
        yield ready.result()
    finally:
        if not hosting.done():
            token[0].run_sync_soon(stop.set)
        await asyncio.shield(hosting)
