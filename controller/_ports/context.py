"""What a replica can learn about where it runs: ``controller.worker.context()``.

Kept free of heavy imports (no trio), because every replica process imports it.
"""

from __future__ import annotations

import contextvars

import attrs


@attrs.frozen
class ReplicaContext:
    """What a replica may want to know about where it runs (``controller.worker.context()``)."""

    tag: str
    """The replica's stable name."""
    backend: str
    """Its backend."""
    version: str
    """Its code version."""
    port: int
    """A TCP port the runtime reserved for it on `host`, e.g. to serve HTTP on."""
    host: str = "127.0.0.1"
    """The address to serve on, at which routers reach it: loopback for LocalRuntime; for
    RayRuntime, loopback or the node's IP, as the runtime was told."""


_context: ReplicaContext | None = None
#: A replica's own, where several share one process (FakeRuntime's served code): set in its
#: tasks (and so in the threads they start), it wins over the process's.
_here: contextvars.ContextVar[ReplicaContext | None] = contextvars.ContextVar(
    "replica_context", default=None
)


def context() -> ReplicaContext:
    """The running replica's context; only inside a replica started by LocalRuntime or
    RayRuntime (or served by FakeRuntime)."""
    value = _here.get()
    if value is None:
        value = _context
    if value is None:
        raise RuntimeError("controller.worker.context() is only available inside a replica")
    return value


def set_context(value: ReplicaContext) -> None:
    """For runtimes: what ``context()`` returns in this process from now on."""
    global _context
    _context = value


def replica_only() -> contextvars.Context:
    """A fresh context that carries this task's replica (and nothing of its request): for a
    task that outlives the request that starts it, serving the replica's other requests too."""
    fresh = contextvars.Context()
    fresh.run(_here.set, _here.get())
    return fresh


def set_task_context(value: ReplicaContext) -> None:
    """For runtimes that run several replicas in one process: what ``context()`` returns in the
    calling task from now on, and in the tasks and threads it starts."""
    _here.set(value)
