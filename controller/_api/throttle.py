"""Wrong tokens slowed and logged in summary: the trio side of ``failures`` (which decides).

Every path that takes a secret and finds it wrong (a bearer token, the console's login form, a
one-time login link) calls `Throttle.failed`, which holds the answer or refuses it (429), and
logs the address's first failure at once and the rest once a `SUMMARY_S` interval (`run` says
so when an interval ends while no failure comes; the daemon's stop says what is left).
"""

from __future__ import annotations

import logging
import math
from typing import final

import trio

from .failures import FailureTable
from .http import HTTPError, Scope

logger = logging.getLogger("controller.api")


def client_address(scope: Scope) -> str:
    """The peer's address as the socket says (no header is trusted: no proxy is ours)."""
    client = scope.get("client")
    return str(client[0]) if client else "an unknown address"


@final
class Throttle:
    def __init__(self, table: FailureTable | None = None):
        self.table = table if table is not None else FailureTable()
        self._failed = trio.Event()

    async def failed(self, scope: Scope, what: str) -> None:
        """`what` (``the token is wrong``...) was found in the request `scope`: hold its answer
        (then return, for the caller to send its own refusal) or raise the 429 at once."""
        address = client_address(scope)
        verdict = self.table.failed(address, trio.current_time())
        self._failed.set()
        if verdict.first:
            logger.warning(
                "failed login from %s: %s (%s %s); more from it are summed up every %g s",
                address,
                what,
                scope["method"],
                scope["path"],
                self.table.summary_s,
            )
        self._log_due()
        if verdict.refused:
            raise HTTPError(
                429,
                "TooManyFailures",
                f"too many failed logins from {address}: wait {verdict.retry_after_s} s between "
                "tries (each wrong one is answered more slowly, up to "
                f"{self.table.max_delay_s:g} s); the right token is never held up",
                retry_after=verdict.retry_after_s,
            )
        try:
            await trio.sleep(verdict.delay_s)
        finally:
            self.table.released(address)

    async def run(self) -> None:
        """Log each summary as its interval ends, failures or not; when cancelled (the
        daemon stops), what the intervals under way hold."""
        try:
            while True:
                due = self.table.next_due()
                with trio.move_on_at(math.inf if due is None else due):
                    await self._failed.wait()
                    self._failed = trio.Event()
                self._log_due()
        finally:
            for line in self.table.due(trio.current_time(), all_now=True):
                logger.warning("%s", line)

    def _log_due(self) -> None:
        for line in self.table.due(trio.current_time()):
            logger.warning("%s", line)
