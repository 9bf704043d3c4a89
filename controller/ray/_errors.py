"""What RayRuntime makes of Ray's answers: errors as the replica's, whether an actor lives, and
a replica's log read through its actor."""

from __future__ import annotations

import json
from typing import Any

import ray
import ray.exceptions
from ray._private import state as ray_state

from .._model.values.errors import ReplicaError
from .._ports.runtime import LogChunk

#: How long a log read waits for the actor's answer.
_LOG_READ_S = 10.0


def is_alive(handle: Any) -> bool:
    """Whether Ray has the actor running (not waiting to be placed, restarting or dead)."""
    # A developer API of Ray, straight to the control store (no dashboard needed).
    info = ray_state.actors(actor_id=handle._actor_id.hex())
    return isinstance(info, dict) and info.get("State") == "ALIVE"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def ray_error(tag: str, exc: ray.exceptions.RayError) -> ReplicaError:
    """What Ray raised for a call to the actor of `tag`, as the replica's error."""
    if isinstance(exc, ray.exceptions.RayActorError):
        return ReplicaError(tag, "ActorDied", first_line(exc))
    return ReplicaError(tag, type(exc).__name__, first_line(exc))


def read_actor_log(handle: Any, offset: int | None, tail: int) -> LogChunk | None:
    """The replica's log as its actor reads it (its process's own output file, on its node);
    None if the actor cannot answer. Blocking: call it in a thread."""
    try:
        reply = ray.get(handle.read_log.remote(offset, tail), timeout=_LOG_READ_S)
    except (ray.exceptions.RayError, TimeoutError):
        return None
    data = json.loads(reply)
    return None if data is None else LogChunk(str(data["text"]), int(data["offset"]))
