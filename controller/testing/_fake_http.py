"""FakeRuntime's replicas of code that a worker would serve (``FakeRuntime(serve_http=True)``):
each built in the test's own process, with a ``controller.worker.context()`` of its own, and
served on a loopback port by the server a worker runs (``_serving``)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence

import trio

from .._local.user_calls import call
from .._model.records.code_report import CodeReport
from .._model.values.errors import ReplicaError
from .._model.values.json_values import JSON
from .._ports.context import ReplicaContext, set_task_context
from .._ports.hosting import host_spec
from .._serving.entry import build
from .._serving.multiplex import Shelf
from .._serving.server import ReplicaServer
from ._fake_replica import FakeReplica, FakeState


async def serve_code(
    replica: FakeReplica,
    pythonpath: Sequence[str],
    nursery: trio.Nursery | None,
    report_load: Callable[[str, int | None, int | None, CodeReport | None], None],
) -> None:
    """Build `replica`'s code (its config handed to it first, as a worker does) and serve it in
    `nursery` on a loopback port, which becomes its address; its load goes to `report_load`.
    Code that serves itself is left as any fake replica is. ``ReplicaError`` (and the replica
    dead) if the code cannot be built."""
    assert nursery is not None, "FakeRuntime.serve is not running"
    spec = host_spec(replica.spec, pythonpath)
    port = _free_port()
    here = ReplicaContext(replica.tag, replica.backend, replica.spec.version, port)
    made: list[ReplicaServer] = []
    failed: list[ReplicaError] = []
    scope = trio.CancelScope()

    async def serve(*, task_status: trio.TaskStatus[None]) -> None:
        set_task_context(here)  # this task's, and its threads' (the build's too)
        try:
            entry = await trio.to_thread.run_sync(build, spec)
            reconfigure = getattr(entry.instance, "reconfigure", None)
            if reconfigure is not None and replica.user_config is not None:
                await call(reconfigure, replica.user_config)  # before it is ready, as a worker
        except Exception as exc:
            failed.append(ReplicaError(replica.tag, type(exc).__name__, str(exc)))
            task_status.started()
            return
        if not entry.served:
            task_status.started()
            return
        server = ReplicaServer(
            entry,
            max_ongoing_requests=replica.spec.serving.max_ongoing_requests,
            request_timeout_s=replica.spec.serving.request_timeout_s,
            shelf=Shelf(),  # its own: the replicas FakeRuntime serves share one process
        )
        made.append(server)

        async def told(load: int, served: int, code: CodeReport | None) -> None:
            if replica.state is not FakeState.DEAD:
                report_load(replica.tag, load, served, code)

        with scope:
            async with trio.open_nursery() as serving:
                await serving.start(server.run, "127.0.0.1", port)
                task_status.started()
                serving.start_soon(server.follow_load, told)

    await nursery.start(serve)
    if failed:
        replica._die(failed[0])
        raise failed[0]
    if made:
        replica.server, replica._server_scope = made[0], scope


async def reconfigure_code(server: ReplicaServer, user_config: JSON) -> tuple[str, str] | None:
    """Hand served code's instance its new config, as a worker does; the error, if it raised."""
    reconfigure = getattr(server.entry.instance, "reconfigure", None)
    if reconfigure is None:
        return None
    try:
        await call(reconfigure, user_config)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return None


def _free_port() -> int:
    # Bound and let go, as LocalRuntime does: a port taken meanwhile shows as a failed start.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
