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

#: At most this many lines about failed logins an interval (`SUMMARY_S`), the rest counted in
#: one line as it ends: one line per address would let failures from thousands of addresses
#: (all of 127/8 is any local user's) rotate the daemon's log away.
LOG_LINES = 20


def client_address(scope: Scope) -> str:
    """The peer's address as the socket says (no header is trusted: no proxy is ours)."""
    client = scope.get("client")
    return str(client[0]) if client else "an unknown address"


@final
class Throttle:
    def __init__(self, table: FailureTable | None = None):
        self.table = table if table is not None else FailureTable()
        self._failed = trio.Event()
        self._window_end = -math.inf
        """When the interval whose lines are being counted ends."""
        self._logged = 0
        self._left_out = 0

    async def failed(self, scope: Scope, what: str) -> None:
        """`what` (``the token is wrong``...) was found in the request `scope`: hold its answer
        (then return, for the caller to send its own refusal) or raise the 429 at once."""
        address = client_address(scope)
        verdict = self.table.failed(address, trio.current_time())
        self._failed.set()
        if verdict.first:
            self._log(
                f"failed login from {address}: {what} ({scope['method']} {scope['path']}); "
                f"more from it are summed up every {self.table.summary_s:g} s"
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
                deadline = math.inf if due is None else due
                if self._left_out:
                    deadline = min(deadline, self._window_end)
                with trio.move_on_at(deadline):
                    await self._failed.wait()
                    self._failed = trio.Event()
                self._log_due()
                self._roll(trio.current_time())
        finally:
            for line in self.table.due(trio.current_time(), all_now=True):
                self._log(line)
            self._roll(math.inf)

    def _log_due(self) -> None:
        for line in self.table.due(trio.current_time()):
            self._log(line)

    def _log(self, line: str) -> None:
        self._roll(trio.current_time())
        if self._logged < LOG_LINES:
            self._logged += 1
            logger.warning("%s", line)
        else:
            self._left_out += 1

    def _roll(self, now: float) -> None:
        """At the end of an interval: say how many lines it left out, and count afresh."""
        if now < self._window_end:
            return
        if self._left_out:
            logger.warning(
                "%d more lines about failed logins in the last %g s left out (at most %d an "
                "interval are written)",
                self._left_out,
                self.table.summary_s,
                LOG_LINES,
            )
        self._logged = self._left_out = 0
        self._window_end = now + self.table.summary_s
