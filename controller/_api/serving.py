"""What a daemon's API and ingress serve from: the controller while the daemon leads, a view of
the store while it stands by. Each switch starts a new watch epoch, so that watchers take a
complete list from what serves now."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, final

import trio

from .._model.values.errors import ControllerClosedError
from .._model.views.status import BackendSnapshot
from .views import iso

T = TypeVar("T")

if TYPE_CHECKING:
    from .._core.controller import Controller
    from .._leadership.keeper import Leadership
    from .._model.decisions.lease import Lease


@final
class Serving:
    """The daemon's current source of answers. `leadership` (None: a daemon that always leads,
    or a test's fixed controller) says who leads, for redirects and status."""

    def __init__(self, leadership: Leadership | None = None):
        self.ctl: Controller | None = None
        self.epoch = ""
        self.leading = False
        self.leadership = leadership
        self._switched = trio.Event()

    @classmethod
    def fixed(cls, ctl: Controller | None, epoch: str) -> Serving:
        """One controller for good, which leads (an embedding, or a test)."""
        serving = cls()
        serving.ctl, serving.epoch, serving.leading = ctl, epoch, True
        return serving

    def switch(self, ctl: Controller, *, leading: bool) -> None:
        """Serve from `ctl` from now on."""
        self.ctl, self.leading = ctl, leading
        self.epoch = secrets.token_hex(8)
        self._switched.set()
        self._switched = trio.Event()

    def stop_leading(self) -> None:
        """The controller closed: take no more changes until the next switch (a standby's
        view, or leading again)."""
        self.leading = False

    async def wait_switched(self) -> None:
        await self._switched.wait()

    def leader_url(self) -> str | None:
        """Where the leader's API is, as its lease says (None: none leads, or it is us)."""
        live = self._live_lease()
        return None if live is None or self.leading else live.address

    def _live_lease(self) -> Lease | None:
        """The lease as last seen, if someone holds it: not released, and not this daemon's
        own while it does not lead (then it has lapsed)."""
        if self.leadership is None:
            return None
        seen = self.leadership.seen
        if seen is None or seen.released:
            return None
        if not self.leading and seen.holder == self.leadership.holder:
            return None
        return seen

    def leadership_json(self) -> dict[str, Any] | None:
        """Who leads, for ``GET /api/v1/backends`` (None: no leadership, one controller)."""
        if self.leadership is None:
            return None
        seen, live = self.leadership.seen, self._live_lease()
        return {
            "role": "leader" if self.leading else "standby",
            "holder": self.leadership.holder,
            "epoch": seen.epoch if seen is not None else 0,
            "leader": live.holder if live is not None else None,
            "address": live.address if live is not None else None,
            "pid": live.pid if live is not None else None,
            "since": iso(live.acquired_at) if live is not None else None,
            "renewed": iso(live.renewed_at) if live is not None else None,
        }

    async def changes_since(
        self, ctl: Controller, snapshot_id: int
    ) -> list[BackendSnapshot] | None:
        """`ctl`'s changes after `snapshot_id`, or None once the daemon serves from another
        (the watcher's next call, with the old epoch, then gets everything from the new one)."""
        if ctl.watch_cursor > snapshot_id:
            # Newer ones are there already: taken at once, even under a zero timeout (a
            # complete list must never come back empty for want of a wait).
            try:
                return await ctl.changes_since(snapshot_id)
            except ControllerClosedError:
                return None
        return await self._unless_switched(partial(ctl.changes_since, snapshot_id))

    async def wait_changed(self, ctl: Controller, passes: int) -> None:
        """Wait until `ctl` has made a pass after its `passes`th, or the daemon serves from
        another (a new epoch: everything may differ)."""
        if ctl.passes > passes:
            return

        async def passed() -> bool:
            await ctl.wait_until(lambda c: c.passes > passes)
            return True

        await self._unless_switched(passed)

    async def _unless_switched(self, wait: Callable[[], Awaitable[T]]) -> T | None:
        """What `wait` returns, or None if the daemon switches first. A controller that
        closes meanwhile has stopped leading: the switch comes next, and ends the wait."""
        found: T | None = None
        switched = self._switched
        async with trio.open_nursery() as nursery:

            async def waiting() -> None:
                nonlocal found
                try:
                    found = await wait()
                except ControllerClosedError:
                    return
                nursery.cancel_scope.cancel()

            async def switch() -> None:
                await switched.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(waiting)
            nursery.start_soon(switch)
        return found
