"""An ingress process of the daemon's: ``python -m controller._daemon.ingress_process
--state-dir DIR --slot N --listen HOST:PORT``, started and supervised by the daemon
(`ingress_fleet`); users do not run it by hand (``controller ingress`` is the command for that).

It follows the daemon of its state dir over the API, finding it (its URL, its token) in the
state dir's files again whenever the daemon cannot be reached or refuses the token: so it goes
on routing on the last snapshot while the daemon restarts, and follows the next one, on
whatever port. It listens on the ingress port beside its siblings (``SO_REUSEPORT``) and on a
Unix socket of its own in the state dir (``ingress/N.PID.sock``), where the daemon reads its
health and metrics; it writes the time into ``ingress/N.PID.beat`` while its loop runs
(`liveness`). Its log is ``ingress/N.log``. Once it serves it writes ``ready`` to its stdout (a
pipe the daemon reads) and lets go of it, so that it can outlive the daemon. SIGUSR1 (from a
daemon that adopts it): it follows the daemon again at once. SIGTERM: it stops taking
connections, lets requests under way finish (at most `DRAIN_S`), and exits. So it does by
itself once no daemon has run in its state dir for ``--orphan-timeout`` seconds (an orphan: a
daemon stopped by a signal that no ``controller run`` followed must not hold its port for ever).
"""

from __future__ import annotations

import argparse
import array
import contextlib
import logging
import logging.handlers
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import attrs
import trio

from ..ingress import HTTPSource, Ingress, IngressConfig, open_listener
from .liveness import keep_beating
from .log_format import private_log, setup_logging
from .statedir import ORPHAN_TIMEOUT_S, StateDir

logger = logging.getLogger("controller.ingress")

#: How long requests under way may take to finish once the process is told to stop.
DRAIN_S = 10.0
#: How often, at most, an ingress that cannot reach its daemon looks whether one holds its
#: state dir.
ORPHAN_LOOK_S = 1.0
LOG_MAX_BYTES = 10 << 20
LOG_BACKUPS = 2


def locate(state: StateDir) -> tuple[str, str] | None:
    """Where the daemon of `state` serves its API now, and its token; None while no daemon
    runs there."""
    url = state.read_address().get("url")
    try:
        token = state.kept_token()
    except OSError:
        return None  # a link planted in its place: as if no daemon ran; the daemon says why
    if not isinstance(url, str) or token is None:
        return None
    return url, token


@attrs.frozen
class Sockets:
    """Where a process listens besides the ingress port: its own Unix sockets."""

    admin: Path
    """Health and metrics, for the daemon."""
    handover: Path
    """Its listening sockets, for the daemon starting its successor."""
    beat: Path
    """Where it writes the time while its loop runs (`liveness`)."""


@attrs.frozen
class Orphan:
    """When a process stops for want of a daemon: none has run in `state` for `timeout_s`."""

    state: StateDir
    timeout_s: float = ORPHAN_TIMEOUT_S


async def serve(
    source: HTTPSource,
    config: IngressConfig,
    host: str,
    port: int,
    sockets: Sockets | None = None,
    on_ready: Callable[[], None] | None = None,
    inherited: Sequence[int] = (),
    orphan: Orphan | None = None,
) -> None:
    """Follow `source` and serve `host`:`port` (with ``SO_REUSEPORT``; on the listening
    sockets `inherited` from a predecessor, if any) and `sockets`, until SIGTERM or SIGINT, or
    until it is an `orphan`; then drain (at most `DRAIN_S`)."""
    if inherited:
        listeners = [_inherit(fd) for fd in inherited]
    else:
        listeners = [await open_listener(host, port, reuse_port=True)]
    tcp = list(listeners)
    try:
        if sockets is not None:
            listeners.append(trio.SocketListener(await _unix_socket(sockets.admin)))
            handover = await _unix_socket(sockets.handover)
        async with trio.open_nursery() as nursery:
            if sockets is not None:
                nursery.start_soon(_hand_over, handover, tcp)
                nursery.start_soon(keep_beating, sockets.beat)
            await _serve(source, config, host, listeners, on_ready, orphan)
            nursery.cancel_scope.cancel()
    finally:
        for listener in tcp:
            listener.socket.close()
        if sockets is not None:
            _remove(sockets.admin)
            _remove(sockets.handover)


def _inherit(fd: int) -> trio.SocketListener:
    sock = socket.socket(fileno=fd)
    sock.set_inheritable(False)
    return trio.SocketListener(trio.socket.from_stdlib_socket(sock))


async def _hand_over(sock: trio.socket.SocketType, tcp: list[trio.SocketListener]) -> None:
    """Give this process's listening sockets to whoever connects (the daemon, starting this
    slot's successor: only this user can reach the socket). The successor accepts on them
    too, so that when this process closes its copies the sockets stay open, and the
    connections the kernel has queued on them are served, not reset."""
    with sock:
        while True:
            conn, _ = await sock.accept()
            with conn:
                fds = [fd for fd in (listener.socket.fileno() for listener in tcp) if fd >= 0]
                rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                with contextlib.suppress(OSError):  # it went away: nothing to give
                    await conn.sendmsg([b"L"], rights if fds else [])


async def _serve(
    source: HTTPSource,
    config: IngressConfig,
    host: str,
    listeners: list[trio.SocketListener],
    on_ready: Callable[[], None] | None,
    orphan: Orphan | None,
) -> None:
    listener = listeners[0]
    ingress = Ingress(source, config)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGUSR1) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(ingress.run)
            served = trio.Event()

            async def serving(task_status: trio.TaskStatus[None]) -> None:
                try:
                    await ingress.serve(listeners, task_status=task_status)
                finally:
                    served.set()

            await nursery.start(serving)
            logger.info(
                "ingress %d serving on http://%s:%d, following %s",
                os.getpid(),
                host,
                listener.socket.getsockname()[1],
                source.describe().removeprefix("the daemon at "),
            )
            if on_ready is not None:
                on_ready()
            async with trio.open_nursery() as told:
                told.start_soon(_until_told_to_stop, signals, ingress, told.cancel_scope)
                if orphan is not None:
                    told.start_soon(_until_orphaned, ingress, orphan, told.cancel_scope)
            ingress.close()
            with trio.move_on_after(DRAIN_S):
                await served.wait()
            nursery.cancel_scope.cancel()


async def _until_told_to_stop(
    signals: AsyncIterator[int], ingress: Ingress, done: trio.CancelScope
) -> None:
    async for signum in signals:
        if signum == signal.SIGUSR1:
            # A daemon has started (and adopted this process): follow it now, not after
            # what is left of the backoff.
            ingress.retry_now()
            continue
        logger.info(
            "%s: closing; requests under way get %gs to finish",
            signal.Signals(signum).name,
            DRAIN_S,
        )
        done.cancel()
        return


async def _until_orphaned(ingress: Ingress, orphan: Orphan, done: trio.CancelScope) -> None:
    """Stop (cancel `done`) once no daemon has held the state dir for the orphan timeout while
    this process could not reach one: the time is counted from when the last daemon let go of
    the state dir (a daemon that holds it but does not answer, or one a moment from starting
    again, is waited for), not from when its API went quiet."""
    while True:
        if ingress.connected:
            await ingress.link_changed()
            continue
        free_since: float | None = None
        while not ingress.connected:
            now = trio.current_time()
            if orphan.state.running():
                free_since = None
            elif free_since is None:
                free_since = now
            elif now - free_since >= orphan.timeout_s:
                logger.warning(
                    "no daemon has run in the state dir %s for %gs (--ingress-orphan-timeout): "
                    "this ingress process stops; `controller run --state-dir %s` starts the "
                    "next ones",
                    *(orphan.state, orphan.timeout_s, orphan.state),
                )
                done.cancel()
                return
            # The state dir's lock tells of no change: it is looked at, a few times a timeout.
            with trio.move_on_after(min(ORPHAN_LOOK_S, orphan.timeout_s / 4)):
                await ingress.link_changed()


async def _unix_socket(path: Path) -> trio.socket.SocketType:
    """A listening Unix socket only this user can reach (the state dir is 0700; it 0600)."""
    _remove(path)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.bind(str(path))
        os.chmod(path, 0o600)
        sock.listen(64)
    except BaseException:
        sock.close()
        raise
    return sock


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _ready() -> None:
    """Tell the daemon (over stdout, a pipe), then let go of the pipe: the process may well
    outlive its reader."""
    with contextlib.suppress(OSError):  # no one reads any more: nothing to tell
        os.write(1, b"ready\n")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m controller._daemon.ingress_process")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--slot", type=int, required=True)
    parser.add_argument("--listen", required=True)
    parser.add_argument(
        "--listen-fd", type=int, action="append", default=[], help="a predecessor's socket"
    )
    parser.add_argument("--access-log", action="store_true")
    parser.add_argument("--orphan-timeout", type=float, default=ORPHAN_TIMEOUT_S)
    parser.add_argument("--log-format", choices=["human", "json"], default="human")
    args = parser.parse_args(argv)
    state = StateDir(args.state_dir)
    setup_logging(
        args.log_format, private_log(state.ingress_log(args.slot), LOG_MAX_BYTES, LOG_BACKUPS)
    )
    # A signal from the daemon's terminal (Ctrl-C) is the daemon's: this process has a session
    # of its own, so it gets none; SIGTERM is how it is told to stop.
    found = locate(state)
    if found is None:
        logger.error("no daemon found in %s (daemon.json, token)", state)
        sys.exit(1)
    source = HTTPSource(found[0], found[1], locate=lambda: locate(state))
    host, _, port = args.listen.rpartition(":")
    config = IngressConfig(access_log=args.access_log)
    try:
        trio.run(
            serve,
            source,
            config,
            host.strip("[]"),
            int(port),
            Sockets(
                state.ingress_socket(args.slot, os.getpid()),
                state.ingress_handover(args.slot, os.getpid()),
                state.ingress_beat(args.slot, os.getpid()),
            ),
            _ready,
            args.listen_fd,
            Orphan(state, args.orphan_timeout),
        )
    except OSError as exc:
        logger.error("cannot serve %s: %s", args.listen, exc)
        sys.exit(1)
    logger.info("ingress %d stopped", os.getpid())


if __name__ == "__main__":
    main()
