"""What a daemon's API and ingress serve from: the controller while the daemon leads, a view of
the store while it stands by. Each switch starts a new watch epoch, so that watchers take a
complete list from what serves now."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any, final

import trio

from ._errors import ControllerClosedError
from ._state import BackendSnapshot
from ._views import iso

if TYPE_CHECKING:
    from ._controller import Controller
    from ._leadership import Leadership
    from ._lease import Lease


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
        found: list[BackendSnapshot] | None = None
        switched = self._switched
        async with trio.open_nursery() as nursery:

            async def changes() -> None:
                nonlocal found
                try:
                    found = await ctl.changes_since(snapshot_id)
                except ControllerClosedError:
                    return  # it stopped leading: the switch comes next
                nursery.cancel_scope.cancel()

            async def switch() -> None:
                await switched.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(changes)
            nursery.start_soon(switch)
        return found
