"""The reading half of a backend: its status, its counts, and what the controller asks of its
state, as read (never written) from outside its loop."""

from __future__ import annotations

import attrs
import trio

from .._model.values.json_values import JSON
from .._model.views.status import BackendNumbers, BackendStatus
from . import view as view
from .canary import Canary
from .loop_state import LoopState


@attrs.frozen
class Reading:
    """What is read of a backend: it holds the backend's state and assigns none of it."""

    _state: LoopState

    @property
    def desired(self) -> int:
        """The replica count it moves to: the autoscaler's (as far as it fits), or the
        config's."""
        return self._state.desired

    @property
    def canary(self) -> Canary:
        """Its canary release (read only: the loop is its writer)."""
        return self._state.canary

    @property
    def blocked(self) -> bool:
        """It starts nothing until its next deploy (DEPLOY_FAILED on its starts)."""
        return self._state.failures.starts_blocked

    @property
    def config_gone_back_to(self) -> tuple[str, JSON] | None:
        """The user config (digest, value) the replicas went back to when this spec's change
        of config failed in one of them (None if it did not)."""
        return (
            self._state.spec.rollback
            if self._state.failures.blocked == "ReconfigureFailed"
            else None
        )

    @property
    def deploy_failed(self) -> bool:
        """DEPLOY_FAILED, for any reason: the same spec deployed again is a new attempt."""
        return self._state.failures.blocked is not None

    # -- views --

    def numbers(self) -> BackendNumbers:
        """Its counts, from those serving and the load book: no replica is walked."""
        state = self._state
        load = state.scaling.load(trio.current_time())
        desired = 0 if state.spec.deleting else state.desired
        ready = len(state.set.serving)
        return BackendNumbers(state.name, desired, ready, load.in_flight, load.queued)

    def status(self, *, summary: bool = False) -> BackendStatus:
        """Its status; a `summary` leaves out replicas and events, and walks no replica."""
        state = self._state
        return view.status_of(
            state.name,
            state.spec,
            None if summary else state.replicas.values(),
            view.Tally.of(state.set.census, state.set.unhealthy, state.set.serving_of),
            state.failures,
            goal=state.goal,
            observed_generation=state.observed_generation,
            converged=state.converged,
            change=state.change,
            journal=state.journal,
            load=state.scaling.load(trio.current_time()),
            desired=state.desired if state.scaling.autoscaled else None,
            autoscaler=state.scaling.status(state.spec.backend_config.num_replicas),
            scaling=state.scaling.under_way,
            revisions=state.revisions,
            canary=state.canary.status(state.spec, trio.current_time()),
        )
