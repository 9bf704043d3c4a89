"""The autoscaler's decision: a pure function of the config, its own state, the load and the
time (trio's; the caller passes it), with no I/O.

Kubernetes HPA's semantics, on ongoing requests (in flight plus queued) instead of CPU:

- the ratio form: ``ceil(ongoing / target_ongoing_requests)`` replicas, no change while the load
  per replica is within `tolerance` of the target;
- replicas not ready yet count as fully loaded when the load says "fewer", so a scale-down never
  kills serving replicas while new ones start (they count as idle for a scale-up, which the sum
  already does);
- stabilization: a scale-up follows the lowest recommendation within the upscale window, a
  scale-down the highest within the downscale window (one quiet moment never scales down);
- rate limits per direction, over the changes made within each period;
- bounds last; and no signal never scales down.

Scale to zero is apart from downscaling: the last replica goes only after no request at all for
`scale_to_zero_delay_s`, and the first request brings one back at once, without any window.
"""

from __future__ import annotations

import math
from typing import Literal

import attrs

from ..config.autoscaling import AutoscalingConfig

#: Why the autoscaler set what it set, in one word.
ScaleReason = Literal[
    "ScaleUp",
    "ScaleDown",
    "ScaleFromZero",
    "ScaleToZero",
    "Bounds",
    "WithinTolerance",
    "Stabilizing",
    "RateLimited",
    "NoSignal",
    "Steady",
]

#: A recommendation (or a change) and the time it was made, on the trio clock.
Entry = tuple[float, int]


@attrs.frozen
class ScaleState:
    """What the autoscaler remembers between decisions (and stores with the backend)."""

    target: int
    """The replica count it set last."""
    ups: tuple[Entry, ...] = ()
    """Recommendations in the upscale window that could still be its lowest, oldest first."""
    downs: tuple[Entry, ...] = ()
    """Recommendations in the downscale window that could still be its highest, oldest first."""
    changes: tuple[Entry, ...] = ()
    """The changes it made (time, signed delta) within the longer rate-limit period."""
    busy_at: float | None = None
    """When it last saw a request ongoing (or had no signal): scale to zero counts from it."""
    busy: bool = True
    """Its last input was a load above zero (or none): busy until this evaluation, then."""


@attrs.frozen
class Inputs:
    """What the decision reads of the backend now."""

    ongoing: float | None
    """Requests in flight plus queued, summed over the sources; None: no source reports."""
    not_ready: int = 0
    """Replicas of the target version asked for and not serving yet."""


@attrs.frozen
class ScaleDecision:
    """One evaluation: its inputs, what it recommended, what it set, and why."""

    at: float
    """When, on the trio clock."""
    ongoing: float | None
    """The load it saw (None: no signal)."""
    not_ready: int
    previous: int
    """The count before."""
    recommended: int
    """What the load alone asks for, within the bounds (before windows and rate limits)."""
    target: int
    """The count it set."""
    reason: ScaleReason

    @property
    def changed(self) -> bool:
        return self.target != self.previous


def initial_state(config: AutoscalingConfig, num_replicas: int, now: float) -> ScaleState:
    """The state of a backend that starts autoscaling now: at `num_replicas` (within bounds),
    as if that had just been recommended (so it holds for one downscale window: the deploy is
    the one moment it has heard of), and counted as busy now (so it waits the whole delay
    before scaling to zero)."""
    start = config.initial(num_replicas)
    return ScaleState(start, downs=((now, start),), busy_at=now)


def restored(state: ScaleState, now: float) -> ScaleState:
    """A state read back after a restart: its target is recommended again now, so that no
    scale-down happens within the first downscale window (nor a move to zero before the delay)."""
    downs = _push_max(state.downs, (now, state.target))
    busy_at = now if state.busy_at is None else max(state.busy_at, now)
    return attrs.evolve(state, downs=downs, busy_at=busy_at)


def evaluate(
    config: AutoscalingConfig, state: ScaleState, inputs: Inputs, now: float
) -> tuple[ScaleState, ScaleDecision, float | None]:
    """Decide the count now. Returns the new state, the decision, and when to evaluate again
    if nothing else happens (None: only a new input can change the outcome)."""
    current = state.target
    low, high = config.min_replicas, config.max_replicas
    ongoing = inputs.ongoing
    # Evaluations come on every change of load (and on timers), so the last input held until
    # now: the last recommendation is in force until now, and a load seen then was there
    # until now. (Windows count from when a load was last seen, not from when it arrived: a
    # steady load an hour long holds a scale-down for the window after it ends.)
    busy_at = now if ongoing != 0 or state.busy else state.busy_at
    ups = _expire(_held_until(state.ups, now), now - config.upscale_stabilization_s)
    downs = _expire(_held_until(state.downs, now), now - config.downscale_stabilization_s)
    longest = max(config.scale_up_period_s, config.scale_down_period_s)
    changes = tuple(c for c in state.changes if c[0] > now - longest)

    def done(
        target: int, recommended: int, reason: ScaleReason, wake: float | None
    ) -> tuple[ScaleState, ScaleDecision, float | None]:
        made = (*changes, (now, target - current)) if target != current else changes
        new = ScaleState(target, ups, downs, made, busy_at, ongoing != 0)
        decision = ScaleDecision(
            now, ongoing, inputs.not_ready, current, recommended, target, reason
        )
        return new, decision, wake

    if not low <= current <= high and not (current == 0 and low == 0):
        # New bounds apply at once, whatever the load or the pace (as HPA's).
        bounded = min(max(current, low), high)
        return done(bounded, bounded, "Bounds", None)
    if ongoing is None:
        # No signal is no evidence of idleness: hold, and keep counting it busy.
        return done(current, current, "NoSignal", None)
    if current == 0:
        if ongoing <= 0:
            return done(0, 0, "Steady", None)
        # Demand at zero: start at once, past every window (requests are waiting).
        wanted = min(max(1, _ceil(ongoing / config.target_ongoing_requests)), high)
        target = min(wanted, max(1, _up_limit(config, changes, now, 0)))
        return done(target, wanted, "ScaleFromZero", None)

    raw = _recommend(config, current, ongoing, inputs.not_ready)
    floor = max(low, 1)  # zero is the scale-to-zero rule's alone
    recommended = min(max(raw, floor), high)
    # Stabilize: the lowest recommendation in the up window caps a rise, the highest in the down
    # window floors a fall (this one included in both).
    up_rec = min([recommended, *(v for _, v in ups)])
    down_rec = max([recommended, *(v for _, v in downs)])
    ups = _push_min(ups, (now, recommended))
    downs = _push_max(downs, (now, recommended))
    stable = min(max(current, up_rec), down_rec)
    wake: list[float] = []
    if stable != recommended:
        wake += _window_ends(ups, config.upscale_stabilization_s)
        wake += _window_ends(downs, config.downscale_stabilization_s)

    zero_at = None
    if low == 0 and stable <= 1 and ongoing <= 0 and busy_at is not None:
        zero_at = busy_at + config.scale_to_zero_delay_s
        if now >= zero_at:
            # The load asks for none, and has for the whole delay: zero is what this
            # evaluation recommends (the windows keep the floor of 1 they were given above,
            # so that the count that comes back from zero is not held down by it).
            stable = recommended = 0
        else:
            wake.append(zero_at)

    target, reason = stable, _direction(current, stable, raw, recommended)
    if stable > current:
        limit = _up_limit(config, changes, now, current)
        if limit < stable:
            target, reason = max(current, limit), "RateLimited"
            wake += _period_ends(changes, config.scale_up_period_s, now, up=True)
    elif stable < current:
        limit = _down_limit(config, changes, now, current)
        if limit > stable:
            target, reason = min(current, limit), "RateLimited"
            wake += _period_ends(changes, config.scale_down_period_s, now, up=False)
    if target == 0:
        reason = "ScaleToZero"
    later = [t for t in wake if t > now]
    return done(target, recommended, reason, min(later) if later else None)


def _recommend(config: AutoscalingConfig, current: int, ongoing: float, not_ready: int) -> int:
    """What the load asks for, from `current` replicas (HPA's ratio with tolerance)."""
    per_replica = config.target_ongoing_requests
    ratio = ongoing / (per_replica * current)
    if abs(ratio - 1.0) <= config.tolerance:
        return current
    wanted = _ceil(ongoing / per_replica)
    if wanted < current:
        # Toward fewer: replicas not ready yet count as fully loaded; the direction never flips.
        wanted = min(current, _ceil(ongoing / per_replica + not_ready))
    return wanted


def _ceil(replicas: float) -> int:
    # Past any bound (a count can be at most a million): never an overflow on a huge ratio.
    return math.ceil(min(replicas, 1e12))


def _direction(current: int, stable: int, raw: int, recommended: int) -> ScaleReason:
    if stable > current:
        return "ScaleUp"
    if stable < current:
        return "ScaleDown"
    if raw == current:
        return "WithinTolerance" if recommended == current else "Steady"
    return "Stabilizing" if recommended != current else "Steady"


def _up_limit(
    config: AutoscalingConfig, changes: tuple[Entry, ...], now: float, current: int
) -> int:
    added = sum(d for t, d in changes if d > 0 and t > now - config.scale_up_period_s)
    return config.up_limit(current - added)


def _down_limit(
    config: AutoscalingConfig, changes: tuple[Entry, ...], now: float, current: int
) -> int:
    removed = -sum(d for t, d in changes if d < 0 and t > now - config.scale_down_period_s)
    return config.down_limit(current + removed)


def _held_until(entries: tuple[Entry, ...], now: float) -> tuple[Entry, ...]:
    # The newest entry is the last recommendation, in force until this evaluation.
    return (*entries[:-1], (now, entries[-1][1])) if entries else entries


def _expire(entries: tuple[Entry, ...], cutoff: float) -> tuple[Entry, ...]:
    return tuple(e for e in entries if e[0] > cutoff)


def _push_min(entries: tuple[Entry, ...], entry: Entry) -> tuple[Entry, ...]:
    """Add `entry` to a window kept for its minimum: older entries no lower are dropped (this
    one outlasts them)."""
    kept = list(entries)
    while kept and kept[-1][1] >= entry[1]:
        kept.pop()
    return (*kept, entry)


def _push_max(entries: tuple[Entry, ...], entry: Entry) -> tuple[Entry, ...]:
    """Add `entry` to a window kept for its maximum: older entries no higher are dropped."""
    kept = list(entries)
    while kept and kept[-1][1] <= entry[1]:
        kept.pop()
    return (*kept, entry)


def _window_ends(entries: tuple[Entry, ...], window: float) -> list[float]:
    # The oldest entry holds the window's extreme; when it leaves, the outcome may change.
    return [entries[0][0] + window] if len(entries) > 1 else []


def _period_ends(changes: tuple[Entry, ...], period: float, now: float, *, up: bool) -> list[float]:
    # The limit loosens when the oldest change in its period leaves it (the one made now last).
    ends = [t + period for t, d in changes if d and (d > 0) == up and t + period > now]
    return [min([*ends, now + period])]
