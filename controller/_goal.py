"""Goals: what a deploy or delete promises; awaitable until reached, failed or superseded."""

from __future__ import annotations

from typing import Literal, final

import attrs
import trio

from ._errors import GoalFailed
from ._state import GoalOutcome


@final
@attrs.define(eq=False)
class Goal:
    """The promise of one deploy or delete. ``await goal.wait()`` until it resolves.

    A goal resolves exactly once: COMPLETED when the backend reaches the spec, SUPERSEDED when a
    later deploy or delete of the same backend takes over (its waiters are released, not failed),
    or failed, when ``wait`` raises ``GoalFailed`` with the last replica error.
    """

    backend: str
    """The backend the goal is about."""
    generation: int
    """The spec generation it was made for."""
    kind: Literal["deploy", "delete"]
    """What made it."""
    _done: trio.Event = attrs.field(factory=trio.Event, init=False)
    _outcome: GoalOutcome | None = attrs.field(default=None, init=False)
    _error: str | None = attrs.field(default=None, init=False)
    _traceback: str | None = attrs.field(default=None, init=False)

    async def wait(self) -> GoalOutcome:
        """Wait until the goal resolves; return how, or raise ``GoalFailed``."""
        await self._done.wait()
        if self._error is not None:
            # A fresh exception for each waiter: one shared object would pile up tracebacks.
            raise GoalFailed(self.backend, self._error, self._traceback)
        assert self._outcome is not None
        return self._outcome

    @property
    def done(self) -> bool:
        """Whether it has resolved (reached, superseded or failed)."""
        return self._done.is_set()

    @property
    def outcome(self) -> GoalOutcome | None:
        """COMPLETED or SUPERSEDED once resolved that way; None while pending or after a failure."""
        return self._outcome

    @property
    def error(self) -> str | None:
        """Why it failed, if it did."""
        return self._error

    def _resolve(self, outcome: GoalOutcome | None, error: str | None = None) -> None:
        if self._done.is_set():
            return
        self._outcome = outcome
        self._error = error
        self._done.set()

    def complete(self) -> None:
        self._resolve(GoalOutcome.COMPLETED)

    def supersede(self) -> None:
        self._resolve(GoalOutcome.SUPERSEDED)

    def fail(self, reason: str, traceback: str | None = None) -> None:
        if not self._done.is_set():
            self._traceback = traceback
        self._resolve(None, reason)
