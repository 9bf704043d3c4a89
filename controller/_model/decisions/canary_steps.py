"""Where a canary goes next: wait, the next step, promotion, or abort. Pure: ``look`` takes
the step and its clock as the backend's canary keeps them, the step's numbers and what the pass
sees (its replicas serving, a pause), and returns the new clock and the moves for the canary to
record; ``step_move`` is the gates' verdict (``verdict.judge``) on one step."""

from __future__ import annotations

import math
from typing import Literal

import attrs

from ..config.canary import CanaryConfig, canary_count
from .verdict import RequestTally, Verdict, judge

Move = Literal["wait", "next", "promote", "abort"]


@attrs.frozen
class StepMove:
    move: Move
    why: str = ""
    """For an abort: what failed it (the gate, or a verdict that never came)."""
    wake_in: float = math.inf
    """For a wait: how much longer the step runs before it is looked at again (held: inf)."""


def step_move(
    config: CanaryConfig,
    step: int,
    elapsed: float,
    verdict: Verdict,
    *,
    held: bool,
    deadline_s: float,
    following: bool = False,
) -> StepMove:
    """The move of a canary at `step` (0-based) that has run `elapsed` seconds of it. A gate
    that fails aborts at once, before the pause ends (a bad release is not kept for the rest of
    the step); a step moves on only once its pause ended with the gates passing. One whose pause
    ended without enough requests for a verdict waits for them, until `deadline_s` (the
    backend's ``progress_deadline_s``) from the step's start: then it aborts, inconclusive.
    `following`: the backend its config ``follows`` is being judged; its verdict ends this one,
    so the steps go on without numbers, and the last waits."""
    where = f"step {step + 1} of {len(config.steps)} ({config.steps[step].weight:g}%)"
    if verdict.failed is not None:
        return StepMove("abort", f"{where}: {verdict.failed}: {verdict.numbers}")
    if held:
        return StepMove("wait")
    pause = config.steps[step].pause_s
    if elapsed < pause:
        return StepMove("wait", wake_in=pause - elapsed)
    if following:
        return StepMove("next") if step + 1 < len(config.steps) else StepMove("wait")
    if verdict.enough:
        return StepMove("next" if step + 1 < len(config.steps) else "promote")
    if elapsed >= max(pause, deadline_s):
        return StepMove(
            "abort",
            f"{where}: no verdict within progress_deadline_s={deadline_s:g}: each revision "
            f"needs min_requests={config.min_requests}: {verdict.numbers}",
        )
    return StepMove("wait", wake_in=max(pause, deadline_s) - elapsed)


@attrs.frozen
class StepClock:
    """A canary's step (from 0) and the step's clock, in trio time."""

    step: int = 0
    started: float | None = None
    """When the step's clock started; None until the step's replicas all serve."""
    held_s: float = 0.0
    """How long the step was held (paused, or scaled to 0) before `held_since`."""
    held_since: float | None = None
    """When the hold under way began (None: not held)."""

    def elapsed(self, now: float) -> float | None:
        """How long the step has run at `now`, holds left out (None: not started)."""
        if self.started is None:
            return None
        held = self.held_s + (0.0 if self.held_since is None else now - self.held_since)
        return max(0.0, now - self.started - held)


@attrs.frozen
class CanaryLook:
    """What a pass's look at a canary being judged decides: its clock afterwards, and what the
    canary records of it, in this order."""

    clock: StepClock
    events: tuple[tuple[str, str], ...] = ()
    """The journal's events (reason, message), in order."""
    entered: bool = False
    """A new step began: its numbers start afresh, and its weight is published."""
    touched: bool = False
    """The stored record changed."""
    progressed: bool = False
    """The rollout's progress deadline starts afresh (a step passed, a hold ended)."""
    judged: bool = False
    """The gates judged a step's numbers by this config: a person's promote or abort and the
    ingresses' reports are judged by it from now on."""
    end: Literal["promote", "abort"] | None = None
    """Promoted (the rolling replacement follows), or aborted (the deploy fails for `why`)."""
    why: str = ""
    due: float = math.inf
    """When the step's pause ends (inf: held, or not started)."""
    wake_at: float = math.inf
    """When the step wants its next look."""


@attrs.frozen
class CanarySight:
    """What a pass's look at a canary being judged reads (``look``): its config block (None:
    taken out), the step's `clock` and `numbers` (the canary's, the stable revision's), and
    `serving` of its replicas serving out of `num_replicas` for the backend."""

    config: CanaryConfig | None
    clock: StepClock
    numbers: tuple[RequestTally, RequestTally]
    revision: int
    now: float
    paused: bool
    serving: int
    num_replicas: int
    deadline_s: float
    """``progress_deadline_s``."""
    following: bool = False
    """It follows another member's canary that is still being judged."""
    lost: str | None = None
    """Why the canary failed while no controller ran (a replica of it gone)."""


def look(sight: CanarySight) -> CanaryLook:
    """A pass's look at the canary of `sight.revision`, being judged.

    The step's clock starts once the canary's share of `num_replicas` all serve; it stops while
    `paused` or scaled to 0. A step that passes is followed by a look at the next at once (its
    clock starts now if its replicas serve already). A canary `lost` is aborted. A canary whose
    config block was taken out is promoted."""
    config, clock, numbers, now = sight.config, sight.clock, sight.numbers, sight.now
    revision, serving, num_replicas = sight.revision, sight.serving, sight.num_replicas
    paused, deadline_s = sight.paused, sight.deadline_s
    if config is None:
        why = "the canary block was taken out of the config"
        return CanaryLook(clock, end="promote", why=why, progressed=True)
    if sight.lost is not None:
        return CanaryLook(clock, end="abort", why=f"step {clock.step + 1}: {sight.lost}")
    clock = attrs.evolve(clock, step=min(clock.step, len(config.steps) - 1))
    events: list[tuple[str, str]] = []
    entered = touched = progressed = judged = False
    for _ in range(2):  # a step, and the next one if this one passed
        step = config.steps[clock.step]
        # Paused, or scaled to 0 (no replica of either revision to judge): the clock waits.
        held = paused or num_replicas <= 0
        if clock.started is None:
            if num_replicas <= 0 or serving < canary_count(num_replicas, step.weight):
                return CanaryLook(clock, tuple(events), entered, touched, progressed, judged)
            clock, touched = attrs.evolve(clock, started=now), True
            said = f"{step.weight:g}% of requests for {step.pause_s:g}s"
            events.append(
                ("CanaryStep", f"revision {revision}: step {clock.step + 1} of "
                 f"{len(config.steps)}: {said}")
            )  # fmt: skip
        if held and clock.held_since is None:
            clock, touched = attrs.evolve(clock, held_since=now), True  # a restart keeps it
        elif not held and clock.held_since is not None:
            held_s = clock.held_s + now - clock.held_since
            clock = attrs.evolve(clock, held_s=held_s, held_since=None)
            touched = progressed = True  # a hold is no lack of progress: the deadline restarts
        verdict, judged = judge(config, *numbers), True
        elapsed = clock.elapsed(now) or 0.0
        due = math.inf if held else now + max(0.0, step.pause_s - elapsed)
        move = step_move(
            config, clock.step, elapsed, verdict,
            held=held, deadline_s=deadline_s, following=sight.following,
        )  # fmt: skip
        if move.move == "wait":
            return CanaryLook(
                clock, tuple(events), entered, touched, progressed, judged,
                due=due, wake_at=now + move.wake_in,
            )  # fmt: skip
        if move.move != "next":
            why = move.why if move.move == "abort" else f"every step passed: {verdict.numbers}"
            return CanaryLook(
                clock, tuple(events), entered, touched,
                progressed or move.move == "promote", judged, move.move, why, due,
            )  # fmt: skip
        events.append(("CanaryStepPassed", f"step {clock.step + 1} passed: {verdict.numbers}"))
        clock = StepClock(clock.step + 1)
        numbers = (RequestTally(), RequestTally())
        entered = touched = progressed = True
    # Two steps passed in one look (pauses of 0, following another canary): the next pass,
    # which an event brings (a replica's start, a load report), looks again.
    return CanaryLook(clock, tuple(events), entered, touched, progressed, judged)


@attrs.frozen
class RevisionNumbers:
    """One revision's numbers over the canary's current step."""

    version: str
    requests: int
    errors: int
    error_rate: float
    p99_s: float | None


@attrs.frozen
class CanaryStatus:
    """A canary release under way (or just ended), as status reports it."""

    revision: int
    """The revision tried as the canary."""
    stable_revision: int
    """The revision it is judged against, which serves the rest."""
    phase: Literal["starting", "judging", "held", "promoted", "aborted"]
    """``starting``: the step's replicas are not all serving yet (its clock waits);
    ``judging``: the step runs; ``held``: paused (``rollout pause``); ``promoted``: past the
    last step, the rolling replacement runs; ``aborted``: its weight is 0, its replicas go."""
    step: int
    """The current step, from 1."""
    steps: int
    weight: float
    """The canary's share of requests now, in percent."""
    pause_s: float
    """How long the current step lasts."""
    elapsed_s: float | None
    """How long it has run (holds left out; None while starting)."""
    canary: RevisionNumbers
    stable: RevisionNumbers
    verdict: str
    """What the gates say of the step's numbers so far."""
    gates: str = ""
    """The gates, in words."""
    step_started: float | None = None
    """When the current step's clock started, by the wall clock (seconds since the epoch;
    None while its replicas start). A restart keeps it: it is stored."""


def describe_gates(config: CanaryConfig) -> str:
    """``error rate <= stable + 1.0%; p99 <= 1.5x stable or + 10 ms; 100 requests each``."""
    return (
        f"error rate <= stable + {config.max_error_rate_increase:.1%}; p99 <= "
        f"{config.max_p99_ratio:g}x stable or + {config.p99_slack_s * 1000:g} ms; "
        f"{config.min_requests} requests each"
    )
