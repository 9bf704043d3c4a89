"""``controller run``: the daemon, in this process. A start that cannot proceed says why in
one line, not with a traceback from inside the daemon's nurseries."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
from pathlib import Path

from .._daemon.log_format import setup_logging
from .._daemon.statedir import ORPHAN_TIMEOUT_S
from .._model.decisions.lease import DURATION_S, RENEW_S, LeaseTiming
from .._model.values.errors import CheckpointError, ConfigError, ManifestError, StartupError
from .client import CLIError
from .ingress import ingress_workers
from .rollout import seconds


def cmd_run(args: argparse.Namespace) -> int:
    import trio

    from .._core.gc import tune_gc
    from .._daemon.main import DaemonOptions, run_daemon

    setup_logging(args.log_format)
    # A fatal signal (SIGBUS from a faulty mapped file, SIGSEGV) says so, with a traceback,
    # rather than ending the daemon without a word; the state dir's log takes it once open.
    with contextlib.suppress(RuntimeError, ValueError):  # no stderr to write to
        faulthandler.enable()
    try:
        lease = LeaseTiming(duration_s=args.lease_duration, renew_s=args.lease_renew)
    except ConfigError as exc:
        option = {"lease_duration_s": "--lease-duration"}.get(exc.field, "--lease-renew")
        raise CLIError(f"controller run: {option}: {exc.rule} (got {exc.value!r})", 2) from None
    if args.node_ingress is not None and args.runtime != "ray":
        raise CLIError("controller run: --node-ingress needs --runtime ray", 2)
    options = DaemonOptions(
        state_dir=args.state_dir,
        listen=args.listen,
        runtime=args.runtime,
        store=args.store,
        config=args.config,
        # Absolute, through its symlinks: what workers import is what revisions pin.
        pythonpath=tuple(Path(os.path.abspath(p)) for p in args.pythonpath),
        ray_address=args.ray_address,
        namespace=args.namespace,
        allow_remote=args.allow_remote,
        max_replicas=args.max_replicas,
        forget_replicas=args.forget_replicas,
        ingress_listen=None if args.no_ingress else args.ingress_listen,
        ingress_workers=args.ingress_workers or os.cpu_count() or 1,
        access_log=args.access_log,
        ingress_orphan_timeout_s=args.ingress_orphan_timeout,
        log_format=args.log_format,
        fork_server=not args.no_fork_server,
        preload=tuple(args.preload),
        shared_dir=args.shared_dir,
        lease=lease,
        reload=args.reload,
        node_ingress=args.node_ingress,
    )
    tune_gc()  # the daemon owns its process
    try:
        trio.run(run_daemon, options)
    except BaseException as exc:
        # A start that cannot proceed says why in one line (exit 1; 2 for a bad config file,
        # with nothing applied), wherever in the daemon's nurseries it was raised.
        found = _one_of(exc, (ManifestError, StartupError, CheckpointError))
        if isinstance(found, ManifestError):
            raise CLIError(str(found), 2) from None
        if found is not None:
            raise CLIError(f"controller run: {found}", 1) from None
        raise
    return 0


def _node_port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to 65535 (got {text!r})")
    return port


def _one_of(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """`exc` if it is one of `kinds`, or the only exception inside (nested) groups of one."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, kinds) else None


def add_run_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="run the controller daemon")
    run.add_argument(
        "--listen", default="127.0.0.1:7070", help="HOST:PORT of the HTTP API (default %(default)s)"
    )
    run.add_argument(
        "--runtime",
        choices=["local", "ray"],
        default="local",
        help="where replicas run: worker processes on this host, or a Ray cluster (default "
        "%(default)s)",
    )
    run.add_argument(
        "--store",
        choices=["sqlite", "ray"],
        default="sqlite",
        help="where the intent is kept: a SQLite file in the state dir (or --shared-dir), or "
        "Ray's KV store (default %(default)s)",
    )
    run.add_argument("--config", type=Path, help="a backends file to apply at start")
    run.add_argument(
        "--pythonpath",
        type=Path,
        action="append",
        default=[],
        help="a directory replicas import their entrypoints from, before the daemon's own "
        "path (repeatable); fixed for the daemon's life: another directory takes a restart",
    )
    run.add_argument("--ray-address", help="a running Ray cluster (with --runtime/--store ray)")
    run.add_argument(
        "--namespace", default="controller", help="the Ray namespace (default %(default)s)"
    )
    run.add_argument(
        "--log-format",
        choices=["human", "json"],
        default="human",
        help="log lines for people, or one JSON object each (default %(default)s)",
    )
    run.add_argument(
        "--allow-remote",
        action="store_true",
        help="listening beyond loopback is meant (plain HTTP, bearer token): no warning",
    )
    run.add_argument(
        "--max-replicas",
        type=_positive_int,
        help="how many replicas the runtime holds (per node on Ray); default: from memory",
    )
    run.add_argument(
        "--forget-replicas",
        action="store_true",
        help="the store is lost for good: stop the replicas of an earlier daemon it no longer "
        "names (without this, an empty store beside live replicas stops the start)",
    )
    run.add_argument(
        "--ingress-listen",
        default="127.0.0.1:8000",
        help="HOST:PORT of the ingress, which routes traffic to the backends (%(default)s)",
    )
    run.add_argument("--no-ingress", action="store_true", help="serve no ingress")
    run.add_argument(
        "--node-ingress",
        type=_node_port,
        metavar="PORT",
        help="with --runtime ray: an ingress on the head and on every node holding a routed "
        "backend's replicas, each on its node's address at PORT (0: a free port on each, for "
        "several nodes on one machine)",
    )
    run.add_argument(
        "--reload",
        action="store_true",
        help="development mode: when a backend's code changes on disk (looked at every 0.5 "
        "seconds, acted on once it stops changing), restart that backend as `rollout restart` "
        "does",
    )
    run.add_argument(
        "--ingress-workers",
        type=ingress_workers,
        default=None,
        metavar="N",
        help="ingress processes sharing the port (SO_REUSEPORT); default: one per core",
    )
    run.add_argument(
        "--shared-dir",
        type=Path,
        help="the store and the local workers, shared by daemons on this host: one leads, the "
        "others stand by and take over (default: the state dir)",
    )
    run.add_argument(
        "--lease-duration",
        type=seconds,
        default=DURATION_S,
        help="how long a leader may go without renewing its lease before a standby takes over, "
        "in seconds (default %(default)g)",
    )
    run.add_argument(
        "--lease-renew",
        type=seconds,
        default=RENEW_S,
        help="how often the leader renews and standbys read the lease, in seconds (default "
        "%(default)g; at most a third of --lease-duration)",
    )
    run.add_argument("--access-log", action="store_true", help="the ingress logs each request")
    run.add_argument(
        "--ingress-orphan-timeout",
        type=seconds,
        default=ORPHAN_TIMEOUT_S,
        metavar="SECONDS",
        help="seconds the ingress processes keep serving once no daemon runs in the state dir "
        "(stopped by a signal, none started again): then they stop and let go of the port "
        "(default %(default)g)",
    )
    run.add_argument(
        "--no-fork-server",
        action="store_true",
        help="start each local worker as a fresh Python, not forked from a fork server",
    )
    run.add_argument(
        "--preload",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module the fork server imports once for all local workers (repeatable)",
    )
    run.set_defaults(func=cmd_run)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1 (got {text})")
    return value
