"""A backend's failure book and the verdicts on failures (`_model/decisions/failures.py`), with
exact times: what a change of the nodes does to the backoff of starts that no node would take,
and what a replica's death, failed check, failed start or failed reconfigure does to it, its
rollout and its canary."""

from __future__ import annotations

import random

import attrs

from controller import RestartPolicy
from controller._model.decisions.failures import (
    FailureBook,
    FailureInputs,
    FailureVerdict,
    ReconfigureFailure,
    ReplicaFailure,
    StartFailure,
    judge_failures,
    replaces_unhealthy,
)


def book() -> FailureBook:
    return FailureBook(RestartPolicy(jitter=0), random.Random(0))


def test_a_change_of_the_nodes_ends_the_backoff_of_starts_no_node_would_take() -> None:
    """Found by a loaded run of the suite: starts refused while the only node was cordoned
    backed off longer each time, and once it was uncordoned the next start waited out what was
    left of the backoff (over a minute), not starting at once as a pending pod would."""
    failures = book()
    for now in range(10):
        failures.failed(float(now), "Unschedulable: this machine is cordoned or drained")
    assert failures.deferred(10.0)
    failures.nodes_changed()
    assert not failures.deferred(10.0)


def test_a_change_of_the_nodes_leaves_a_crash_loop_s_backoff() -> None:
    failures = book()
    failures.failed(0.0, "Unschedulable: this machine is cordoned or drained")
    failures.failed(1.0, "ValueError: bad port")  # the last failure is the code's own
    failures.nodes_changed()
    assert failures.deferred(1.5)


def test_a_replica_is_replaced_at_the_health_threshold_not_before() -> None:
    assert [replaces_unhealthy(n, 3) for n in range(5)] == [False, False, False, True, True]
    assert replaces_unhealthy(1, 1)


#: A rollout of revision 2 (version v2) under way, min_ready_s 10, three checks in a row.
ROLLING = FailureInputs(
    rollout_active=True,
    blocked=None,
    version="v2",
    revision=2,
    min_ready_s=10.0,
    threshold=3,
    canary_version=None,
)


def died(
    tag: str, version: str = "v2", ready_at: float = 100.0, at: float = 104.0
) -> ReplicaFailure:
    return ReplicaFailure(tag, version, "killed", ready_at, at)


def unhealthy(
    tag: str, checks: int, version: str = "v2", ready_at: float = 100.0, at: float = 104.0
) -> ReplicaFailure:
    return ReplicaFailure(tag, version, "slow", ready_at, at, checks_failed=checks)


def test_a_new_replica_that_dies_within_min_ready_fails_the_rollout_once() -> None:
    first, second = died("a#1"), died("a#2", at=105.0)
    assert judge_failures([first, second], ROLLING) == [
        FailureVerdict(
            first,
            "replica a#1 of revision 2 died: killed, 4s after it became ready (min_ready_s=10)",
            aborts_canary=False,
            replaced=True,
        ),
        # The rollout has failed already: the second death only replaces its replica.
        FailureVerdict(second, None, aborts_canary=False, replaced=True),
    ]


def test_no_rollout_fails_past_min_ready_for_an_old_version_or_with_none_under_way() -> None:
    late = died("a#1", at=110.0)  # ready exactly min_ready_s ago
    old = died("a#2", version="v1")
    blocked = died("a#3")
    for failure, inputs in [
        (late, ROLLING),
        (old, ROLLING),
        (blocked, attrs.evolve(ROLLING, blocked="StartFailures")),
        (died("a#4"), attrs.evolve(ROLLING, rollout_active=False)),
    ]:
        (verdict,) = judge_failures([failure], inputs)
        assert verdict == FailureVerdict(failure, None, aborts_canary=False, replaced=True)


def test_a_failed_check_replaces_its_replica_only_at_the_threshold() -> None:
    settled = attrs.evolve(ROLLING, rollout_active=False)
    below, at = unhealthy("a#1", 2), unhealthy("a#2", 3)
    assert judge_failures([below, at], settled) == [
        FailureVerdict(below, None, aborts_canary=False, replaced=False),
        FailureVerdict(at, None, aborts_canary=False, replaced=True),
    ]
    # Below the threshold, within min_ready_s of a rollout: the rollout fails all the same.
    (verdict,) = judge_failures([below], ROLLING)
    assert verdict.fails_rollout is not None
    assert verdict.fails_rollout.startswith("replica a#1 of revision 2 failed a health check: slow")
    assert not verdict.replaced


def test_a_replica_replaced_then_dead_in_one_burst_is_judged_once() -> None:
    settled = attrs.evolve(ROLLING, rollout_active=False)
    check, death = unhealthy("a#1", 3), died("a#1")
    assert judge_failures([check, death], settled) == [
        FailureVerdict(check, None, aborts_canary=False, replaced=True)
    ]
    # Not yet replaced by its check: its death is judged.
    below = unhealthy("a#1", 1)
    assert [v.failure for v in judge_failures([below, death], settled)] == [below, death]


def test_a_canary_replica_replaced_aborts_the_canary_once() -> None:
    judging = attrs.evolve(ROLLING, canary_version="v2", min_ready_s=0.0)
    stable, canary, again = died("a#1", "v1"), died("a#2"), unhealthy("a#3", 3)
    assert [v.aborts_canary for v in judge_failures([stable, canary, again], judging)] == [
        False,
        True,
        False,
    ]
    # A failed check below the threshold keeps its replica, and the canary.
    assert not judge_failures([unhealthy("a#2", 1)], judging)[0].aborts_canary


def test_a_canary_replica_that_fails_the_rollout_leaves_the_abort_to_the_rollout() -> None:
    judging = attrs.evolve(ROLLING, canary_version="v2")
    (verdict,) = judge_failures([died("a#2")], judging)
    assert verdict.fails_rollout is not None
    assert not verdict.aborts_canary  # the failed rollout aborts its canary itself


def start_failed(tag: str, in_a_row: int) -> StartFailure:
    return StartFailure(tag, "v2", "ImportError: no module", None, in_a_row)


def test_the_third_failed_start_in_a_row_fails_the_deploy_once() -> None:
    counted = book()
    runs = [counted.count_start(True, "ImportError: no module") for _ in range(4)]
    assert runs == [1, 2, 3, 4]
    failures = [start_failed(f"a#{n}", n) for n in runs]
    verdicts = judge_failures(failures, ROLLING)
    assert [v.fails_rollout for v in verdicts] == [
        None,
        None,
        "3 consecutive replica starts failed; last: ImportError: no module",
        None,  # failed already: a fourth only backs off
    ]
    assert not any(v.replaced or v.aborts_canary for v in verdicts)


def test_failed_starts_fail_no_deploy_once_a_replica_was_ready_or_of_another_version() -> None:
    assert book().count_start(False, "old version's crash") == 0
    proven = attrs.evolve(ROLLING, proven=True)
    for failure, inputs in [
        (start_failed("a#3", 3), proven),
        (start_failed("a#4", 0), ROLLING),  # another version's start
        (start_failed("a#5", 5), attrs.evolve(ROLLING, blocked="CanaryAborted")),
    ]:
        assert judge_failures([failure], inputs)[0].fails_rollout is None
    # max_failed_starts 1: the first failed start of the target fails it.
    first = start_failed("a#1", 1)
    assert judge_failures([first], attrs.evolve(ROLLING, max_failed_starts=1))[0].fails_rollout


def test_a_failed_start_that_fails_the_deploy_leaves_a_later_death_unjudged() -> None:
    """Once the starts failed the deploy, a new replica's death no longer fails it again."""
    verdicts = judge_failures([start_failed("a#3", 3), died("a#1")], ROLLING)
    assert verdicts[0].fails_rollout is not None
    assert verdicts[1] == FailureVerdict(died("a#1"), None, aborts_canary=False, replaced=True)


def test_a_failed_in_place_reconfigure_halts_the_change_once_and_replaces_otherwise() -> None:
    in_place = attrs.evolve(ROLLING, in_place=True)
    first = ReconfigureFailure("a#1", "ValueError: bad threshold", to_spec=True)
    second = ReconfigureFailure("a#2", "ValueError: bad threshold", to_spec=True)
    assert judge_failures([first, second], in_place) == [
        FailureVerdict(
            first,
            "the new user config failed in replica a#1: ValueError: bad threshold",
            aborts_canary=False,
            replaced=False,  # taken back to the config before, by the plan
        ),
        FailureVerdict(second, None, aborts_canary=False, replaced=True),
    ]
    back = ReconfigureFailure("a#3", "OSError: disk full", to_spec=False)  # to the old config
    for failure, inputs in [(back, in_place), (first, ROLLING)]:
        assert judge_failures([failure], inputs) == [
            FailureVerdict(failure, None, aborts_canary=False, replaced=True)
        ]
