"""What one pass decides (``decide_pass``), on its own: no runtime, no store, no trio."""

from __future__ import annotations

import math
from typing import Any

import attrs

from controller._model.config.cause import Cause
from controller._model.config.config import BackendConfig
from controller._model.config.replica_config import ReplicaConfig
from controller._model.decisions.autoscale import ScaleDecision, ScaleState
from controller._model.decisions.census import Census
from controller._model.decisions.failures import Blocked
from controller._model.decisions.gate import Gate
from controller._model.decisions.pass_plan import (
    AfterFailure,
    DueCheck,
    HealthState,
    PassState,
    RolloutState,
    Scaled,
    after_failure,
    decide_pass,
)
from controller._model.decisions.reconcile import Plan
from controller._model.decisions.spec import Spec
from controller._model.records.replica_state import ReplicaState
from controller._model.records.revisions import Revision, RevisionBook, content_of, make_revision

from .views import R

S = ReplicaState
NOW = 100.0


def spec(n: int = 2, *, deleting: bool = False, **config: object) -> Spec:
    backend = BackendConfig(num_replicas=n, version="v1", **config)
    return Spec(
        generation=1,
        backend_config=backend,
        replica_config=ReplicaConfig("m:C"),
        deleting=deleting,
        force=False,
        version="v1",
        config_digest="d1",
        code_generation=1,
        revision=1,
    )


IDLE = RolloutState(active=False, revision=1, deadline=math.inf, settled_at=-math.inf)
NO_CHECKS = HealthState(due=(), late=(), rest_at=math.inf, adoptions_due=math.inf)


def state(
    replicas: list[R] | None = None,
    *,
    the_spec: Spec | None = None,
    blocked: Blocked | None = None,
    rollout: RolloutState = IDLE,
    health: HealthState = NO_CHECKS,
    **kwargs: object,
) -> PassState:
    replicas = [R("a"), R("b", seq=1)] if replicas is None else replicas
    values: dict[str, object] = {
        "spec": the_spec or spec(),
        "config_digest": "d1",
        "hands_config": True,
        "blocked": blocked,
        "backoff_until": -math.inf,
        "converged": False,
        "rollout": rollout,
        "scaled": None,
        "health": health,
        "replicas": replicas,
        "census": Census.of(replicas),
    }
    values.update(kwargs)
    return PassState(**values)  # type: ignore[arg-type]


def scaled(
    count: int | None,
    *,
    pending: bool = False,
    unchanged: bool = False,
    wake: float | None = None,
) -> Scaled:
    """An autoscaled backend's count as ``decide_scale`` hands it to the pass."""
    target = 2 if count is None else count
    decision = ScaleDecision(NOW, 1.0, 0, target, target, target, "Steady")
    gate = Gate(pending=pending)
    return Scaled(ScaleState(target), decision, wake, gate, None, count, unchanged=unchanged)


def late(tag: str, *, failures: int = 0, ready_at: float = 0.0) -> DueCheck:
    return DueCheck(tag, failures, "v1", ready_at)


# -- the replica plan --


def test_the_replica_plan_is_reconciles_and_converges() -> None:
    plan = decide_pass(state(), NOW)
    assert plan.replicas == Plan(converged=True)
    assert plan.converged
    assert plan.reached
    assert not plan.forget
    assert plan.num_replicas == 2


def test_the_autoscalers_count_is_the_target() -> None:
    plan = decide_pass(state(scaled=scaled(5)), NOW)
    assert plan.replicas is not None
    assert plan.replicas.start == 3
    assert plan.num_replicas == 5
    assert not plan.converged


def test_a_count_waiting_on_the_runtimes_answer_is_not_converged() -> None:
    plan = decide_pass(state(scaled=scaled(2, pending=True)), NOW)
    assert plan.replicas is not None
    assert plan.replicas.converged
    assert not plan.converged
    assert not plan.reached


def test_a_backoff_defers_starts_until_it_ends() -> None:
    assert decide_pass(state([], backoff_until=NOW + 1), NOW).replicas == Plan()
    assert decide_pass(state([], backoff_until=NOW), NOW).replicas == Plan(start=2)


def test_a_failed_deploy_starts_nothing() -> None:
    plan = decide_pass(state([R("a")], blocked="StartFailures"), NOW)
    assert plan.replicas == Plan()


def test_a_deleted_backend_without_replicas_is_forgotten() -> None:
    plan = decide_pass(state([], the_spec=spec(deleting=True)), NOW)
    assert plan.forget
    assert not plan.reached


def test_only_load_and_the_same_count_skip_the_replica_plan() -> None:
    health = HealthState(due=(), late=(), rest_at=NOW + 3, adoptions_due=NOW + 2)
    plan = decide_pass(state(scaled=scaled(None, unchanged=True, wake=NOW + 5), health=health), NOW)
    assert plan.replicas is None
    assert not plan.reached
    assert not plan.forget
    assert plan.checks == plan.late == ()
    assert plan.wake_at == NOW + 2


# -- the rollout --

ACTIVE = RolloutState(active=True, revision=1, deadline=NOW, settled_at=NOW + 5)


def test_a_rollout_past_its_deadline_fails_and_blocks_starts() -> None:
    plan = decide_pass(state([R("a")], rollout=ACTIVE), NOW)
    assert plan.deadline_failure == (
        "ProgressDeadlineExceeded: no new replica of revision 1 became ready within "
        "progress_deadline_s=600"
    )
    assert not plan.rollout_active
    # Halted: starts none of the replica it lacks.
    assert plan.replicas == Plan()


def test_the_deadline_spares_a_converged_deleted_or_already_failed_rollout() -> None:
    for kwargs in (
        {"converged": True},
        {"the_spec": spec(deleting=True)},
        {"blocked": "StartFailures"},
    ):
        plan = decide_pass(state([R("a")], rollout=ACTIVE, **kwargs), NOW)
        assert plan.deadline_failure is None
    early = attrs.evolve(ACTIVE, deadline=NOW + 1)
    assert decide_pass(state([R("a")], rollout=early), NOW).deadline_failure is None


def test_a_converged_rollout_completes_once_settled() -> None:
    waiting = attrs.evolve(ACTIVE, deadline=NOW + 10)
    plan = decide_pass(state(rollout=waiting), NOW)
    assert plan.converged
    assert not plan.complete
    assert plan.rollout_active
    assert not plan.reached  # within the newest replica's min_ready_s
    assert plan.wake_at == NOW + 5  # when it settles
    settled = attrs.evolve(waiting, settled_at=NOW)
    plan = decide_pass(state(rollout=settled), NOW)
    assert plan.complete
    assert not plan.rollout_active
    assert plan.reached
    assert plan.wake_at == math.inf


# -- health checks --

PERIOD = 10.0


def test_due_checks_start_and_late_ones_fail() -> None:
    health = HealthState(due=("a",), late=(late("b"),), rest_at=NOW + 20, adoptions_due=math.inf)
    plan = decide_pass(state(the_spec=spec(health_check_period_s=PERIOD), health=health), NOW)
    assert plan.checks == ("a",)
    assert plan.late == ("b",)
    assert plan.late_reason == "HealthCheckLate: no answer within health_check_period_s=10"
    assert plan.wake_at == NOW + 10  # the next check, one period on


def test_replicas_the_plan_stops_or_reconfigures_are_not_checked() -> None:
    health = HealthState(due=("a", "b"), late=(), rest_at=math.inf, adoptions_due=math.inf)
    plan = decide_pass(state(the_spec=spec(1, health_check_period_s=PERIOD), health=health), NOW)
    assert plan.replicas is not None
    assert plan.replicas.stop == ("b",)
    assert plan.checks == ("a",)
    replicas = [R("a", config_digest="d0"), R("b", seq=1, config_digest="d0")]
    health = HealthState(due=("a",), late=(), rest_at=math.inf, adoptions_due=math.inf)
    handed = decide_pass(
        state(replicas, the_spec=spec(health_check_period_s=PERIOD), health=health), NOW
    )
    assert handed.replicas is not None
    assert "a" in handed.replicas.reconfigure
    assert handed.checks == ()
    kept = decide_pass(
        state(
            replicas, the_spec=spec(health_check_period_s=PERIOD), health=health, hands_config=False
        ),
        NOW,
    )
    assert kept.checks == ("a",)  # no config to hand: it stays RUNNING


def test_checks_turned_off_drop_the_schedule() -> None:
    health = HealthState(due=("a",), late=(), rest_at=NOW + 1, adoptions_due=math.inf)
    plan = decide_pass(state(the_spec=spec(health_check_period_s=0.0), health=health), NOW)
    assert plan.checks_off
    assert plan.checks == plan.late == ()
    assert plan.wake_at == math.inf


def test_adoptions_that_did_not_answer_are_late_once() -> None:
    health = HealthState(due=(), late=(), rest_at=math.inf, adoptions_due=NOW)
    assert decide_pass(state(health=health), NOW).adoptions_late
    plan = decide_pass(state(health=attrs.evolve(health, adoptions_due=NOW + 1)), NOW)
    assert not plan.adoptions_late
    assert plan.wake_at == NOW + 1


def test_a_late_check_of_a_replica_just_ready_fails_the_rollout() -> None:
    rollout = attrs.evolve(ACTIVE, deadline=NOW + 50)
    config = spec(health_check_period_s=PERIOD, min_ready_s=30.0)
    health = HealthState(
        due=(), late=(late("a", ready_at=NOW - 10),), rest_at=math.inf, adoptions_due=math.inf
    )
    plan = decide_pass(state([R("a")], the_spec=config, rollout=rollout, health=health), NOW)
    assert not plan.rollout_active
    assert plan.deadline_failure is None
    assert plan.wake_at == NOW + 10  # no deadline left to wake for
    settled = HealthState(
        due=(), late=(late("a", ready_at=NOW - 30),), rest_at=math.inf, adoptions_due=math.inf
    )
    plan = decide_pass(state([R("a")], the_spec=config, rollout=rollout, health=settled), NOW)
    assert plan.rollout_active
    assert plan.wake_at == NOW + 10


# -- the wake-up --


def test_the_wake_up_is_the_earliest_timer() -> None:
    health = HealthState(due=(), late=(), rest_at=NOW + 7, adoptions_due=NOW + 9)
    rollout = attrs.evolve(ACTIVE, deadline=NOW + 8)
    plan = decide_pass(
        state([R("a")], rollout=rollout, health=health, scaled=scaled(2, wake=NOW + 6)), NOW
    )
    assert plan.wake_at == NOW + 6
    plan = decide_pass(state([R("a")], rollout=rollout, health=health), NOW)
    assert plan.wake_at == NOW + 7
    assert decide_pass(state([R("a")], rollout=rollout), NOW).wake_at == NOW + 8
    assert decide_pass(state(), NOW).wake_at == math.inf


def test_the_backoff_wakes_it_only_while_it_lasts() -> None:
    plan = decide_pass(state(scaled=scaled(2, wake=NOW + 5)), NOW)
    assert plan.wake(NOW + 2) == NOW + 2
    assert plan.wake(NOW + 9) == NOW + 5
    assert plan.wake(NOW) == NOW + 5  # over already


# -- the verdicts of a failure, on exact inputs --


def _revision(number: int, version: str, **fields: Any) -> Revision:
    content = content_of(BackendConfig(version=version), ReplicaConfig("app:Echo"))
    made = make_revision(number, content, now=0.0, cause=Cause(), code=None, code_generation=1)
    return attrs.evolve(made, **fields)


GOOD_1 = _revision(1, "v1", outcome="complete", good=True)
FAILED_2 = _revision(2, "v2", outcome="failed")


def test_a_failed_rollout_halts_unless_told_to_roll_back() -> None:
    book = RevisionBook([GOOD_1, FAILED_2])
    assert after_failure(book, 2, on_failure="halt", in_canary=False) == AfterFailure(
        None, "the rollout is halted where it is (on_failure=halt)"
    )
    assert after_failure(book, 2, on_failure="rollback", in_canary=False) == AfterFailure(
        1, "rolling back to revision 1 (on_failure=rollback)"
    )


def test_a_canary_goes_back_to_what_it_was_judged_against_whatever_on_failure_says() -> None:
    stable = _revision(3, "v3", outcome="complete", good=True)
    canary = _revision(4, "v4", canary_of=3)
    book = RevisionBook([GOOD_1, stable, canary])
    for on_failure in ("halt", "rollback"):
        assert after_failure(book, 4, on_failure=on_failure, in_canary=True) == AfterFailure(
            3, "the canary is aborted: back to revision 3, the stable one"
        )


def test_a_rollback_with_nowhere_to_go_halts() -> None:
    automatic = _revision(3, "v1", automatic=True)
    assert after_failure(
        RevisionBook([GOOD_1, FAILED_2, automatic]), 3, on_failure="rollback", in_canary=False
    ) == AfterFailure(None, "the automatic rollback failed too: halted")
    assert after_failure(
        RevisionBook([FAILED_2]), 2, on_failure="rollback", in_canary=False
    ) == AfterFailure(
        None, "no earlier revision completed, so there is none to roll back to: halted"
    )
    same = _revision(2, "v1", outcome="failed")  # what failed is the last good release's content
    assert after_failure(
        RevisionBook([GOOD_1, same]), 2, on_failure="rollback", in_canary=True
    ) == AfterFailure(None, "the canary is aborted; the last good revision is what failed: halted")
