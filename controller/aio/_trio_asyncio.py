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

import trio_asyncio

from .._model.decisions.policy import RestartPolicy
from .._ports.runtime import Runtime
from .._ports.store import Store
from ._bridge import AioController, Opening, host


@asynccontextmanager
async def open_under_trio_asyncio(
    *,
    runtime: Runtime,
    store: Store,
    restart_policy: RestartPolicy | None = None,
) -> AsyncIterator[AioController]:
    """``async with open_under_trio_asyncio(runtime=..., store=...) as ctl:`` from asyncio code
    under a trio-asyncio loop. On exit the controller closes and its trio side has ended."""
    opening = Opening(runtime, store, restart_policy)
    hosting = asyncio.ensure_future(trio_asyncio.trio_as_aio(host)(*opening.host_args))
    facade = await opening.wait(hosting, hosting.result)
    try:
        yield facade
    finally:
        if not hosting.done():
            opening.request_stop()
        await asyncio.shield(hosting)
