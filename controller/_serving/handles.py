"""The handles of one process (of one trio run): a router that follows a watch source, started
when a handle is first used and followed until the run ends, and the handles made over it.

Where the routes come from is its host's to say (`configure`): a LocalRuntime worker reads the
daemon's API and the route token it was given (``routes.json`` in its runtime dir: a token that
reads the watch and can change nothing); a Ray actor the same, from its spec; a controller in
this process (embedded, or FakeRuntime's replicas) is read directly."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import final

import trio

from .._routing.exchange import HandleError
from .._routing.handle import Handle
from .._routing.router import Router
from .._routing.sources import WatchSource
from .._routing.upstream import Pool

logger = logging.getLogger("controller.handles")

#: How long a connection to a replica may take before another is tried.
CONNECT_TIMEOUT_S = 5.0


@final
class _Handles:
    def __init__(self, source: WatchSource, prefer_host: str | None):
        self.router = Router(source, "handles", prefer_host=prefer_host)
        self.pool = Pool(CONNECT_TIMEOUT_S)
        self._followed: trio.Event | None = None
        self.scope = trio.CancelScope()
        """The router's: cancelled when what it follows is gone."""

    async def ready(self) -> None:
        """The router follows its source (from the first call on), and has its first
        answer (or has found the source unreachable once)."""
        if self._followed is None:
            self._followed = trio.Event()
            trio.lowlevel.spawn_system_task(self._follow, self._followed)
        await self._followed.wait()

    async def _follow(self, followed: trio.Event) -> None:
        try:
            with self.scope:
                async with trio.open_nursery() as nursery:
                    await nursery.start(self.router.run)
                    followed.set()
        except Exception:  # a bug must not end the run: handles then say the routes are gone
            logger.exception("handles: the router stopped")
        finally:
            followed.set()


_source: trio.lowlevel.RunVar[
    tuple[Callable[[], WatchSource], str | None, object | None] | None
] = trio.lowlevel.RunVar("controller_handles_source", default=None)
_handles: trio.lowlevel.RunVar[_Handles | None] = trio.lowlevel.RunVar(
    "controller_handles", default=None
)


def configure(
    source: Callable[[], WatchSource],
    *,
    prefer_host: str | None = None,
    replace: bool = True,
    owner: object | None = None,
) -> None:
    """Where this run's handles learn the routes (`source`, made when first needed), and the
    host whose replicas they try first. Without `replace`, a source configured already stays.
    `owner` (a controller in this run) may `forget` it when it closes."""
    if _source.get() is not None and not replace:
        return
    forget(None)
    _source.set((source, prefer_host, owner))


def forget(owner: object | None) -> None:
    """The routes `owner` configured (any, with None) are gone (a controller closed): the
    handles made of them stop following, and the next handle asks `configure` again."""
    configured = _source.get()
    if configured is None or (owner is not None and configured[2] is not owner):
        return
    _source.set(None)
    handles = _handles.get()
    if handles is not None:
        handles.scope.cancel()
        handles.pool.close_all()  # (those under way close with their calls)
        _handles.set(None)


def handle(name: str) -> Handle:
    """A handle to backend `name`. ``HandleError`` (``NoRoutes``) where nothing configured
    the routes (a LocalRuntime of your own, with no daemon)."""
    handles = _handles.get()
    if handles is None:
        configured = _source.get()
        if configured is None:
            raise HandleError(
                name,
                "NoRoutes",
                "this process has no routes to follow: handles work inside replicas a daemon "
                "(`controller run`) started, and beside a controller in the same process",
            )
        make, prefer_host, _ = configured
        handles = _Handles(make(), prefer_host)
        _handles.set(handles)
    return Handle(name, handles.router, handles.pool, handles.ready)
