"""The runtime's side of one worker process: its start (socket and spec first, then forked or
spawned), the pidfd that holds it, its monitor connection, and its end, awaited, reaped or forced.

The worker's own side is ``worker``; the two ways to start a process are in ``zygote``. How
death is noticed: a "monitor" connection per worker, which the worker never answers; it ends
only when the process does. How exits are awaited: pidfds, which work for workers that are not
our children too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, final

import attrs
import trio

from .._files import write_private
from .._model.decisions.spec import ReplicaSpec
from .._model.values.errors import ReplicaError
from .._ports.hosting import host_spec
from .._procfs import describe_exit, exit_status
from .layout import log_path, pid_path, socket_path, spec_path
from .link import MonitorLink
from .zygote import ForkLost, ForkServer, spawn_python

WORKER_MODULE = "controller.worker"


@final
@attrs.define(eq=False)
class WorkerProcess:
    """A worker process the runtime holds, from its start or adoption until it is gone."""

    tag: str
    pid: int
    pidfd: int
    """Held from start or adoption on, so that a reused pid can never be mistaken for it."""
    killing: bool = False
    """Set when the stop is ours, so that the monitor does not report it as a death."""
    started: bool = False
    """Its start (or adoption) is over: until then a death is its start's failure, which the
    start says (how it ended, its log), not the monitor."""
    exit_status: int | None = None
    """Its wait status, once reaped by us (None if it was not our child)."""
    forked_by: int | None = None
    """The pid of our fork server, if it forked this worker (it is then the worker's parent,
    which reaps it when asked); None if spawned, or forked by an earlier fork server."""
    exited: bool = False
    """Its end was seen (and it was reaped, if that is ours to do)."""
    link: MonitorLink | None = None
    """Its monitor connection, once open (health checks go over it)."""
    _waiting: trio.Lock = attrs.field(factory=trio.Lock)
    """Held by the one task that waits on the pidfd: trio lets one task wait on a descriptor,
    and a stop and the monitor may both wait for the same end (a worker that dies as it is
    stopped); the others wait for the lock, and find it ended."""

    def close(self) -> None:
        """Let go of the pidfd (once): the worker is forgotten."""
        if self.pidfd >= 0:
            # A task still waiting on it (the monitor's watch of the process) is told first.
            trio.lowlevel.notify_closing(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = -1

    @classmethod
    def found(cls, tag: str, pid: int, zygote: int | None) -> WorkerProcess:
        """Hold the worker `pid` of `tag`, found rather than started (``ProcessLookupError`` if
        it is gone); `zygote` is our fork server's pid, if one serves."""
        return cls(tag, pid, os.pidfd_open(pid), forked_by=_forked_by(pid, zygote))

    async def wait_exit(self, fork_server: ForkServer | None) -> None:
        async with self._waiting:
            if self.exited or self.pidfd < 0:
                return  # seen by another waiter, or forgotten by the stop that saw it
            await self._wait_exit(fork_server)
            self.exited = True

    async def _wait_exit(self, fork_server: ForkServer | None) -> None:
        await trio.lowlevel.wait_readable(self.pidfd)
        if self.forked_by is not None and fork_server is not None:
            # Its fork server leaves it a zombie until asked: read how it ended first, while
            # its /proc entry still says, then have it reaped.
            status = exit_status(self.pid, self.pidfd)
            reaped = await fork_server.reap(self.pid, self.forked_by)
            self.exit_status = status if status is not None else reaped
            return
        # Reap it if it is our child (started here, or adopted by a controller reopened in the
        # same process); init reaps the others.
        with contextlib.suppress(ChildProcessError):
            pid, status = os.waitpid(self.pid, os.WNOHANG)  # noqa: ASYNC222  # never blocks
            if pid == self.pid:
                self.exit_status = status

    async def wait_end(self, fork_server: ForkServer | None) -> str:
        """Wait until it has exited; how it ended, in words."""
        await self.wait_exit(fork_server)
        status = self.exit_status
        if status is None and self.pidfd >= 0:
            # Not our child (started by an earlier controller): Linux may still say how it
            # ended, while the pidfd is open.
            status = exit_status(self.pid, self.pidfd)
        return describe_exit(status)

    async def terminate(self, term_timeout_s: float, fork_server: ForkServer | None) -> None:
        """SIGTERM its group, and SIGKILL it if it has not exited within `term_timeout_s`."""
        _signal_group(self.pid, signal.SIGTERM)
        with trio.move_on_after(term_timeout_s):
            await self.wait_exit(fork_server)
            return
        _signal_group(self.pid, signal.SIGKILL)
        await self.wait_exit(fork_server)


async def launch(
    runtime_dir: Path,
    spec: ReplicaSpec,
    *,
    pythonpath: Sequence[str],
    log_max_bytes: int,
    epoch: int,
    fork_server: ForkServer | None,
    python: str,
    env: Callable[[], dict[str, str]],
) -> tuple[WorkerProcess, int]:
    """Start the worker of `spec`: bind its socket, write its spec file, then have
    `fork_server` fork it, or spawn it if there is none or it is not ready. Returns the worker
    and its port."""
    tag = spec.tag
    sock_path = socket_path(runtime_dir, tag)
    port = _free_port()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(sock_path)
        listener.bind(sock_path)
        listener.listen(64)
        spec_file = spec_path(runtime_dir, tag)
        log = log_path(runtime_dir, tag)
        worker_spec: dict[str, Any] = {
            **host_spec(spec, pythonpath),
            "port": port,
            "listen_fd": listener.fileno(),
            "log": str(log),
            "log_max_bytes": log_max_bytes,
            "epoch": epoch,
        }
        await trio.to_thread.run_sync(write_private, Path(spec_file), json.dumps(worker_spec))
        forked = None
        if fork_server is not None:
            try:
                forked = await fork_server.fork(
                    spec_file, str(log), pid_path(runtime_dir, tag), listener
                )
            except ForkLost:
                # Not spawned instead: a worker we do not know of may hold the socket. The
                # controller stops the tag, which finds that worker if it is there.
                raise ReplicaError(
                    tag, "WorkerDied", "the fork server died while forking its worker"
                ) from None
        if forked is None:
            pid = spawn_python(
                python,
                ["-m", WORKER_MODULE, spec_file],
                env(),
                keep_fd=listener.fileno(),
                log_path=log,
            )
            forked_by = None
        else:
            pid, forked_by = forked
    finally:
        listener.close()  # the worker holds its own copy now
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        # Only a forked worker can be gone already (dead, and reaped by init after its fork
        # server died): a spawned one stays our zombie.
        raise ReplicaError(tag, "WorkerDied", "its worker exited at once") from None
    return WorkerProcess(tag, pid, pidfd, forked_by=forked_by), port


def _forked_by(pid: int, zygote: int | None) -> int | None:
    """`zygote` (our fork server's pid) if it is the parent of `pid` (a worker found, not
    started, that it forked in this runtime's life), so that it is asked to reap the worker;
    else None."""
    if zygote is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            parent = int(f.read().rpartition(b")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return zygote if parent == zygote else None


def _signal_group(pid: int, sig: signal.Signals) -> None:
    # start_new_session made the worker a group leader: its group id is its pid, and the group
    # holds whatever the user's code started too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _free_port() -> int:
    # A port the OS just handed out and we released: there is a small window in which another
    # process could take it, which the worker then reports as a failed start.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
