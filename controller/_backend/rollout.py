"""How the rollout of a backend's revision goes: progress and its deadline, how long its newest
replica must stay ready (``min_ready_s``), the outcome (reported to the desk, which marks it in
the revision book, and stored with the replicas), and what a failure does: halt, or ask the
controller to roll back.

The backend's loop feeds it (a new spec, a replica ready) with the time; its pass decides when
the deadline fails it and when it completes (``_model.decisions.pass_plan``), and the loop's
verdicts on failures whether a replica's failure fails it (``judge_failures``). It never
acts on replicas itself: a failed rollout fails the deploy (``FailureReports``), which blocks new
starts ("halt"), and a rollback is a new spec, which only the controller writes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import final

from .._model.decisions.failures import FailureBook, FailureInputs
from .._model.decisions.pass_plan import RolloutState, after_failure
from .._model.decisions.spec import Spec
from .._model.records.records import RolloutRecord
from .._model.records.revisions import Outcome, RevisionBook, RevisionOutcome
from .history import Journal
from .observe import Observer

logger = logging.getLogger("controller")


@final
class Rollout:
    """The rollout of one backend's current revision. `spec` gives the spec the loop works
    toward; `deploy_failed` fails the deploy (and calls back ``failed``); `report` tells the desk
    each outcome (the desk marks the book, which the rollout only reads: what it told last of its
    own revision it keeps, as the desk may mark it a little later). A failed revision to undo is
    left for the executor (``take_roll_back``): the rollout records, it does not act."""

    def __init__(
        self,
        name: str,
        book: RevisionBook,
        journal: Journal,
        *,
        touched: Callable[[], None],
        spec: Callable[[], Spec],
        failures: FailureBook,
        report: Callable[[Outcome], None],
        observer: Observer,
        in_canary: Callable[[], bool] = lambda: False,
    ):
        self.name = name
        self.book = book
        self._journal = journal
        self._touched = touched
        self._spec = spec
        self._failures = failures
        self._report = report
        self._told: Outcome | None = None
        self._observer = observer
        # Whether the revision is in its canary steps (or was aborted in them): a failure
        # there goes back to the stable revision whatever on_failure says.
        self._in_canary = in_canary
        self.revision: int | None = None
        self.active = False
        """Under way: neither complete nor failed."""
        self.last_progress = -math.inf
        """When it began, or a new replica of its revision last became ready (trio time)."""
        self.settled_at = -math.inf
        """When the newest of its replicas has been ready for ``min_ready_s``."""
        self._roll_back_at_start = False
        self._roll_back_due: int | None = None

    # -- a new spec, a restart --

    def begin(self, revision: int | None, now: float) -> None:
        """Roll out `revision` from now on (a new one, or one tried again)."""
        self.revision, self.active = revision, revision is not None
        self.last_progress, self.settled_at = now, -math.inf
        if self._tell(revision, "in_progress"):
            self._touched()

    def _tell(
        self,
        revision: int | None,
        outcome: RevisionOutcome,
        *,
        good: bool | None = None,
        error: str | None = None,
    ) -> Outcome | None:
        """Report `revision`'s `outcome` to the desk (`good` unchanged if None); the outcome
        told, or None if the history has no such revision."""
        kept = self._outcome_of(revision)
        if kept is None or revision is None:
            return None
        told = Outcome(revision, outcome, kept.good if good is None else good, error)
        self._told = told
        self._report(told)
        return told

    def _outcome_of(self, revision: int | None) -> Outcome | None:
        """How `revision`'s rollout went, as this rollout told it last, or as the book has it."""
        if self._told is not None and self._told.revision == revision:
            return self._told
        kept = self.book.get(revision)
        if kept is None:
            return None
        return Outcome(kept.number, kept.outcome, kept.good, kept.error)

    def taken(self, old: Spec, new: Spec, now: float) -> None:
        """The loop took `new` over `old`: a rollout begins if it runs another revision, or
        tries again one that failed."""
        kept = self._outcome_of(new.revision)
        if not new.deleting and (
            old.deleting
            or new.revision != old.revision
            or (kept is not None and kept.outcome == "failed")
        ):
            self.begin(new.revision, now)

    def restore(self, record: RolloutRecord | None, now: float) -> None:
        """After a restart: how the rollout of the spec's revision went, as stored. One under
        way starts its deadline afresh (a restart never makes it fire sooner); one that failed
        with ``on_failure = "rollback"`` and was not rolled back yet is, once the loop runs."""
        spec = self._spec()
        revision = spec.revision
        kept = self._outcome_of(revision)
        if record is not None and record.revision == revision:
            kept = self._tell(revision, record.outcome, good=record.good, error=record.error)
            self.revision, self.active = revision, record.outcome == "in_progress"
            self.last_progress = now
        elif kept is not None and kept.outcome in ("complete", "failed"):
            self.revision, self.active = revision, False
        else:
            self.begin(revision, now)
        self._roll_back_at_start = (
            self._failures.blocked is not None
            and kept is not None
            and kept.outcome == "failed"
            and (spec.backend_config.on_failure == "rollback" or self._in_canary())
            and not spec.deleting
        )

    def started(self) -> None:
        """The loop runs: go on with a rollback the previous controller did not write."""
        revision = self._spec().revision
        if self._roll_back_at_start and revision is not None:
            self._roll_back_due = revision

    def take_roll_back(self) -> int | None:
        """The failed revision to undo now (``after_failure`` said so), once; None if none."""
        due, self._roll_back_due = self._roll_back_due, None
        return due

    # -- what the loop sees --

    def ready(self, now: float) -> None:
        """A replica of the spec's version became ready (or took the spec's config) at `now`:
        progress."""
        if self.active:
            self.last_progress = now
            min_ready = self._spec().backend_config.min_ready_s
            self.settled_at = max(self.settled_at, now + min_ready)

    def progressed(self, now: float) -> None:
        """A canary moved on (a step, or promotion): its deadline counts from now."""
        if self.active:
            self.last_progress = now

    def state(self) -> RolloutState:
        """What a pass decides on (``_model.decisions.pass_plan``)."""
        deadline = self._spec().backend_config.progress_deadline_s
        return RolloutState(self.active, self.revision, self.deadline(deadline), self.settled_at)

    def failure_inputs(self, canary_version: str | None) -> FailureInputs:
        """What the verdicts on replicas' failures decide on (``judge_failures``), with the
        version of a canary being judged, if one is."""
        spec = self._spec()
        return FailureInputs(
            rollout_active=self.active,
            blocked=self._failures.blocked,
            version=spec.version,
            revision=spec.revision,
            min_ready_s=spec.backend_config.min_ready_s,
            threshold=spec.backend_config.health_check_failure_threshold,
            canary_version=canary_version,
            proven=self._failures.proven,
            max_failed_starts=self._failures.policy.max_failed_starts,
            in_place=spec.rollback is not None,
        )

    def deadline(self, progress_deadline_s: float) -> float:
        return self.last_progress + progress_deadline_s if self.active else math.inf

    # -- outcomes --

    def complete(self, count: int) -> None:
        """Every replica runs the revision, and the newest has been ready for ``min_ready_s``
        (the pass decides when): done. It is `good` (an undo may go back to it) if it served
        at full count, one replica or more."""
        self.active = False
        self._tell(self.revision, "complete", good=count > 0)
        self._touched()
        self._journal.event(
            "RolloutComplete", f"revision {self.revision}: complete, {count} serving"
        )
        self._observer.rollout(self.name, "complete")
        logger.info("backend %s: rollout of revision %s complete", self.name, self.revision)

    def failed(self, reason: str) -> str:
        """The deploy failed: if its rollout was under way, it has failed. Returns what
        follows, for the goal's error, the events and the revision's own error."""
        revision = self.revision
        if not self.active or revision is None:
            return ""
        self.active = False
        then = self._then(revision)
        self._tell(revision, "failed", error=f"{reason.rstrip('.')}; {then}")
        self._touched()
        self._observer.rollout(self.name, "failed")
        return then

    def _then(self, revision: int) -> str:
        """What a failed rollout of `revision` does (``after_failure`` decides); a rollback is
        left due, for the executor."""
        on_failure = self._spec().backend_config.on_failure
        then = after_failure(
            self.book, revision, on_failure=on_failure, in_canary=self._in_canary()
        )
        if then.roll_back_to is not None:
            self._roll_back_due = revision
        return then.said

    def record(self) -> RolloutRecord | None:
        """What the store keeps of it, with the replicas."""
        kept = self._outcome_of(self.revision)
        if kept is None:
            return None
        return RolloutRecord(kept.revision, kept.outcome, kept.good, kept.error)
