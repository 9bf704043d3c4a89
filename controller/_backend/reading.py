"""The reading half of a backend: its status, its counts, and what the controller asks of its
state, as read (never written) from outside its loop."""

from __future__ import annotations

import trio

from .._model.decisions.failures import FailureBook
from .._model.decisions.spec import Spec
from .._model.records.revisions import RevisionBook
from .._model.values.json_values import JSON
from .._model.views.status import BackendNumbers, BackendReason, BackendState, BackendStatus
from . import view as view
from .canary import Canary
from .goal import Goal
from .history import Journal
from .replica import Replica
from .replica_set import ReplicaSet
from .scaling import Scaling


class Reading:
    """What is read of a backend (the ``Backend`` of ``loop``, which sets every attribute named
    here)."""

    name: str
    spec: Spec
    goal: Goal
    revisions: RevisionBook
    journal: Journal
    replicas: dict[str, Replica]
    _set: ReplicaSet
    _failures: FailureBook
    _scaling: Scaling
    _canary: Canary
    _change: tuple[BackendState, BackendReason]
    _observed_generation: int
    _converged: bool

    @property
    def desired(self) -> int:
        raise NotImplementedError

    @property
    def canary(self) -> Canary:
        """Its canary release (read only: the loop is its writer)."""
        return self._canary

    @property
    def blocked(self) -> bool:
        """It starts nothing until its next deploy (DEPLOY_FAILED on its starts)."""
        return self._failures.starts_blocked

    @property
    def config_gone_back_to(self) -> tuple[str, JSON] | None:
        """The user config (digest, value) the replicas went back to when this spec's change
        of config failed in one of them (None if it did not)."""
        return self.spec.rollback if self._failures.blocked == "ReconfigureFailed" else None

    @property
    def deploy_failed(self) -> bool:
        """DEPLOY_FAILED, for any reason: the same spec deployed again is a new attempt."""
        return self._failures.blocked is not None

    # -- views --

    def numbers(self) -> BackendNumbers:
        """Its counts, from those serving and the load book: no replica is walked."""
        load = self._scaling.load(trio.current_time())
        desired = 0 if self.spec.deleting else self.desired
        ready = len(self._set.serving)
        return BackendNumbers(self.name, desired, ready, load.in_flight, load.queued)

    def status(self, *, summary: bool = False) -> BackendStatus:
        """Its status; a `summary` leaves out replicas and events, and walks no replica."""
        return view.status_of(
            self.name,
            self.spec,
            None if summary else self.replicas.values(),
            view.Tally.of(self._set.census, self._set.unhealthy, self._set.serving_of),
            self._failures,
            goal=self.goal,
            observed_generation=self._observed_generation,
            converged=self._converged,
            change=self._change,
            journal=self.journal,
            load=self._scaling.load(trio.current_time()),
            desired=self.desired if self._scaling.autoscaled else None,
            autoscaler=self._scaling.status(self.spec.backend_config.num_replicas),
            scaling=self._scaling.under_way,
            revisions=self.revisions,
            canary=self._canary.status(self.spec, trio.current_time()),
        )
