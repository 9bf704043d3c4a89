"""What a backend's failures do beyond the bookkeeping: each is told (log, event, metric), each
backs off, and a deploy that has failed fails its goal and is stored, so that a restarted controller
does not try it again. ``_model.decisions.failures`` keeps the pure rules; this applies them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, final

import trio

from .._model.decisions.failures import NO_NEW_START, FailureBook, StartFailure
from .._model.records.records import FailureRecord
from .goal import Goal
from .history import Journal
from .replica_set import ReplicaSet
from .settle import GoalSettler

#: The failures a restart must remember (``Infeasible`` is checked afresh at every start).
Stored = Literal[
    "StartFailures",
    "ReconfigureFailed",
    "ProgressDeadlineExceeded",
    "UnhealthyAfterReady",
    "CanaryAborted",
]


_DEPLOY = ("StartFailures", "ReconfigureFailed")


@final
class FailureReports:
    """One backend's failures, told and acted on. `current` gives the generation and the goal
    the backend works toward now; `rollout_failed` is told of a failed deploy and says what
    follows (halted, or rolling back); `settler` resolves the goal a failed deploy fails."""

    def __init__(
        self,
        book: FailureBook,
        journal: Journal,
        replicas: ReplicaSet,
        current: Callable[[], tuple[int, Goal]],
        settler: GoalSettler,
        rollout_failed: Callable[[str], str] = lambda reason: "",
    ):
        self._settler = settler
        self._book = book
        self._rollout_failed = rollout_failed
        self._journal = journal
        self._replicas = replicas
        self._current = current

    def failure(
        self,
        tag: str,
        kind: str,
        error: str,
        traceback: str | None = None,
        *,
        then: str | None = None,
    ) -> None:
        """A replica failed: back off (the next start waits, longer after each failure in a
        row, so a crash loop never spins) and tell. `then` says what follows, if not a start."""
        backoff = self._book.failed(trio.current_time(), error)
        self._journal.failure(tag, kind, error, then or backoff, traceback)

    def start_failed(self, failure: StartFailure, fails: str | None) -> None:
        """A start failed (counted already): told, backed off, and the deploy failed if `fails`
        says why."""
        tag, error, traceback = failure.tag, failure.error, failure.traceback
        self._journal.start_failed(tag, failure.version, error, traceback)
        self.failure(
            tag, "StartFailed", error, traceback, then=None if fails is None else NO_NEW_START
        )
        if fails is not None:
            self.deploy_failed("StartFailures", fails, traceback)

    def deploy_failed(self, kind: Stored, reason: str, traceback: str | None = None) -> None:
        """DEPLOY_FAILED until the next deploy. Stored with the intent behind what follows (the
        replicas' record), so that a restart does not try it again."""
        generation, goal = self._current()
        self._book.blocked = kind
        # What the rollout does next (halt, or roll back), said with the failure.
        then = self._rollout_failed(reason)
        if then:
            reason = f"{reason.rstrip('.')}; {then}"
        self._replicas.set_failed(FailureRecord(generation, kind, reason))
        self._journal.deploy_failed(reason, kind="DeployFailed" if kind in _DEPLOY else kind)
        # Once stored, and once the replica whose start failed last is gone.
        self._settler.resolve(goal, lambda goal: goal.fail(reason, traceback))

    def infeasible(self, reason: str) -> None:
        """The spec cannot be placed (one stored before the runtime shrank): DEPLOY_FAILED until
        the next deploy, not stored (the next start checks afresh)."""
        self._book.blocked = "Infeasible"
        self._book.error = self._journal.last_error = reason
        self._journal.deploy_failed(reason, kind="Infeasible")
        self._current()[1].fail(reason)

    def restore(self, failed: FailureRecord | None) -> None:
        """Take a failed deploy from the store, if it is the current generation's."""
        generation, goal = self._current()
        if failed is None or failed.generation != generation:
            return
        # Not tried again: the bad version starts no replica, the bad config reaches none.
        self._replicas.failed = failed
        self._book.blocked = failed.reason
        self._book.error = self._journal.last_error = failed.message
        goal.fail(failed.message)
