"""A backend's canary release, as its loop runs it: which step it is at, the step's clock, the
numbers the ingresses report for each revision, and the moves the gates decide. Every move is
decided by ``_model.decisions.canary_steps.look``, a pure function of the step's clock, its
numbers and what the pass sees (``sight``), which the loop asks at each pass; this records what
it decided (``looked``). The loop is its only writer: it follows the spec, looks at each pass,
and acts on a move (an abort fails the deploy, which rolls back to the stable revision). The
ingresses' reports reach it through the loop's channel (``LoadReported``) and only add to the
step's numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Literal, final

import attrs
import trio

from .._clock import wall_now, wall_offset
from .._model.config.canary import CanaryConfig, canary_count
from .._model.decisions.canary_plan import CanarySplit
from .._model.decisions.canary_steps import (
    CanaryLook,
    CanarySight,
    CanaryStatus,
    RevisionNumbers,
    StepClock,
    describe_gates,
)
from .._model.decisions.spec import Spec
from .._model.decisions.verdict import RequestTally, judge
from .._model.records.records import CanaryRecord, RolloutRecord
from .._model.records.revisions import Revision, RevisionBook
from .._model.values.json_values import digest
from .._model.views.status import TrafficSplit
from .history import Journal

Phase = Literal["off", "judging", "promoted", "aborted"]


@final
class Canary:
    """The canary release of a backend's current revision, if it is one."""

    def __init__(
        self,
        book: RevisionBook,
        journal: Journal,
        *,
        touched: Callable[[], None],
        published: Callable[[], None],
        fail: Callable[[str], None],
        progressed: Callable[[float], None],
        promoted: Callable[[], None] = lambda: None,
        phase_of: Callable[[str], str] = lambda name: "off",
    ):
        # `fail` fails the deploy (CanaryAborted: the rollback follows), `progressed` restarts
        # the rollout's progress deadline; `published` asks for a new watch snapshot.
        self._fail = fail
        self._progressed = progressed
        self._promoted = promoted
        # Another backend's canary phase (read only): a canary that follows it is judged by it.
        self._phase_of = phase_of
        self._book = book
        self._journal = journal
        self._touched = touched
        self._published = published
        self.revision: int | None = None
        self.phase: Phase = "off"
        self.stable: Revision | None = None
        self.version = ""
        self.clock = StepClock()
        self.numbers = {"canary": RequestTally(), "stable": RequestTally()}
        self._config: CanaryConfig | None = None
        self._lost: str | None = None
        self._due = math.inf
        """When the step's pause ends (trio time; inf while held or not started)."""

    # -- following the spec --

    def follow(self, spec: Spec) -> None:
        """At each pass: the spec's revision is the one followed. A revision rolled out as a
        canary starts at its first step; a canary that failed and is tried again, too."""
        if spec.deleting:
            self.revision, self.phase, self.stable = spec.revision, "off", None
            return
        if spec.revision == self.revision and self.phase != "aborted":
            return  # (every pass asks: the common case reads no revision)
        kept = self._book.get(spec.revision)
        again = self.phase == "aborted" and kept is not None and kept.outcome == "in_progress"
        if spec.revision == self.revision and not again:
            return
        self.revision, self.version = spec.revision, spec.version
        self.phase, self.stable = "off", None
        stable = None if kept is None or kept.canary_of is None else self._book.get(kept.canary_of)
        if kept is None or stable is None or kept.outcome != "in_progress":
            return
        self.phase, self.stable = "judging", stable
        self._start()

    def restore(self, record: CanaryRecord | None, spec: Spec, now: float) -> None:
        """After a restart: the step and its clock as a previous controller stored them (by the
        wall clock: the time no controller ran counts, but for a hold under way); the step's
        numbers are what the ingresses report from now on (they were never stored)."""
        self.follow(spec)
        kept = self._book.get(spec.revision)
        stable = None if kept is None else self._book.get(kept.canary_of)
        if record is None or stable is None or spec.deleting:
            return
        self.revision, self.version, self.stable = spec.revision, spec.version, stable
        config = spec.backend_config.canary
        self.phase = "aborted" if record.aborted else "promoted" if record.promoted else "judging"
        offset = wall_now() - now  # wall seconds minus trio seconds

        def trio_time(ms: int | None) -> float | None:
            return None if ms is None else ms / 1000 - offset

        self.clock = StepClock(
            max(0, min(record.step, 0 if config is None else len(config.steps) - 1)),
            trio_time(record.started_ms),
            record.held_s,
            trio_time(record.held_since_ms),
        )

    def recorded(self, record: RolloutRecord | None) -> RolloutRecord | None:
        """The rollout's record with the canary's progress in it."""
        canary = self.record()
        return record if record is None or canary is None else attrs.evolve(record, canary=canary)

    def record(self) -> CanaryRecord | None:
        if self.phase == "off":
            return None
        offset = wall_offset()

        def ms(t: float | None) -> int | None:
            return None if t is None else round((t + offset) * 1000)

        clock = self.clock
        return CanaryRecord(
            clock.step,
            ms(clock.started),
            clock.held_s,
            ms(clock.held_since),
            promoted=self.phase == "promoted",
            aborted=self.phase == "aborted",
        )

    # -- what the pass reads --

    @property
    def stable_number(self) -> int | None:
        return None if self.stable is None else self.stable.number

    def split(self, spec: Spec, num_replicas: int) -> CanarySplit | None:
        """The replica plan's split while the canary is judged (or aborted: none of it)."""
        stable = self.stable
        if stable is None or self.phase not in ("judging", "aborted"):
            return None
        if spec.backend_config.canary is None and self.phase == "judging":
            return None
        weight = self.weight(spec)
        count = 0 if self.phase == "aborted" else canary_count(num_replicas, weight)
        return CanarySplit(stable.version, digest(stable.content.user_config), count)

    def traffic(self, spec: Spec) -> TrafficSplit | None:
        """What the ingresses are told: the canary's weight beside the stable revision."""
        if self.stable is None or self.phase not in ("judging", "aborted"):
            return None
        return TrafficSplit(self.version, self.stable.version, self.weight(spec))

    def weight(self, spec: Spec) -> float:
        config = spec.backend_config.canary
        if self.phase != "judging" or config is None:
            return 0.0
        return config.steps[min(self.clock.step, len(config.steps) - 1)].weight

    # -- numbers from the ingresses --

    def report(self, tallies: Mapping[str, RequestTally]) -> bool:
        """Add an ingress's numbers (by replica version) to the step's, if its clock runs;
        True if they may move the canary, so that a pass should judge them."""
        if self.phase != "judging" or self.clock.started is None or self.stable is None:
            return False
        for version, tally in tallies.items():
            side = (
                "canary"
                if version == self.version
                else "stable"
                if version == self.stable.version
                else None
            )
            if side is not None:
                self.numbers[side].add(tally)
        # A pass only when the numbers may move the canary: a gate failing, or enough of them
        # once the pause is over (the step's timer wakes the loop at its end otherwise).
        config = self._config
        if config is None:
            return False
        verdict = judge(config, self.numbers["canary"], self.numbers["stable"])
        return verdict.failed is not None or (verdict.enough and trio.current_time() >= self._due)

    # -- a pass's look, and what a person asks --

    def sight(self, spec: Spec, now: float, serving: int, num_replicas: int) -> CanarySight | None:
        """What the pass's look at the canary reads (`serving`: its replicas that serve), once
        it follows `spec`; None if no canary is being judged."""
        self.follow(spec)
        if self.phase != "judging" or self.stable is None or self.revision is None:
            return None
        config = spec.backend_config.canary
        follows = None if config is None else config.follows
        return CanarySight(
            config,
            self.clock,
            (self.numbers["canary"], self.numbers["stable"]),
            revision=self.revision,
            now=now,
            paused=spec.paused,
            serving=serving,
            num_replicas=num_replicas,
            deadline_s=spec.backend_config.progress_deadline_s,
            following=follows is not None and self._phase_of(follows) == "judging",
            lost=self._lost,
        )

    def steer(self, what: str, via: str, now: float) -> None:
        """A person's promote or abort (nothing, unless a canary is being judged); or its
        application's, following another member's verdict (`via` then says so in words)."""
        if self.phase != "judging":
            return
        who = via if " " in via else f"a person ({via})"
        where = f"at step {self.clock.step + 1}"
        config, numbers = self._config, ""
        if config is not None:
            numbers = f": {judge(config, self.numbers['canary'], self.numbers['stable']).numbers}"
        if what == "promote":
            self.promote(f"promoted by {who} {where}{numbers}")
            self._progressed(now)
            return
        self._abort(f"aborted by {who} {where}{numbers}")

    def replica_failed(self, tag: str, what: str) -> None:
        """Replica `tag` of the canary died, or is replaced as unhealthy, during its steps
        (``judge_failures`` says so): it aborts the canary (a release whose replicas crash is
        not promoted on the requests they answered before)."""
        self._abort(f"step {self.clock.step + 1}: replica {tag} of the canary {what}")

    def lost(self, tag: str, version: str) -> None:
        """After a restart: replica `tag` had served and was gone; one of the canary's fails it
        at the loop's first look."""
        if self.phase == "judging" and version == self.version and self._lost is None:
            self._lost = f"replica {tag} of the canary was gone when the controller started again"

    def looked(self, sight: CanarySight, seen: CanaryLook) -> float:
        """What a look at `sight` decided (``canary_steps.look``), in its order: the clock, the
        events, a new step, the end. Returns when the step wants its next look."""
        config, now = sight.config, sight.now
        self.clock, self._due = seen.clock, seen.due
        if seen.judged:
            self._config = config
        for reason, message in seen.events:
            self._journal.event(reason, message)
        if seen.entered:
            self.numbers = {"canary": RequestTally(), "stable": RequestTally()}
            self._published()
        if seen.touched:
            self._touched()
        if seen.end == "promote":
            self.promote(seen.why)
        if seen.progressed:
            # Before an abort, which ends the rollout (a restarted deadline would be lost).
            self._progressed(now)
        if seen.end == "abort":
            self._lost = None
            self._abort(seen.why)
        return seen.wake_at

    def promote(self, why: str) -> None:
        """Past the last step (or skipped there by a person): the rolling replacement."""
        self.phase = "promoted"
        self._touched()
        self._published()
        self._journal.event("CanaryPromoted", f"revision {self.revision} promoted: {why}")
        self._promoted()

    def abort(self) -> None:
        """Weight 0 at once (the caller fails the deploy, which rolls back)."""
        self.phase = "aborted"
        self._touched()
        self._published()

    def _abort(self, why: str) -> None:
        """Weight 0 at once, and the deploy failed for `why`: the rollback follows."""
        self.abort()
        self._fail(why)

    def status(self, spec: Spec, now: float) -> CanaryStatus | None:
        config = spec.backend_config.canary
        stable, revision = self.stable, self.revision
        if self.phase == "off" or config is None or stable is None or revision is None:
            return None
        clock = self.clock
        step = min(clock.step, len(config.steps) - 1)
        phase: Literal["starting", "judging", "held", "promoted", "aborted"]
        if self.phase in ("promoted", "aborted"):
            phase = self.phase
        elif clock.started is None:
            phase = "starting"
        else:
            phase = "held" if spec.paused or clock.held_since is not None else "judging"
        verdict = judge(config, self.numbers["canary"], self.numbers["stable"])
        return CanaryStatus(
            revision,
            stable.number,
            phase,
            step + 1,
            len(config.steps),
            100.0 if phase == "promoted" else self.weight(spec),
            config.steps[step].pause_s,
            None if phase in ("promoted", "aborted") else clock.elapsed(now),
            _numbers(self.version, self.numbers["canary"]),
            _numbers(stable.version, self.numbers["stable"]),
            verdict.failed or ("passing" if verdict.enough else "waiting for min_requests"),
            describe_gates(config),
            None if clock.started is None else clock.started + wall_offset(),
        )

    # -- inside --

    def _start(self) -> None:
        """A canary judged from its first step (later steps come from `look`)."""
        self.clock, self._due = StepClock(), math.inf
        self.numbers = {"canary": RequestTally(), "stable": RequestTally()}
        self._touched()
        self._published()


def _numbers(version: str, tally: RequestTally) -> RevisionNumbers:
    return RevisionNumbers(
        version, tally.requests, tally.errors, tally.error_rate, tally.quantile(0.99)
    )
