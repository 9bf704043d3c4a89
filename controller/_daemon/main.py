"""``controller run``: the controller as a long-running service behind its HTTP API.

Start-up goes in an order that makes a failed start change nothing:

1. the config file is checked in full (a fault: exit 2);
2. the state dir is checked (ours, writable by no one else) and locked: one daemon per dir;
3. the API's address is bound, and the ingress's port checked (free, or held by the ingress
   processes an earlier daemon left, which are adopted);
4. the store is opened and read, and the controller recovers: it adopts the live replicas;
5. the config is applied, the API serves, and the ingress processes (`ingress_fleet`) are
   started or adopted: they follow the daemon over its API, in processes of their own.

A failure in 2-4 raises ``StartupError``, one line that says what and what to do; every replica
is left exactly as it was (recovery is the first step that touches one). From the recovery on,
and the stop, the daemon is `serve`'s: this module builds what it runs on.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import secrets
import socket
import sqlite3
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import trio

from .._api.http import route_token
from .._api.metrics import Metrics
from .._api.serving import Serving
from .._core.open import _only_error
from .._files import create_private
from .._leadership.keeper import Leadership, holder_name
from .._model.decisions.lease import LeaseTiming
from .._model.values.errors import CheckpointError, ConfigError, ManifestError, StartupError
from .._ports.runtime import Runtime, log_source
from .._ports.store import LeaseStore
from .._sources import load_manifest
from .ingress_fleet import Fleet
from .ingress_records import stop_leftovers
from .ingress_slot import FleetOptions
from .listen import bound
from .log_format import private_log
from .roles import STARTUP_ERRORS, Roles, leader_status, startup_reason
from .serve import Front, serve
from .statedir import ORPHAN_TIMEOUT_S, STATE_DIR_ENV, TOKEN_ENV, StateDir

logger = logging.getLogger("controller.daemon")

#: The daemon's own log in the state dir: rotated past this size, with this many old files.
LOG_MAX_BYTES = 10 << 20
LOG_BACKUPS = 3


@attrs.frozen
class DaemonOptions:
    state_dir: Path
    """Holds the lock, the token, the address file, the SQLite store, the local workers and the
    daemon's log."""
    listen: str = "127.0.0.1:7070"
    runtime: Literal["local", "ray"] = "local"
    store: Literal["sqlite", "ray"] = "sqlite"
    config: Path | None = None
    pythonpath: Sequence[Path] = ()
    ray_address: str | None = None
    namespace: str = "controller"
    allow_remote: bool = False
    """Listening beyond loopback is meant: no warning."""
    max_replicas: int | None = None
    """How many replicas the runtime holds (per node on Ray); None: the runtime's default."""
    forget_replicas: bool = False
    """Start even if the store names no backend while replicas live (they are stopped)."""
    ingress_listen: str | None = "127.0.0.1:8000"
    """Where the ingress serves traffic to the backends' routes (None: no ingress)."""
    ingress_workers: int = 1
    """Ingress processes sharing that port."""
    access_log: bool = False
    """The ingress logs one line per request."""
    ingress_orphan_timeout_s: float = ORPHAN_TIMEOUT_S
    """How long its ingress processes outlive it when no daemon follows (they stop then)."""
    log_format: str = "human"
    """How the daemon and its ingress processes log: ``human`` or ``json``."""
    fork_server: bool = True
    """LocalRuntime forks workers from a fork server (False: each is a fresh Python)."""
    preload: Sequence[str] = ()
    """Modules LocalRuntime's fork server imports once for all its workers."""
    shared_dir: Path | None = None
    """Where the SQLite store and the local workers are, for daemons that share them (one
    leads, the others stand by); None: the state dir."""
    lease: LeaseTiming = attrs.field(factory=LeaseTiming)
    """How the leader keeps its lease, and how soon a standby takes over."""
    reload: bool = False
    """Restart a backend when its code changes on disk (a development mode)."""
    node_ingress: int | None = None
    """With the Ray runtime: the port of an ingress on the head and on each node holding a
    routed backend's replicas (0: a free port each); None: none of these."""

    def __attrs_post_init__(self) -> None:
        if self.node_ingress is not None and self.runtime != "ray":
            raise ConfigError(
                "node_ingress",
                "needs the Ray runtime (one machine has one ingress)",
                self.node_ingress,
            )


async def run_daemon(options: DaemonOptions) -> None:
    """Run until SIGINT or SIGTERM (replicas keep running, for the next start to adopt) or until
    ``POST /api/v1/shutdown`` (every backend drained and deleted first).

    Daemons sharing one store (``shared_dir``, or Ray's KV) elect a leader through a lease in
    it: one leads (runs the controller), the others stand by (serve the store's view, send
    changes to the leader) and take over when the lease lapses."""
    # Checked before anything is opened: a bad file changes nothing.
    manifest = load_manifest(options.config) if options.config is not None else None
    # Taken out of the environment at once: no child of ours (a worker, a Ray process started
    # here) may inherit it.
    # Stripped, as a client's is: a token with a stray newline would lock everyone out.
    given_token = (os.environ.pop(TOKEN_ENV, None) or "").strip()
    try:
        with (
            StateDir(options.state_dir).locked() as state,
            _file_log(state),
            bound(options.listen, "--listen", warn_remote=not options.allow_remote) as sock,
        ):
            fleet = _fleet(options, state)
            shared = _shared_dir(options, state)
            token = _token(given_token, state, shared)
            metrics = Metrics()
            if "ray" in (options.runtime, options.store):
                # Joining (or starting) a cluster takes seconds: not on the trio thread.
                await trio.to_thread.run_sync(_connect_ray, options)
            with _store(options, shared, alone=shared == state) as store:
                host, port = sock.getsockname()[:2]
                address = f"http://{_url_host(host)}:{port}"
                # Replicas follow the routes (their handles) with a token that reads the
                # watch and nothing else: never the API's own.
                runtime = _runtime(options, shared, (address, route_token(token)))
                node_ingresses = _node_ingresses(options)
                leadership = Leadership(
                    store,
                    holder_name(socket.gethostname(), str(state.path.resolve())),
                    options.lease,
                    address=address,
                )
                serving = Serving(leadership)
                metrics.watch_status(lambda: leader_status(serving))
                metrics.watch_leadership(leadership)
                roles = Roles(
                    manifest,
                    options.config,
                    [*map(str, options.pythonpath), *sys.path],
                    options.forget_replicas,
                    store,
                    runtime,
                    leadership,
                    serving,
                    metrics,
                    reload=options.reload,
                    node_ingresses=node_ingresses,
                )
                try:
                    await serve(
                        roles,
                        state,
                        Front(sock, fleet),
                        token,
                        metrics,
                        log_source(runtime),
                        _keep_token(state, shared, token),
                    )
                except Exception as exc:
                    found = _only_error(exc) if isinstance(exc, BaseExceptionGroup) else exc
                    if not isinstance(found, _SAID_IN_ONE_LINE):
                        # Into daemon.log too, which is closed by the time the CLI prints it.
                        logger.critical("the daemon stops on an unexpected error", exc_info=exc)
                    raise
                finally:
                    # The controller is closed (it acts no more), however the daemon ends: a
                    # standby may take over at once.
                    with trio.move_on_after(options.lease.renew_s * 2, shield=True):
                        await leadership.release()
    # The state dir's files, the store, a checkpoint this controller cannot read, the runtime's
    # directory, Ray missing: all found before recovery touched anything.
    except STARTUP_ERRORS as exc:
        raise StartupError(f"{startup_reason(exc)}; no replica was touched") from None


#: How a start fails that the CLI says in one line; anything else is a fault, logged whole.
_SAID_IN_ONE_LINE = (ManifestError, StartupError, CheckpointError, *STARTUP_ERRORS)


def _new_token() -> str:
    """A fresh API token that does not begin with ``-``: given as ``--token TOKEN``, one that
    did would be taken for an option."""
    while (token := secrets.token_urlsafe(32)).startswith("-"):
        pass
    return token


def _token(given: str, state: StateDir, shared: StateDir) -> str:
    """The API's token: the one given, else the one kept. It outlives a restart, so that
    routers and watchers given it carry on; daemons of one shared dir take its token, so that
    any of them takes a client's (a given token that differs from it is refused)."""
    shared_token = shared.kept_token() if shared != state else None
    if given and shared_token is not None and given != shared_token:
        raise StartupError(
            f"${TOKEN_ENV} is not the token of the shared dir {shared}: daemons of one "
            "store take one token (a client of one is a client of all, and standbys "
            "send changes and load on to the leader with it); unset it, or give the "
            "shared dir's"
        )
    return given or shared_token or state.kept_token() or _new_token()


def _url_host(host: str) -> str:
    """The API's host as others reach it (put in the lease for standbys to send clients to):
    a daemon listening on every interface is reached by its host name."""
    if host in ("0.0.0.0", "::"):
        return socket.gethostname()
    return f"[{host}]" if ":" in host else host


def _shared_dir(options: DaemonOptions, state: StateDir) -> StateDir:
    """Where the store and the workers are: the state dir, or one daemons share."""
    if options.shared_dir is None:
        return state
    shared = StateDir(options.shared_dir)
    shared.check_private(create=True, what="shared dir")
    return shared


def _keep_token(state: StateDir, shared: StateDir, token: str) -> Callable[[], None]:
    def keep() -> None:
        # Written only once the start is past what can fail before serving: a failed start
        # leaves the token of the last good one in place.
        _write_token(state, token)
        if shared != state and shared.kept_token() is None:
            _write_token(shared, token)

    return keep


def _write_token(state: StateDir, token: str) -> None:
    # Written only once the start is past what can fail before serving: a failed start leaves
    # the token of the last good one in place.
    try:
        state.write_token(token)
    except OSError as exc:
        raise StartupError(
            f"cannot write the token {state.token}: {exc.strerror or exc}; the "
            "replicas were adopted and keep running for the next start"
        ) from None


def _fleet(options: DaemonOptions, state: StateDir) -> Fleet | None:
    """The ingress processes this daemon runs (their port checked now), or None; processes an
    earlier daemon left that it will not run are stopped at once."""
    if options.ingress_listen is None:
        stop_leftovers(state)
        return None
    fleet = Fleet(
        state,
        FleetOptions(
            options.ingress_listen,
            options.ingress_workers,
            access_log=options.access_log,
            log_format=options.log_format,
            orphan_timeout_s=options.ingress_orphan_timeout_s,
        ),
        _child_env(),
    )
    fleet.claim()
    return fleet


@contextlib.contextmanager
def _file_log(state: StateDir) -> Iterator[None]:
    """The daemon's log also goes to ``daemon.log`` in the state dir (rotated), in the format
    of its console log."""
    root = logging.getLogger()
    # Fatal signals too (SIGBUS, SIGSEGV): a death by one is then in the log, with a traceback.
    handler = private_log(state.log, LOG_MAX_BYTES, LOG_BACKUPS, fatal_errors=True)
    if root.handlers:
        handler.setFormatter(root.handlers[0].formatter)
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


@contextlib.contextmanager
def _store(options: DaemonOptions, shared: StateDir, *, alone: bool) -> Iterator[LeaseStore]:
    """The store. `alone`: no other daemon shares its file (the state dir's lock makes sure),
    so SQLite may keep its WAL index in this process's memory, not in a mapped ``-shm`` file
    whose fault (truncated, a disk error) would kill the daemon with SIGBUS."""
    if options.store == "ray":
        from ..ray import RayKVStore

        yield RayKVStore(options.namespace)
        return
    from .._stores.sqlite import SQLiteStore
    from .._stores.sqlite_files import check_files

    path = shared.store
    try:
        # SQLite's own errors name none of its files ("attempt to write a readonly database").
        check_files(str(path), shm=not alone)
        create_private(path)
    except (OSError, ConfigError, sqlite3.Error) as exc:
        raise StartupError(f"cannot use the store {path}: {exc}") from None
    with SQLiteStore(path, exclusive=alone) as store:
        yield store


def _runtime(options: DaemonOptions, shared: StateDir, routes: tuple[str, str]) -> Runtime:
    """The runtime, its replicas told where their handles follow the routes."""
    if options.runtime == "ray":
        from ..ray import RayRuntime

        ray_runtime = RayRuntime(
            namespace=options.namespace,
            pythonpath=options.pythonpath,
            max_replicas_per_node=options.max_replicas,
            # An ingress on each node reaches replicas on the others: at their node's address.
            replica_host=None if options.node_ingress is not None else "127.0.0.1",
        )
        ray_runtime.publish_routes(*routes)
        return ray_runtime
    from .._local.runtime import LocalRuntime

    local = LocalRuntime(
        shared.workers,
        pythonpath=options.pythonpath,
        env=_child_env(),
        max_replicas=options.max_replicas,
        fork_server=options.fork_server,
        preload_modules=options.preload,
    )
    local.publish_routes(*routes)
    return local


def _node_ingresses(options: DaemonOptions) -> Any:
    if options.node_ingress is None:
        return None
    from ..ray._node_ingresses import NodeIngresses

    return NodeIngresses(options.namespace, options.node_ingress)


def _child_env() -> dict[str, str]:
    """What replicas and ingress processes get of this process's environment: all but what is
    the daemon's own business."""
    return {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, STATE_DIR_ENV)}


def _connect_ray(options: DaemonOptions) -> None:
    from ..ray import connect

    connect(options.ray_address)
