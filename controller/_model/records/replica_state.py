"""Where a replica is in its life, as the controller sees it (stored with it, and shown)."""

from __future__ import annotations

import enum


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
