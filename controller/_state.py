"""The states a replica moves through and the frozen views the controller hands out."""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs

from ._config import BackendConfig, ReplicaConfig


class ReplicaState(enum.Enum):
    """Where one replica is in its life, as the controller sees it."""

    #: Asked of the runtime; not ready yet, so not serving.
    STARTING = "STARTING"
    #: Ready and serving: watchers route to it.
    RUNNING = "RUNNING"
    #: Serving while it takes a new user config in place.
    UPDATING = "UPDATING"
    #: Found alive after a controller restart; being confirmed before it serves again.
    RECOVERING = "RECOVERING"
    #: Out of the watch snapshot, draining, then killed.
    STOPPING = "STOPPING"


#: The states in which a replica takes traffic.
SERVING_STATES = frozenset({ReplicaState.RUNNING, ReplicaState.UPDATING})


class GoalOutcome(enum.Enum):
    """How a goal ended, when it did not fail."""

    #: The backend reached what the call asked for.
    COMPLETED = "COMPLETED"
    #: A later deploy or delete of the same backend replaced this goal before it was reached.
    SUPERSEDED = "SUPERSEDED"


@attrs.frozen
class ServingReplica:
    """One replica in a watch snapshot: where a router may send requests."""

    tag: str
    """The replica's stable name."""
    version: str
    """Its code version."""
    address: str | None
    """Where it listens, as its runtime reports it (None if the runtime has no such notion)."""


@attrs.frozen
class BackendSnapshot:
    """What watchers (routers) need of a backend. A newer snapshot has a larger `snapshot_id`."""

    name: str
    """The backend."""
    snapshot_id: int
    """Grows with every change a watcher should see; compare to skip stale snapshots."""
    backend_config: BackendConfig | None
    """The config the backend is moving to; None once it is deleted (or was never deployed)."""
    replica_config: ReplicaConfig | None
    """How its replicas are built; None once it is deleted."""
    replicas: tuple[ServingReplica, ...]
    """The replicas that serve now, by tag."""

    @property
    def exists(self) -> bool:
        """False for a deleted (or never deployed) backend."""
        return self.backend_config is not None


@attrs.frozen
class ReplicaStatus:
    """One replica, as ``status()`` reports it."""

    tag: str
    """The replica's stable name (``backend#hex``)."""
    state: ReplicaState
    """Where it is in its life."""
    version: str
    """Its code version (``gen-N`` when the backend's config names none)."""
    address: str | None
    """Where it listens, once the runtime has said."""


@attrs.frozen
class BackendStatus:
    """A backend, as ``status(name)`` reports it."""

    name: str
    """The backend."""
    generation: int
    """How many times its spec was changed (deploy or delete)."""
    backend_config: BackendConfig
    """The config it is moving to."""
    replica_config: ReplicaConfig
    """How its replicas are built."""
    deleting: bool
    """True once a delete was asked for."""
    goal_done: bool
    """True when the latest goal is reached (or failed)."""
    message: str
    """What it is doing, in words."""
    last_error: str | None
    """The most recent replica failure, as ``Type: message``."""
    replicas: tuple[ReplicaStatus, ...]
    """Every replica the controller holds for it, by tag."""

    @property
    def counts(self) -> Mapping[ReplicaState, int]:
        """How many replicas are in each state."""
        out: dict[ReplicaState, int] = {}
        for replica in self.replicas:
            out[replica.state] = out.get(replica.state, 0) + 1
        return out


@attrs.frozen
class ControllerStatus:
    """Every backend the controller holds."""

    backends: tuple[BackendStatus, ...]
    """Sorted by name."""

    def __getitem__(self, name: str) -> BackendStatus:
        for backend in self.backends:
            if backend.name == name:
                return backend
        raise KeyError(name)
