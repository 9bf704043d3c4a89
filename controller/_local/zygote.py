"""How LocalRuntime starts processes: ``posix_spawn`` of a fresh Python, and the fork server.

The fork server (the "zygote", ``zygote_main``) is a Python that has imported the worker's
machinery once; asked, it forks a worker from itself, which is ready in milliseconds where a
spawned one takes a fresh interpreter and its imports. This module is the runtime's side of it:
`ForkServer` starts the zygote in the background (a runtime's start never waits for it: until it
is ready, workers are spawned), speaks with it over a socketpair, and kills it when the runtime
closes. Its workers outlive it, as spawned ones outlive the controller.
"""

from __future__ import annotations

import array
import contextlib
import json
import logging
import os
import signal
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, final

import attrs
import trio

from .._procfs import describe_exit, inheritable_fds
from .logs import read_log

logger = logging.getLogger("controller")

ZYGOTE_MODULE = "controller._local.zygote_main"
# A request is answered in a millisecond or two (a fork); one that takes this long is stuck.
_REPLY_TIMEOUT_S = 10.0
_MAX_MESSAGE = 64 << 10
# How long a killed zygote may take to be gone before the runtime stops waiting (it is reaped
# when this process exits, if not before).
_KILL_WAIT_S = 1.0


def spawn_python(
    python: str, args: Sequence[str], env: Mapping[str, str], *, keep_fd: int, log_path: Path
) -> int:
    """Start ``python -P ARGS`` in a session of its own, with exactly four descriptors: stdin
    from /dev/null, `log_path` on stdout and stderr (appended to, never through a symlink, 0600)
    and `keep_fd` (under its own number). Call it from the trio thread only (see below)."""
    # posix_spawn rather than subprocess: a Popen object warns when it is collected while its
    # child runs, and outliving the controller is exactly what a worker is for.
    #
    # Whatever else this process holds without close-on-exec (an embedding app's listening
    # socket, say) is closed in the child: a worker holding the daemon's port would keep it in
    # LISTEN after the daemon exits. Spawns run on the trio thread, one at a time, so no other
    # spawn sees `keep_fd` inheritable.
    closes = [(os.POSIX_SPAWN_CLOSE, other) for other in inheritable_fds({0, 1, 2, keep_fd})]
    os.set_inheritable(keep_fd, True)
    try:
        return os.posix_spawn(
            python,
            # -P: the daemon's working directory is not put on the child's sys.path, so that
            # no file there can pose as the `controller` package.
            [python, "-P", *args],
            env,
            file_actions=[
                *closes,
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (
                    os.POSIX_SPAWN_OPEN,
                    1,
                    str(log_path),
                    os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                    0o600,
                ),
                (os.POSIX_SPAWN_DUP2, 1, 2),
            ],
            setsid=True,  # own session and process group: outlives us, dies as a group
        )
    finally:
        os.set_inheritable(keep_fd, False)


class ForkLost(Exception):
    """The zygote died or stuck after a fork request was sent: a worker may have been forked,
    or not. (Not a fallback case: a worker nobody knows of could hold the replica's socket.)"""


@final
@attrs.define(eq=False)
class _Zygote:
    pid: int
    pidfd: int
    sock: trio.socket.SocketType
    ready: bool = False
    """It sent its greeting and has not died or stuck since."""


@final
class ForkServer:
    """The runtime's side of the zygote. `run` keeps one (see there); `fork` asks it for a
    worker, `reap` for a dead worker's reaping.

    `env` gives the zygote's environment when it starts, which its workers inherit; `pythonpath`
    is put in front of its ``sys.path`` before it imports the `preload` modules; `log_path`
    takes its stderr (what it says when a preload fails, and any traceback of a worker's
    before the worker's own log is in place)."""

    def __init__(
        self,
        runtime_dir: Path,
        *,
        python: str,
        pythonpath: Sequence[str],
        env: Callable[[], Mapping[str, str]],
        preload: Sequence[str],
        log_path: Path,
    ):
        self._runtime_dir = runtime_dir
        self._python = python
        self._pythonpath = list(pythonpath)
        self._env = env
        self._preload = list(preload)
        self.log_path = log_path
        self._zygote: _Zygote | None = None
        self._failed = False
        """It could not start: workers are spawned for the runtime's life."""
        self._lock = trio.Lock()  # one request at a time: the zygote answers in order
        self._wanted = trio.Event()  # a restart is asked for
        self._changed = trio.Event()  # ready, dead or failed: for wait_ready

    @property
    def pid(self) -> int | None:
        """The zygote's pid while it serves."""
        zygote = self._zygote
        return zygote.pid if zygote is not None and zygote.ready else None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep a zygote: start one at once; after one died, start another when a start (or
        `wait_ready`) asks, so that a zygote that keeps dying costs one process per start at
        most. Returns, leaving starts to spawn for good, if one fails to become ready (a
        failing preload, an interpreter that cannot run it): that is a fault to fix, not to
        retry. Kills the zygote when cancelled. Started at once: it does not wait for the
        zygote to be ready."""
        # Afresh for each run (a runtime may be served again, in another trio run).
        self._failed = False
        self._lock = trio.Lock()
        self._wanted = trio.Event()
        self._changed = trio.Event()
        task_status.started()
        try:
            while True:
                if not await self._run_one():
                    return
                await self._wanted.wait()
        except Exception:
            # A fault of ours must not take the runtime down with it: workers can be spawned.
            logger.exception("fork server failed; replicas start by spawning")
        finally:
            self._failed = True
            self._notify()
            zygote, self._zygote = self._zygote, None
            if zygote is not None:
                await self._kill(zygote)

    async def _run_one(self) -> bool:
        """Start a zygote and serve until it dies: False if it never became ready."""
        try:
            zygote = self._launch()
        except OSError as exc:
            logger.warning(
                "fork server: cannot start %s (%s); replicas start by spawning", self._python, exc
            )
            return False
        self._zygote = zygote
        try:
            hello = _decode(await zygote.sock.recv(_MAX_MESSAGE))
        except OSError:
            hello = {}
        if not hello.get("ok"):
            status = await self._kill(zygote)
            self._zygote = None
            error = str(hello.get("error") or "").strip()
            if error:
                why = error.splitlines()[-1]
            else:
                ended = describe_exit(status).removeprefix("worker process ")
                why = f"it ended before it was ready ({ended})"
                why += await trio.to_thread.run_sync(self._log_tail)
            logger.warning(
                "fork server did not start: %s; replicas start by spawning (log: %s)",
                why,
                self.log_path,
            )
            return False
        # Fresh before the zygote may die, so that no ask for the next one is lost.
        self._wanted = trio.Event()
        zygote.ready = True
        self._notify()
        await trio.lowlevel.wait_readable(zygote.pidfd)
        zygote.ready = False
        status = await self._kill(zygote)  # dead already: this reaps it
        self._zygote = None
        self._notify()
        logger.warning(
            "fork server (pid %d) %s; replicas start by spawning until a new one, started "
            "at the next start, is ready",
            zygote.pid,
            describe_exit(status).removeprefix("worker process "),
        )
        return True

    def _launch(self) -> _Zygote:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            args = [
                "-m",
                ZYGOTE_MODULE,
                str(self._runtime_dir),
                "--control-fd",
                str(theirs.fileno()),
                "--parent",
                str(os.getpid()),
            ]
            for entry in self._pythonpath:
                args += ["--pythonpath", entry]
            for name in self._preload:
                args += ["--preload", name]
            pid = spawn_python(
                self._python,
                args,
                self._env(),
                keep_fd=theirs.fileno(),
                log_path=self.log_path,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()  # the zygote's own copy is the one that counts
        return _Zygote(pid, os.pidfd_open(pid), trio.socket.from_stdlib_socket(ours))

    async def _kill(self, zygote: _Zygote) -> int | None:
        """Kill and reap `zygote` (our child); its wait status. Its workers live on: they are in
        sessions of their own, and init becomes their parent."""
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(zygote.pidfd, signal.SIGKILL)
        status = None
        with trio.move_on_after(_KILL_WAIT_S, shield=True):
            await trio.lowlevel.wait_readable(zygote.pidfd)
            with contextlib.suppress(ChildProcessError):
                _, status = os.waitpid(zygote.pid, os.WNOHANG)  # noqa: ASYNC222  # never blocks
        os.close(zygote.pidfd)
        zygote.sock.close()
        return status

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _log_tail(self) -> str:
        chunk = read_log(self.log_path, tail=1, max_bytes=4096)
        last = chunk.text.strip() if chunk is not None else ""
        return f"; its log ends: {last}" if last else ""

    async def wait_ready(self) -> bool:
        """Wait until a zygote serves (asking for one if the last died): True; False once
        there will be none (it failed to start, or the runtime is closing)."""
        while True:
            if self._failed:
                return False
            if self.pid is not None:
                return True
            changed = self._changed
            self._wanted.set()
            await changed.wait()

    async def fork(
        self, spec_path: str, log_path: str, pid_file: str, listener: socket.socket
    ) -> tuple[int, int] | None:
        """A worker forked by the zygote, given the replica's listening socket: its pid and the
        zygote's. None if no zygote serves (the caller spawns the worker instead; a dead zygote
        is replaced in the background). Raises ForkLost if the zygote died or stuck once asked."""
        zygote = self._zygote
        if zygote is None or not zygote.ready:
            self._wanted.set()
            return None
        request = {"op": "fork", "spec": spec_path, "log": log_path, "pid_file": pid_file}
        reply = await self._call(zygote, request, listener.fileno())
        if reply is None:
            return None
        pid = reply.get("pid")
        if not reply.get("ok") or not isinstance(pid, int):
            # It could not fork (no memory, too many processes): spawning will say so too.
            logger.warning("fork server could not fork: %s", reply.get("error"))
            return None
        return pid, zygote.pid

    async def reap(self, pid: int, forked_by: int) -> int | None:
        """Have the zygote `forked_by` reap its exited worker `pid`: its wait status, or None
        if that zygote is gone (init reaped the worker, or will)."""
        zygote = self._zygote
        if zygote is None or zygote.pid != forked_by or not zygote.ready:
            return None
        try:
            reply = await self._call(zygote, {"op": "reap", "pid": pid})
        except ForkLost:
            return None
        status = reply.get("status") if reply is not None else None
        return status if isinstance(status, int) else None

    async def _call(
        self, zygote: _Zygote, request: dict[str, Any], fd: int | None = None
    ) -> dict[str, Any] | None:
        """One request and its reply. None if it could not be sent (the zygote is gone);
        ForkLost if the reply did not come. Shielded: a request cut in half would leave its
        reply to the next one; bounded, so that a stuck zygote is killed, not waited for."""
        data = json.dumps(request).encode()
        with trio.CancelScope(shield=True):
            async with self._lock:
                if not zygote.ready:
                    return None
                answer: dict[str, Any] = {}
                with trio.move_on_after(_REPLY_TIMEOUT_S):
                    try:
                        if fd is None:
                            await zygote.sock.send(data)
                        else:
                            fds = array.array("i", [fd])
                            await zygote.sock.sendmsg(
                                [data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)]
                            )
                    except (OSError, trio.ClosedResourceError):
                        self._lost(zygote)
                        return None
                    with contextlib.suppress(OSError, trio.ClosedResourceError):
                        answer = _decode(await zygote.sock.recv(_MAX_MESSAGE))
                if answer:
                    return answer
                self._lost(zygote)
        raise ForkLost(f"the fork server (pid {zygote.pid}) did not answer {request}")

    def _lost(self, zygote: _Zygote) -> None:
        """Starts spawn from now on; `run` notices the death (this kill makes sure of it),
        reaps it and says so."""
        zygote.ready = False
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(zygote.pidfd, signal.SIGKILL)


def _decode(message: bytes) -> dict[str, Any]:
    """A message of the zygote's; empty if there was none (it died) or it makes no sense."""
    with contextlib.suppress(ValueError):
        value = json.loads(message)
        if isinstance(value, dict):
            return value
    return {}
