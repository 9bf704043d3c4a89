"""Backoff after failures, when a deploy has failed, and what a replica's failure does: a
backend's failure bookkeeping and verdicts, pure.

Time comes in as an argument (the loop passes ``trio.current_time()``), so every rule here is a
plain function of what happened, testable without trio.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from typing import Literal, final

import attrs

from .policy import RestartPolicy

#: What a backend whose deploy failed says of its next start.
NO_NEW_START = "no new start until the next deploy"

#: Why a backend starts nothing new (or, for a failed reconfigure, changes no config) until the
#: next deploy.
Blocked = Literal[
    "StartFailures",
    "Infeasible",
    "ReconfigureFailed",
    "ProgressDeadlineExceeded",
    "UnhealthyAfterReady",
    "CanaryAborted",
]


@final
@attrs.define
class FailureBook:
    """One backend's failures: the backoff they impose, and whether its deploy has failed."""

    policy: RestartPolicy
    rng: random.Random
    restarts: int = 0
    """Failures in a row, for the backoff (forgiven after `policy.reset_after_s` without one)."""
    last_failure_at: float = -math.inf
    backoff_until: float = -math.inf
    """No start before this time."""
    consecutive: int = 0
    """Failed starts of the target version in a row."""
    failed_starts: int = 0
    """Failed starts of the target version in this generation, for the status message."""
    start_error: str | None = None
    """Why the last of those failed."""
    proven: bool = False
    """A replica of the target version has been ready in this generation: later start failures
    back off, but no longer fail the deploy."""
    blocked: Blocked | None = None
    """Set once the deploy has failed, until the next one."""
    error: str | None = None
    """The last failure of this generation (what the status message shows)."""
    unschedulable: bool = False
    """The last failure was a start no node would take (cordoned, drained, full): a change of
    the nodes ends its backoff."""

    def new_generation(self) -> None:
        """A new spec is a new attempt: nothing of the one it replaces carries over."""
        self.consecutive = self.failed_starts = self.restarts = 0
        self.proven = False
        self.blocked = None
        self.error = self.start_error = None
        self.backoff_until = -math.inf

    def mended(self) -> None:
        """The backend is healthy again: what failed is history (the events keep it), not its
        status message. The backoff keeps its own count, forgiven in its own time."""
        self.failed_starts = 0
        self.error = self.start_error = None

    def failed(self, now: float, error: str) -> str:
        """Note a failure (a failed start, a crash, a failed health check or reconfigure): the
        next start waits, longer after each failure in a row. Returns what comes next, in
        words."""
        self.error = error
        self.unschedulable = error.startswith("Unschedulable")
        if now - self.last_failure_at >= self.policy.reset_after_s:
            self.restarts = 0  # it has been well for a while: forgive the earlier failures
        self.restarts += 1
        self.last_failure_at = now
        delay = self.policy.delay(self.restarts, self.rng)
        self.backoff_until = now + delay
        if self.starts_blocked:
            return NO_NEW_START
        return f"next start in {delay:.3g}s"

    def nodes_changed(self) -> None:
        """A node was added, uncordoned or given room: a start that failed for want of one is
        tried at once, as a Kubernetes scheduler places a pending pod, not after its backoff
        (which grew with each refusal while the node was cordoned)."""
        if self.unschedulable:
            self.backoff_until = -math.inf

    def count_start(self, of_target: bool, error: str) -> int:
        """Count a failed start; returns how many of the target version failed in a row (0:
        it was another version's, which no deploy fails by). Whether that fails the deploy is
        `judge_failures`'s to say."""
        if not of_target:
            return 0
        self.consecutive += 1
        self.failed_starts += 1
        self.start_error = error
        return self.consecutive

    def ready(self, of_target: bool) -> None:
        if of_target:
            self.consecutive = 0
            self.proven = True

    def deferred(self, now: float) -> bool:
        """Whether starts must wait (backing off)."""
        return now < self.backoff_until

    @property
    def halted(self) -> bool:
        """The deploy failed on its own (its starts, the deadline, its new replicas' health):
        what it still has starting stops. Not a spec too large for the runtime at recovery."""
        return halts(self.blocked)

    @property
    def starts_blocked(self) -> bool:
        """No new start until the next deploy (a failed reconfigure still lets the replicas it
        stops be replaced, with the config before it)."""
        return blocks_starts(self.blocked)


def halts(blocked: Blocked | None) -> bool:
    """See ``FailureBook.halted``."""
    return blocked is not None and blocked not in ("Infeasible", "ReconfigureFailed")


def blocks_starts(blocked: Blocked | None) -> bool:
    """See ``FailureBook.starts_blocked``."""
    return blocked is not None and blocked != "ReconfigureFailed"


def unhealthy_after_ready(
    active: bool,
    blocked: Blocked | None,
    of_spec: bool,
    ready_at: float,
    min_ready: float,
    now: float,
) -> bool:
    """Whether a replica that failed fails the rollout: one of the revision being rolled out,
    ready less than ``min_ready_s`` ago, while the deploy has not failed yet."""
    return active and of_spec and blocked is None and now < ready_at + min_ready


def replaces_unhealthy(check_failures: int, threshold: int) -> bool:
    """Whether a replica whose health checks failed `check_failures` times in a row is replaced
    (at ``health_check_failure_threshold``), or only taken out of the snapshot until it passes
    one again."""
    return check_failures >= threshold


@attrs.frozen
class ReplicaFailure:
    """A serving replica's failure, as the reducer recorded it: it died (`checks_failed` 0; it
    is being stopped already), or failed a health check (`checks_failed` in a row)."""

    tag: str
    version: str
    error: str
    """The failure's own message (the death's reason, the check's error)."""
    ready_at: float
    at: float
    checks_failed: int = 0

    @property
    def died(self) -> bool:
        return self.checks_failed == 0

    @property
    def what(self) -> str:
        """What happened, in words: ``died: ...``, ``failed a health check: ...``."""
        return f"died: {self.error}" if self.died else f"failed a health check: {self.error}"


@attrs.frozen
class StartFailure:
    """A failed start (or a death before the replica was ready), as the reducer recorded it:
    counted already, and the replica being stopped. `in_a_row`: failed starts of the target
    version in a row, this one included (0: another version's start)."""

    tag: str
    version: str
    error: str
    traceback: str | None
    in_a_row: int


@attrs.frozen
class ReconfigureFailure:
    """A failed in-place reconfigure, as the reducer recorded it (the replica runs on, with a
    config no one knows). `to_spec`: the config it was given is the spec's, not an older one."""

    tag: str
    error: str
    to_spec: bool


#: What the reducer records and `judge_failures` judges, in the order they came.
Failure = ReplicaFailure | StartFailure | ReconfigureFailure


@attrs.frozen
class FailureInputs:
    """What the verdicts on failures read of the backend when the burst is over."""

    rollout_active: bool
    blocked: Blocked | None
    version: str
    """The spec's version (the revision being rolled out, if one is)."""
    revision: int | None
    min_ready_s: float
    threshold: int
    """``health_check_failure_threshold``."""
    canary_version: str | None
    """The version of a canary being judged (None: no canary is)."""
    proven: bool = False
    """A replica of the target version has been ready in this generation."""
    max_failed_starts: int = 3
    in_place: bool = False
    """The spec changes the user config in place, with the config before it to go back to."""


@attrs.frozen
class FailureVerdict:
    """What one failure does, in this order: the rollout fails (`fails_rollout`: the reason),
    the canary is aborted, and the replica is replaced (a death always is; a failed check at
    the threshold; a failed reconfigure that does not fail the rollout), else it only stays out
    of the snapshot (a failed check), or is taken back to the config before (a failed
    reconfigure). A failed start is being stopped already: only whether the deploy fails."""

    failure: Failure
    fails_rollout: str | None
    aborts_canary: bool
    replaced: bool


def judge_failures(failures: Iterable[Failure], inputs: FailureInputs) -> list[FailureVerdict]:
    """The verdict on each failure, in the order they came: a rollout fails once, a canary is
    aborted once, and a replica already replaced (a failed check, then its death) is judged no
    more."""
    blocked, canary = inputs.blocked, inputs.canary_version
    active = inputs.rollout_active
    replaced: set[str] = set()
    verdicts = []
    for failure in failures:
        if isinstance(failure, StartFailure | ReconfigureFailure):
            failed = _fails_deploy(failure, inputs, blocked)
            reason = None
            if failed is not None:
                # A failed rollout aborts its canary itself.
                (blocked, reason), active, canary = failed, False, None
            replace = isinstance(failure, ReconfigureFailure) and failed is None
            if replace:
                replaced.add(failure.tag)
            verdicts.append(FailureVerdict(failure, reason, False, replace))
            continue
        if failure.tag in replaced:
            continue
        fails = None
        of_spec = failure.version == inputs.version
        if unhealthy_after_ready(
            active, blocked, of_spec, failure.ready_at, inputs.min_ready_s, failure.at
        ):
            after = failure.at - failure.ready_at
            fails = (
                f"replica {failure.tag} of revision {inputs.revision} {failure.what}, {after:g}s "
                f"after it became ready (min_ready_s={inputs.min_ready_s:g})"
            )
            blocked, active = "UnhealthyAfterReady", False
        replace = failure.died or replaces_unhealthy(failure.checks_failed, inputs.threshold)
        # A failed rollout aborts its canary itself (whatever failed it).
        aborts = replace and fails is None and canary is not None and failure.version == canary
        if aborts or fails is not None:
            canary = None
        if replace:
            replaced.add(failure.tag)
        verdicts.append(FailureVerdict(failure, fails, aborts, replace))
    return verdicts


def _fails_deploy(
    failure: StartFailure | ReconfigureFailure, inputs: FailureInputs, blocked: Blocked | None
) -> tuple[Blocked, str] | None:
    """Whether a failed start or reconfigure fails the deploy, and why: the
    `max_failed_starts`-th failed start of the target version in a row while none of it has
    been ready; the first failed reconfigure to the spec's config while it changes in place (an
    in-place change is a rollout too). Never once the deploy has failed."""
    if blocked is not None:
        return None
    if isinstance(failure, ReconfigureFailure):
        if inputs.in_place and failure.to_spec:
            return "ReconfigureFailed", (
                f"the new user config failed in replica {failure.tag}: {failure.error}"
            )
        return None
    if failure.in_a_row > 0 and failure.in_a_row >= inputs.max_failed_starts and not inputs.proven:
        return "StartFailures", (
            f"{failure.in_a_row} consecutive replica starts failed; last: {failure.error}"
        )
    return None
