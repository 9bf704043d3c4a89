"""A replica as the pure decisions see it (``reconcile.ReplicaView``), for their tests."""

from __future__ import annotations

import attrs

from controller._model.records.replica_state import ReplicaState


@attrs.frozen
class R:
    tag: str
    state: ReplicaState = ReplicaState.RUNNING
    version: str = "v1"
    config_digest: str = "d1"
    seq: int = 0
    healthy: bool = True
    node: str | None = None
    served: bool = True
