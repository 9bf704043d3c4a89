"""``controller run``: the controller as a long-running service behind its HTTP API."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Literal

import attrs
import hypercorn.config
import hypercorn.trio
import trio

from ._api import Api, HTTPError, apply_manifest
from ._controller import Controller, open_controller
from ._manifest import load_manifest
from ._metrics import Metrics
from ._runtime import Runtime
from ._store import Store

logger = logging.getLogger("controller.daemon")

TOKEN_ENV = "CONTROLLER_TOKEN"
#: How long ``controller shutdown`` waits for every backend to drain before the daemon exits.
SHUTDOWN_TIMEOUT_S = 120.0


@attrs.frozen
class DaemonOptions:
    state_dir: Path
    """Holds the token, the address file, the SQLite store and the local workers' sockets."""
    listen: str = "127.0.0.1:7070"
    runtime: Literal["local", "ray"] = "local"
    store: Literal["sqlite", "ray"] = "sqlite"
    config: Path | None = None
    pythonpath: Sequence[Path] = ()
    ray_address: str | None = None
    namespace: str = "controller"


def token_path(state_dir: Path) -> Path:
    return state_dir / "token"


def address_path(state_dir: Path) -> Path:
    return state_dir / "daemon.json"


def _write_private(path: Path, text: str) -> None:
    # Created 0600 from the start: the token must never be readable by others, even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)


async def run_daemon(options: DaemonOptions) -> None:
    """Run until SIGINT or SIGTERM (replicas keep running, for the next start to adopt) or until
    ``POST /api/v1/shutdown`` (every backend drained and deleted first)."""
    # Checked before anything is opened: a bad file changes nothing.
    manifest = load_manifest(options.config) if options.config is not None else None
    state_dir = options.state_dir
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(32)
    _write_private(token_path(state_dir), token + "\n")
    epoch = secrets.token_hex(8)
    metrics = Metrics()
    with _store(options) as store:
        runtime = _runtime(options)
        async with open_controller(
            runtime=metrics.wrap_runtime(runtime),
            store=metrics.wrap_store(store),
            observer=metrics,
        ) as ctl:
            metrics.watch_status(ctl.status)
            if manifest is not None:
                try:
                    result = await apply_manifest(ctl, manifest, prune=False)
                except HTTPError as exc:
                    logger.error("applying %s: %s", options.config, exc)
                else:
                    names = ", ".join(a["name"] for a in result["applied"])
                    logger.info("applied %s: %s", options.config, names)
            await _serve(ctl, options, token, epoch, metrics)


async def _serve(
    ctl: Controller, options: DaemonOptions, token: str, epoch: str, metrics: Metrics
) -> None:
    stop = trio.Event()
    shutdown_asked = trio.Event()
    app = Api(
        ctl,
        token=token,
        epoch=epoch,
        render_metrics=metrics.render,
        request_shutdown=shutdown_asked.set,
    )
    config = hypercorn.config.Config()
    config.bind = [options.listen]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")  # through our handlers, once
    config.graceful_timeout = 2.0  # long polls end at once; nothing else takes long
    address_file = address_path(options.state_dir)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def on_signal() -> None:
                async for signum in signals:
                    logger.info(
                        "%s: stopping; replicas keep running for the next start to adopt",
                        signal.Signals(signum).name,
                    )
                    stop.set()
                    return

            async def on_shutdown() -> None:
                await shutdown_asked.wait()
                logger.info("shutdown asked: draining and deleting every backend")
                with trio.move_on_after(SHUTDOWN_TIMEOUT_S):
                    goals = [await ctl.delete(b.name) for b in ctl.status().backends]
                    for goal in goals:
                        with contextlib.suppress(Exception):
                            await goal.wait()
                stop.set()

            nursery.start_soon(on_signal)
            nursery.start_soon(on_shutdown)
            # Returns once `stop` is set and the server has closed its connections.
            async with trio.open_nursery() as server:
                binds = await server.start(
                    # hypercorn types the app as its own ASGI union; ours is plain dicts.
                    partial(hypercorn.trio.serve, app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
                )
                url = binds[0]
                _write_private(
                    address_file, json.dumps({"url": url, "pid": os.getpid(), "epoch": epoch})
                )
                logger.info("listening on %s (token in %s)", url, token_path(options.state_dir))
            nursery.cancel_scope.cancel()
    with contextlib.suppress(FileNotFoundError):
        address_file.unlink()


@contextlib.contextmanager
def _store(options: DaemonOptions) -> Iterator[Store]:
    if options.store == "ray":
        _connect_ray(options)
        from .ray import RayKVStore

        yield RayKVStore(options.namespace)
        return
    from ._sqlite_store import SQLiteStore

    with SQLiteStore(options.state_dir / "controller.db") as store:
        yield store


def _runtime(options: DaemonOptions) -> Runtime:
    if options.runtime == "ray":
        _connect_ray(options)
        from .ray import RayRuntime

        return RayRuntime(namespace=options.namespace, pythonpath=options.pythonpath)
    from ._local_runtime import LocalRuntime

    return LocalRuntime(options.state_dir / "w", pythonpath=options.pythonpath)


def _connect_ray(options: DaemonOptions) -> None:
    from .ray import connect

    connect(options.ray_address)
