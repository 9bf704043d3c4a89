"""An ASGI application that needs asyncio itself (asyncpg, aiohttp, redis.asyncio, or just
``asyncio.sleep``), served on an asyncio loop: trio-asyncio's, which runs inside the worker's
trio loop. The worker's server is trio's and calls this wrapper as any ASGI app; the wrapper
runs the application as an asyncio task on that loop, and its ``receive`` and ``send`` (trio's)
from there. Under it anyio finds asyncio, so FastAPI and Starlette run on asyncio as they do
under uvicorn. The loop is open from the application's lifespan startup to its shutdown.

Importing trio_asyncio changes asyncio for the whole process, which is why a backend asks for
this (``controller.on_asyncio(app)``) and nothing else imports it: it is imported when the
wrapper first serves, in the replica's own process."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, final

import trio

from .asgi import Lifespan

App = Callable[..., Awaitable[None]]


@final
class OnAsyncio:
    """What ``controller.on_asyncio(app)`` returns: `app` served on an asyncio loop."""

    def __init__(self, app: App):
        if not callable(app):
            raise TypeError(f"on_asyncio(app): app must be an ASGI application, not {app!r}")
        self.app = app
        self._loop: Any = None

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if self._loop is None:
            raise RuntimeError(
                "on_asyncio: no asyncio loop is open (it opens at the application's lifespan "
                "startup, which its server runs before it serves)"
            )
        await self._on_loop(scope, receive, send)

    async def _on_loop(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        import trio_asyncio

        loop = self._loop
        await trio_asyncio.aio_as_trio(self.app, loop=loop)(
            scope,
            trio_asyncio.trio_as_aio(receive, loop=loop),
            trio_asyncio.trio_as_aio(send, loop=loop),
        )

    async def _lifespan(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        """The loop's life: opened at the startup, the application's own lifespan run on it
        (or none, if it speaks none), closed at the shutdown."""
        import trio_asyncio

        await receive()  # lifespan.startup
        async with trio_asyncio.open_loop() as loop, trio.open_nursery() as nursery:
            self._loop = loop
            inner = Lifespan(self._on_loop, state=scope.get("state"))
            try:
                await inner.startup(nursery)
            except Exception as exc:
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                nursery.cancel_scope.cancel()
                return
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
            await inner.shutdown()
            nursery.cancel_scope.cancel()
        self._loop = None
        await send({"type": "lifespan.shutdown.complete"})


def on_asyncio(app: App) -> OnAsyncio:
    """Serve ASGI `app` on an asyncio loop, for code that needs asyncio itself: ``app =
    controller.on_asyncio(FastAPI())``, or wrap an app made elsewhere. Needs trio-asyncio
    (``pip install trio-replica-controller[aio]``)."""
    return OnAsyncio(app)
