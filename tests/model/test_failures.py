"""A backend's failure book (`_model/decisions/failures.py`), with exact times: what a change
of the nodes does to the backoff of starts that no node would take."""

from __future__ import annotations

import random

from controller import RestartPolicy
from controller._model.decisions.failures import FailureBook


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
