"""The autoscaler's pure decision, by property: whatever the config and the load over time, the
bounds, the rate limits, the tolerance and the windows hold."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from controller import AutoscalingConfig
from controller._model.decisions.autoscale import Inputs, ScaleDecision, evaluate, initial_state

configs = st.builds(
    lambda low, span, target, tol, up_w, down_w, up_pct, up_n, down_pct, zero: AutoscalingConfig(
        min_replicas=low,
        max_replicas=max(1, low + span),
        target_ongoing_requests=target,
        tolerance=tol,
        upscale_stabilization_s=up_w,
        downscale_stabilization_s=down_w,
        scale_up_percent=up_pct,
        scale_up_replicas=up_n,
        scale_up_period_s=15.0,
        scale_down_percent=down_pct,
        scale_down_period_s=15.0,
        scale_to_zero_delay_s=zero,
    ),
    st.integers(0, 5),
    st.integers(0, 30),
    st.sampled_from([0.5, 1.0, 2.0, 5.0]),
    st.sampled_from([0.0, 0.1, 0.3]),
    st.sampled_from([0.0, 10.0, 60.0]),
    st.sampled_from([0.0, 30.0, 300.0]),
    st.sampled_from([0.0, 50.0, 100.0]),
    st.sampled_from([1, 4]),
    st.sampled_from([0.0, 50.0, 100.0]),
    st.sampled_from([0.0, 30.0, 120.0]),
)
steps = st.lists(
    st.tuples(
        st.sampled_from([0.0, 0.5, 3.0, 16.0, 61.0, 301.0]),  # seconds since the last step
        st.one_of(st.none(), st.integers(0, 200).map(float)),  # ongoing (None: no signal)
        st.integers(0, 3),  # not ready
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(config=configs, start=st.integers(0, 40), history=steps)
def test_bounds_limits_tolerance_and_windows_always_hold(
    config: AutoscalingConfig, start: int, history: list[tuple[float, float | None, int]]
) -> None:
    now = 0.0
    state = initial_state(config, start, now)
    decisions: list[ScaleDecision] = []
    for dt, ongoing, not_ready in history:
        now += dt
        state, d, wake = evaluate(config, state, Inputs(ongoing, not_ready), now)
        decisions.append(d)
        assert wake is None or wake > now
        assert state.target == d.target
        # Bounds: always within them, 0 only for a backend that may scale to zero.
        assert d.target <= config.max_replicas
        assert d.target >= config.min_replicas or d.reason == "Bounds"
        if d.reason == "Bounds":
            continue  # new bounds apply at once, whatever else
        if d.target == 0 and d.previous != 0:
            # To zero: only with nothing ongoing, after the delay without a request.
            assert config.min_replicas == 0
            assert ongoing == 0
            busy = [x.at for x in decisions[:-1] if x.ongoing != 0]
            assert now - max([0.0, *busy]) >= config.scale_to_zero_delay_s
            assert d.recommended == 0  # what its event says
        if ongoing is None:
            assert d.target >= d.previous  # no signal never scales down
        if d.previous and ongoing is not None and d.previous > 0:
            ratio = ongoing / (config.target_ongoing_requests * d.previous)
            if abs(ratio - 1) <= config.tolerance and d.target != 0:
                assert d.target == d.previous  # within tolerance: no change
        if d.target > d.previous and d.previous > 0:
            # Up: never past what the load asks, nor past the lowest recommendation in the up
            # window, nor past the rate limit from the count a period ago.
            assert d.target <= math.ceil(ongoing / config.target_ongoing_requests)  # type: ignore[operator]
            window = _held(_windowed(decisions, now, config.upscale_stabilization_s))
            assert d.target <= min([d.recommended, *window])
            added = sum(
                x.target - x.previous
                for x in decisions[:-1]
                if x.at > now - 15.0 and x.target > x.previous
            )
            assert d.target <= config.up_limit(d.previous - added)
        if 0 < d.target < d.previous:
            # Down: never below the highest recommendation in the down window, nor below the
            # replicas that are not ready yet added to what the load asks.
            window = _held(_windowed(decisions, now, config.downscale_stabilization_s))
            assert d.target >= max([d.recommended, *window])
            wanted = math.ceil(ongoing / config.target_ongoing_requests + not_ready)  # type: ignore[operator]
            assert d.target >= min(d.previous, max(wanted, config.min_replicas, 1))
            removed = sum(
                x.previous - x.target
                for x in decisions[:-1]
                if x.at > now - 15.0 and x.target < x.previous
            )
            assert d.target >= config.down_limit(d.previous + removed)


def _windowed(decisions: list[ScaleDecision], now: float, window: float) -> list[ScaleDecision]:
    """The evaluations whose recommendation a window holds: those with a signal, from a count
    above zero, within the window (the one now included)."""
    return [
        x
        for x in decisions
        if (x.at > now - window or x is decisions[-1])
        and x.ongoing is not None
        and x.previous > 0
        and x.reason != "Bounds"
    ]


def _held(decisions: list[ScaleDecision]) -> list[int]:
    """What the windows hold of `decisions`: their recommendations, a scale to zero's (0) as 1,
    since zero is the scale-to-zero rule's alone and must not hold a later rise down."""
    return [max(1, x.recommended) for x in decisions]


def test_the_hpa_defaults() -> None:
    config = AutoscalingConfig(max_replicas=100)
    assert (config.min_replicas, config.tolerance, config.target_ongoing_requests) == (1, 0.1, 2)
    assert (config.upscale_stabilization_s, config.downscale_stabilization_s) == (0, 300)
    # Up by max(100 %, 4) per 15 s; down by 100 % per 15 s.
    assert (config.up_limit(1), config.up_limit(10)) == (5, 20)
    assert config.down_limit(10) == 0


def test_scale_down_by_a_percent_rounds_down_so_the_last_replica_can_go() -> None:
    config = AutoscalingConfig(
        min_replicas=0,
        max_replicas=4,
        scale_down_percent=50,
        scale_to_zero_delay_s=5,
        downscale_stabilization_s=0,
    )
    state = initial_state(config, 1, 0.0)
    state, decision, _ = evaluate(config, state, Inputs(0.0), 0.0)  # idle from the start
    assert decision.target == 1
    state, decision, _ = evaluate(config, state, Inputs(0.0), 100.0)
    assert (decision.target, decision.recommended, decision.reason) == (0, 0, "ScaleToZero")
    assert config.down_limit(3) == 1  # HPA: 3 * 50 % = 1.5, truncated
