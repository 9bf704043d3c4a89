"""A backend's state: one object, written by its loop (the reducer applies events to it, the
pass records what it decided) and read by everything else (``reading``).

It holds the parts that keep state of their own (the replica set, the failure book, the load
book and autoscaler, the canary, the journal, the revision book) beside the few plain facts a
pass leaves behind, so that the loop's halves share one object rather than one ``self``."""

from __future__ import annotations

import attrs

from .._model.decisions.failures import FailureBook
from .._model.decisions.spec import Spec
from .._model.records.revisions import RevisionBook
from .._model.values.json_values import JSON
from .._model.views.status import BackendReason, BackendState
from .canary import Canary
from .goal import Goal
from .history import Journal
from .replica import Replica
from .replica_set import ReplicaSet
from .scaling import Scaling


@attrs.define(eq=False)
class LoopState:
    name: str
    spec: Spec
    goal: Goal
    revisions: RevisionBook
    """Its revisions, read here: the desk adds them, and marks what the rollout reports."""
    journal: Journal
    set: ReplicaSet
    failures: FailureBook
    scaling: Scaling
    canary: Canary
    change: tuple[BackendState, BackendReason]
    """What the latest spec change is (UPDATING and why, say), for the status."""
    observed_generation: int = 0
    converged: bool = False
    restored: bool = False
    """Rebuilt from a checkpoint before its task ran (its rollout resumes, not begins)."""
    forgotten: bool = False
    """Deleted, and its records gone from the store."""

    @property
    def replicas(self) -> dict[str, Replica]:
        return self.set.by_tag

    @property
    def desired(self) -> int:
        """The replica count it moves to: the autoscaler's (as far as it fits), or the
        config's."""
        return self.scaling.desired(self.spec.backend_config.num_replicas)

    def config_to_hold(self) -> tuple[str, JSON]:
        """The user config (digest, value) its replicas hold: the spec's, or the one before it
        when the spec's change of config failed in a replica."""
        return self.spec.config_to_hold(rolled_back=self.failures.blocked == "ReconfigureFailed")
