"""A worker process's own life: read its spec, set the replica's context, take the socket the
runtime bound for it, and run its `Worker` (``worker``) until killed. ``python -m
controller.worker SPEC_FILE`` runs `main`; the fork server calls `run` in each worker it forks."""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

import trio

from .._files import read_regular
from .._ports.context import ReplicaContext, set_context
from .._routing.exchange import HandleError
from .._routing.sources import HTTPSource
from .._serving import handles
from .layout import ROUTES
from .logs import DEFAULT_MAX_BYTES, capture_output
from .worker import Worker


async def serve(spec: dict[str, Any], routes: Path | None = None) -> None:
    spec.setdefault("host", "127.0.0.1")
    set_context(
        ReplicaContext(spec["tag"], spec["backend"], spec["version"], spec["port"], spec["host"])
    )
    if routes is not None:  # read when a handle is first used, and when the daemon moved
        handles.configure(partial(_routes_at, routes), prefer_host=spec["host"])
    worker = Worker(spec)
    # The runtime bound and listened on the socket before starting us and handed it over, so
    # it could connect from the first instant; it stays connectable exactly while we live.
    sock = trio.socket.fromfd(spec["listen_fd"], trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    os.close(spec["listen_fd"])  # fromfd duplicated it
    listener = trio.SocketListener(sock)
    async with trio.open_nursery() as nursery:
        worker.nursery = nursery
        nursery.start_soon(trio.serve_listeners, worker.handle, [listener])
        await worker.build()
        if worker.init_error is None:
            nursery.start_soon(worker.push_load)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m controller.worker SPEC_FILE")
    run(sys.argv[1])


def run(spec_path: str, listen_fd: int | None = None) -> None:
    """Host the replica that the spec file describes, until killed. `listen_fd` is the
    listening socket if not the spec's (a worker forked by the fork server receives it under
    a number of its own)."""
    spec = json.loads(read_regular(spec_path))
    if listen_fd is not None:
        spec["listen_fd"] = listen_fd
    if spec.get("log"):
        capture_output(Path(spec["log"]), int(spec.get("log_max_bytes", DEFAULT_MAX_BYTES)))
        # A fatal signal (SIGSEGV, SIGABRT, SIGBUS) in C code: Python's traceback of every
        # thread goes to the log, written straight to the file (the thread that copies the
        # output's pipe dies with the process). The descriptor stays open for good.
        fault_log = os.open(spec["log"], os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        faulthandler.enable(fault_log, all_threads=True)
    trio.run(serve, spec, Path(spec_path).parent / ROUTES)


def _routes_at(path: Path) -> HTTPSource:
    """The routes a daemon published for this runtime dir's workers (``routes.json``)."""
    found = _read_routes(path)
    if found is None:
        raise HandleError(
            "-",
            "NoRoutes",
            f"no daemon published routes for this runtime ({path} is missing): handles work "
            "in replicas a daemon (`controller run`) started",
        )
    return HTTPSource(*found, locate=partial(_read_routes, path))


def _read_routes(path: Path) -> tuple[str, str] | None:
    try:
        data = json.loads(read_regular(path, limit=64 << 10))
        return str(data["url"]), str(data["token"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
