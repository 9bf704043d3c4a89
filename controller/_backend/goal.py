"""Goals: what a deploy or delete promises; awaitable until reached, failed or superseded."""

from __future__ import annotations

from typing import Literal, final

import attrs
import trio

from .._model.values.errors import ControllerClosedError, GoalFailed
from .._model.views.status import GoalOutcome


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
    _closed: bool = attrs.field(default=False, init=False)

    async def wait(self) -> GoalOutcome:
        """Wait until the goal resolves; return how, or raise ``GoalFailed`` (or
        ``ControllerClosedError`` if the controller closed before it resolved)."""
        await self._done.wait()
        if self._closed:
            raise ControllerClosedError(
                f"the controller closed before the goal of backend {self.backend!r} "
                f"(generation {self.generation}) was reached; a reopened controller goes on"
            )
        exception = self.exception
        if exception is not None:
            raise exception
        assert self._outcome is not None
        return self._outcome

    @property
    def done(self) -> bool:
        """Whether it has resolved (reached, superseded or failed)."""
        return self._done.is_set()

    @property
    def outcome(self) -> GoalOutcome | None:
        """How it resolved (COMPLETED, SUPERSEDED or FAILED); None while pending or if the
        controller closed first."""
        return self._outcome

    @property
    def error(self) -> str | None:
        """Why it failed, if it did."""
        return self._error

    @property
    def exception(self) -> GoalFailed | None:
        """The failure as the exception ``wait`` raises (a fresh one at each access: one shared
        object would pile up tracebacks), or None."""
        if self._error is None:
            return None
        return GoalFailed(self.backend, self._error, self._traceback)

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
        self._resolve(GoalOutcome.FAILED, reason)

    def close(self) -> None:
        """The controller closed: waiters are released with ``ControllerClosedError``."""
        if not self._done.is_set():
            self._closed = True
            self._done.set()
