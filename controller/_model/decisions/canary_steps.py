"""Where a canary goes next: wait, the next step, promotion, or abort. Pure: the backend's loop
gives the step, how long it has run and the gates' verdict (``verdict.judge``)."""

from __future__ import annotations

import math
from typing import Literal

import attrs

from ..config.canary import CanaryConfig
from .verdict import Verdict

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
