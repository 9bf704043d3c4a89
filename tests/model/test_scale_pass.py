"""An autoscaled backend's count as one pass decides it (``decide_scale``): the autoscaler's
evaluation, then the capacity gate (``_model.decisions.gate``), on exact inputs. No runtime, no
trio: the question of room is only decided here, and asked by the backend's executor."""

from __future__ import annotations

import math

from controller import AutoscalingConfig
from controller._model.decisions.autoscale import ScaleState
from controller._model.decisions.census import Census
from controller._model.decisions.gate import RECHECK_ROOM_S, Gate, answered, gate_count
from controller._model.decisions.pass_plan import ScaleInput, decide_scale
from controller._model.records.replica_state import ReplicaState

from .views import R

NOW = 100.0
#: Acts at once: no window, no rate limit beyond doubling.
EAGER = AutoscalingConfig(
    min_replicas=1,
    max_replicas=10,
    target_ongoing_requests=2,
    upscale_stabilization_s=0,
    downscale_stabilization_s=0,
)


def census(*states: ReplicaState) -> Census:
    return Census.of([R(f"r{i}", state, seq=i) for i, state in enumerate(states)])


RUNNING, STARTING, STOPPING = ReplicaState.RUNNING, ReplicaState.STARTING, ReplicaState.STOPPING


# -- the gate --


def test_a_count_within_what_is_held_passes_and_asks_nothing() -> None:
    assert gate_count(Gate(), 3, 3, NOW) == (3, Gate(), None)
    assert gate_count(Gate(short=True), 2, 3, NOW) == (2, Gate(), None)


def test_growth_waits_for_an_answer_to_this_very_count() -> None:
    count, gate, ask = gate_count(Gate(), 5, 2, NOW)
    assert (count, ask) == (2, 5)
    assert gate == Gate(asked=5, asked_at=NOW, pending=True)
    # Asked already: no second question while the first is on its way.
    assert gate_count(gate, 5, 2, NOW + 0.5) == (2, gate, None)
    # The answer: 4 fit. Fresh, it grows the count that far, and falls short of 5.
    gate = answered(gate, 5, 4)
    assert gate == Gate(fits=4, asked=5, asked_at=NOW, answered=5)
    count, after, ask = gate_count(gate, 5, 2, NOW + 0.5)
    assert (count, ask) == (4, None)
    assert after.short
    assert after.next_at == NOW + RECHECK_ROOM_S


def test_an_old_answer_or_one_for_another_count_is_asked_again() -> None:
    gate = answered(Gate(asked=5, asked_at=NOW, pending=True), 5, 4)
    assert gate_count(gate, 5, 2, NOW + RECHECK_ROOM_S)[2] == 5  # too old
    assert gate_count(gate, 6, 2, NOW + 0.1)[2] == 6  # another count


def test_an_answer_to_a_replaced_question_only_ends_the_wait() -> None:
    gate = Gate(asked=6, asked_at=NOW, pending=True)
    assert answered(gate, 5, 9) == Gate(asked=6, asked_at=NOW)


def test_an_answer_never_shrinks_what_is_held() -> None:
    gate = answered(Gate(asked=5, asked_at=NOW, pending=True), 5, 1)
    assert gate_count(gate, 5, 3, NOW)[0] == 3


# -- the evaluation and the gate in one pass --


NO_QUESTION = Gate()


def scale(target: int, ongoing: float | None, gate: Gate = NO_QUESTION) -> ScaleInput:
    return ScaleInput(EAGER, ScaleState(target, busy_at=NOW), ongoing, gate)


def test_more_load_raises_the_target_and_asks_for_room() -> None:
    scaled = decide_scale(scale(2, 8.0), census(RUNNING, RUNNING), "v1", False, NOW)
    assert scaled.decision.changed
    assert scaled.state.target == 4
    assert (scaled.count, scaled.ask) == (2, 4)  # held until the runtime says 4 fit
    assert scaled.gate.pending
    assert not scaled.unchanged


def test_replicas_stopping_hold_no_room() -> None:
    scaled = decide_scale(scale(2, 4.0), census(RUNNING, RUNNING, STOPPING), "v1", False, NOW)
    assert scaled.state.target == 2
    assert (scaled.count, scaled.ask) == (2, None)


def test_replicas_not_serving_yet_count_as_loaded_before_a_scale_down() -> None:
    # Load 2 asks for 1 replica; one of the 3 is still starting, counted as fully loaded.
    both = census(RUNNING, RUNNING, STARTING)
    scaled = decide_scale(scale(3, 2.0), both, "v1", False, NOW)
    assert scaled.decision.not_ready == 1
    assert scaled.state.target == 2
    # Where the load points up they are not counted (the census is not walked for them).
    assert decide_scale(scale(3, 9.0), both, "v1", False, NOW).decision.not_ready == 0


def test_load_alone_that_keeps_the_count_keeps_the_last_plan_and_the_gate() -> None:
    gate = Gate(asked=4, asked_at=NOW - 5, short=True)
    scaled = decide_scale(scale(2, 4.0, gate), census(RUNNING, RUNNING), "v1", True, NOW)
    assert scaled.unchanged
    assert (scaled.count, scaled.ask, scaled.gate) == (None, None, gate)
    # The same count on anything but load: a plan, and the gate decided again.
    scaled = decide_scale(scale(2, 4.0, gate), census(RUNNING, RUNNING), "v1", False, NOW)
    assert not scaled.unchanged
    assert scaled.count == 2
    assert not scaled.gate.short


def test_the_wake_up_is_the_sooner_of_the_windows_and_the_gate() -> None:
    gate = answered(Gate(asked=4, asked_at=NOW, pending=True), 4, 3)
    scaled = decide_scale(scale(4, 8.0, gate), census(RUNNING, RUNNING), "v1", False, NOW)
    assert scaled.count == 3
    assert scaled.gate.short
    assert scaled.wake_at == NOW + RECHECK_ROOM_S
    steady = decide_scale(scale(2, 4.0), census(RUNNING, RUNNING), "v1", False, NOW)
    assert steady.wake_at == (math.inf if steady.wake is None else steady.wake)
