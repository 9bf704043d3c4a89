"""LocalRuntime: each replica is a worker process on this machine, reached over a Unix socket.

Layout of the runtime directory, per replica (``<id>`` is a digest of its tag, to keep socket
paths short): ``<id>.spec.json`` (what the worker runs), ``<id>.sock`` (its socket), and
``logs/<tag>.log`` (its stdout and stderr, kept after it is gone). Workers run in their own
session and process group, so they outlive the controller and are killed as a group, and they
inherit exactly three descriptors (stdin from /dev/null, the log, and their socket): nothing the
controller's process holds, such as a listening port, outlives it in a worker.

How a restarted controller finds its workers: by their command lines in ``/proc``, which name the
spec file, so even a worker started an instant before a crash is found. How death is noticed: a
"monitor" connection per worker, which the worker never answers; it ends only when the process
does. How exits are awaited: pidfds, which work for workers that are not our children too.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, final

import attrs
import trio

from ._errors import ConfigError, ReplicaError, ReplicaGoneError
from ._files import private_dir, write_private
from ._hosting import host_spec
from ._json import JSON
from ._placement import SLOTS
from ._procfs import describe_exit, exit_status, inheritable_fds, memory_bytes, scan_workers
from ._runtime import DeathListener, ReplicaInfo, ReplicaSpec, Watchers
from ._wire import LineStream, WireError
from ._worker_logs import DEFAULT_MAX_BYTES, LogChunk, log_file, log_tags, prune_logs, read_log

_WORKER_MODULE = "controller.worker"
# sockaddr_un.sun_path is 108 bytes on Linux, including the final NUL.
_MAX_SOCKET_PATH = 107
# The default limit on workers: one per this much memory, and at most this many per core.
_MEMORY_PER_REPLICA = 64 << 20
_REPLICAS_PER_CORE = 256


def default_max_replicas() -> int:
    """How many workers this machine holds by default: one per 64 MiB of memory (an idle
    worker takes about 25 MiB), at most 256 per core."""
    cores = os.cpu_count() or 1
    memory = memory_bytes()
    by_memory = memory // _MEMORY_PER_REPLICA if memory else cores * _REPLICAS_PER_CORE
    return max(1, min(by_memory, cores * _REPLICAS_PER_CORE))


@final
@attrs.define(eq=False)
class _Worker:
    tag: str
    pid: int
    pidfd: int
    """Held from start or adoption on, so that a reused pid can never be mistaken for it."""
    killing: bool = False
    """Set when the stop is ours, so that the monitor does not report it as a death."""
    exit_status: int | None = None
    """Its wait status, once reaped by us (None if it was not our child)."""


@final
class LocalRuntime:
    """Replicas as worker processes on this machine (``python -m controller.worker``).

    `runtime_dir` holds the workers' sockets, specs and logs; a controller reopened with the same
    directory finds and adopts the workers. It is created private (0700), and refused if other
    users may write in it. `capacity` is what this machine may give replicas (default:
    ``{"CPU": os.cpu_count()}``; add custom resources as you like). `max_replicas` is how many
    workers it holds at all, whatever they ask for (default: one per 64 MiB of memory, at most
    256 per core). `pythonpath` entries are put in front of ``sys.path`` in each worker, so
    that entrypoints can be found. `env` is the workers' environment (default: this process's).
    A worker that does not exit within `term_timeout_s` of SIGTERM gets SIGKILL. Each worker's
    log is rotated past `log_max_bytes`; the logs of the newest `logs_kept` gone replicas are
    kept.
    """

    def __init__(
        self,
        runtime_dir: str | os.PathLike[str],
        *,
        capacity: Mapping[str, float] | None = None,
        pythonpath: Sequence[str | os.PathLike[str]] = (),
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        term_timeout_s: float = 2.0,
        max_replicas: int | None = None,
        log_max_bytes: int = DEFAULT_MAX_BYTES,
        logs_kept: int = 50,
    ):
        self.runtime_dir = Path(runtime_dir).resolve()
        longest = self.runtime_dir / ("0" * 16 + ".sock")
        if len(os.fsencode(longest)) > _MAX_SOCKET_PATH:
            raise ConfigError(
                "runtime_dir",
                f"is too long for Unix socket paths ({len(os.fsencode(longest))} > "
                f"{_MAX_SOCKET_PATH} bytes with a socket name); choose a shorter directory",
                str(self.runtime_dir),
            )
        if max_replicas is not None and (
            isinstance(max_replicas, bool) or not isinstance(max_replicas, int) or max_replicas < 1
        ):
            raise ConfigError("max_replicas", "must be a whole number >= 1", max_replicas)
        self.max_replicas = max_replicas if max_replicas is not None else default_max_replicas()
        self._capacity = (
            dict(capacity) if capacity is not None else {"CPU": float(os.cpu_count() or 1)}
        )
        self._capacity[SLOTS] = float(self.max_replicas)
        self.logs_dir = self.runtime_dir / "logs"
        self._log_max_bytes = log_max_bytes
        self._logs_kept = logs_kept
        self._node = socket.gethostname()
        self._pythonpath = [str(Path(p).resolve()) for p in pythonpath]
        self._python = python
        self._env = dict(env) if env is not None else None
        self.term_timeout_s = term_timeout_s
        self._workers: dict[str, _Worker] = {}
        self._watchers = Watchers("LocalRuntime")

    # -- paths --

    def _base(self, tag: str) -> Path:
        return self.runtime_dir / hashlib.sha256(tag.encode()).hexdigest()[:16]

    def _socket_path(self, tag: str) -> str:
        return str(self._base(tag)) + ".sock"

    def log_path(self, tag: str) -> Path:
        """Where the worker of `tag` writes its stdout and stderr (``logs/<tag>.log``; past
        its size cap, the older part is in ``<tag>.log.1``)."""
        return log_file(self.logs_dir, tag)

    def log_tags(self, backend: str | None = None) -> list[str]:
        """The tags that have a log (of `backend` only, if given), oldest log first: live
        replicas, and the newest `logs_kept` that are gone."""
        return log_tags(self.logs_dir, "" if backend is None else f"{backend}#")

    def read_log(self, tag: str, *, offset: int | None = None, tail: int = 100) -> LogChunk | None:
        """The last `tail` lines of the log of `tag`, or, with the `offset` of an earlier
        read, what was written since; None if it has no log."""
        return read_log(self.log_path(tag), offset=offset, tail=tail)

    # -- the Runtime protocol --

    async def serve(
        self,
        on_death: DeathListener,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        private_dir(self.runtime_dir, "runtime_dir")
        private_dir(self.logs_dir, "runtime_dir")
        await self._watchers.serve(on_death, task_status, self._let_go)

    def _let_go(self) -> None:
        # The workers live on; a controller opened later adopts them.
        for worker in self._workers.values():
            os.close(worker.pidfd)
        self._workers.clear()

    async def capacity(self) -> Sequence[Mapping[str, float]] | None:
        return [self._capacity]

    async def list_replicas(self) -> Sequence[str]:
        found = await trio.to_thread.run_sync(self._scan)
        return sorted(found)

    def _scan(self) -> dict[str, set[int]]:
        return scan_workers(self.runtime_dir, _WORKER_MODULE)

    async def _pids(self, tag: str) -> set[int]:
        return (await trio.to_thread.run_sync(self._scan)).get(tag, set())

    async def start_replica(self, spec: ReplicaSpec) -> ReplicaInfo:
        self._watchers.check_running()
        base = self._base(spec.tag)
        sock_path = self._socket_path(spec.tag)
        port = _free_port()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(sock_path)
            listener.bind(sock_path)
            listener.listen(64)
            spec_path = str(base) + ".spec.json"
            log_path = self.log_path(spec.tag)
            worker_spec: dict[str, Any] = {
                **host_spec(spec, self._pythonpath),
                "port": port,
                "listen_fd": listener.fileno(),
                "log": str(log_path),
                "log_max_bytes": self._log_max_bytes,
            }
            await trio.to_thread.run_sync(write_private, Path(spec_path), json.dumps(worker_spec))
            env = dict(os.environ if self._env is None else self._env)
            pid = self._spawn(spec_path, str(log_path), listener, env)
        finally:
            listener.close()  # the worker holds its own copy now
        worker = _Worker(spec.tag, pid, os.pidfd_open(pid))
        self._workers[spec.tag] = worker
        await self._attach(worker)
        await self._request(spec.tag, {"op": "wait_ready"})
        return ReplicaInfo(f"127.0.0.1:{port}", pid, self._node)

    async def adopt_replica(self, tag: str) -> ReplicaInfo:
        self._watchers.check_running()
        pids = await self._pids(tag)
        if not pids:
            raise ReplicaGoneError(tag, "no worker process has this tag")
        # The socket decides which process is the worker: only the real one holds it.
        hello = await self._request(tag, {"op": "hello"})
        pid = hello.get("pid")
        if not isinstance(pid, int) or pid not in pids:
            raise ReplicaGoneError(tag, f"its socket answered for pid {pid}, not one of {pids}")
        spec = json.loads(await trio.Path(str(self._base(tag)) + ".spec.json").read_text())
        port = int(spec["port"])
        try:
            worker = _Worker(tag, pid, os.pidfd_open(pid))
        except ProcessLookupError:
            raise ReplicaGoneError(tag, "its worker exited during adoption") from None
        self._workers[tag] = worker
        await self._attach(worker)
        await self._request(tag, {"op": "wait_ready"})
        return ReplicaInfo(f"127.0.0.1:{port}", pid, self._node)

    async def reconfigure_replica(self, tag: str, user_config: JSON) -> None:
        await self._request(tag, {"op": "reconfigure", "user_config": user_config})

    async def check_health_replica(self, tag: str) -> None:
        """Call the replica's ``check_health``; raises ReplicaError if it raises."""
        await self._request(tag, {"op": "check_health"})

    async def drain_replica(self, tag: str) -> None:
        await self._request(tag, {"op": "drain"})

    async def kill_replica(self, tag: str) -> None:
        worker = self._workers.get(tag)
        if worker is None:
            pid = await self._which(tag)
            if pid is None:
                await self._gone(tag)
                return
            try:
                worker = _Worker(tag, pid, os.pidfd_open(pid))
            except ProcessLookupError:
                await self._gone(tag)
                return
            self._workers[tag] = worker
        worker.killing = True
        try:
            _signal_group(worker.pid, signal.SIGTERM)
            with trio.move_on_after(self.term_timeout_s):
                await self._wait_exit(worker)
                return
            _signal_group(worker.pid, signal.SIGKILL)
            await self._wait_exit(worker)
        finally:
            self._forget(worker)
            await self._gone(tag)

    # -- internals --

    async def _which(self, tag: str) -> int | None:
        """The pid of the worker of `tag` that this runtime does not hold (a stop that a
        restarted controller finishes), or None if there is none."""
        pids = await self._pids(tag)
        if len(pids) <= 1:
            return next(iter(pids), None)
        try:
            pid = (await self._request(tag, {"op": "hello"})).get("pid")
        except ReplicaError:
            return None  # its socket is gone: the worker is, as far as we can tell
        return pid if isinstance(pid, int) and pid in pids else None

    async def _attach(self, worker: _Worker) -> None:
        """Open the monitor connection, whose end means the process ended."""
        self._watchers.check_running()
        lines = await self._connect(worker.tag)
        await lines.send({"op": "monitor"})
        self._watchers.start_soon(self._monitor, worker, lines)

    async def _monitor(self, worker: _Worker, lines: LineStream) -> None:
        try:
            await lines.receive()
        except (WireError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            with trio.CancelScope(shield=True):
                await lines.aclose()
        if worker.killing or self._workers.get(worker.tag) is not worker:
            return
        await self._wait_exit(worker)
        status = worker.exit_status
        if status is None:
            # Not our child (started by an earlier controller): Linux may still say how it
            # ended, while the pidfd is open.
            status = exit_status(worker.pid, worker.pidfd)
        self._forget(worker)
        await self._gone(worker.tag)
        self._watchers.died(worker.tag, describe_exit(status))

    def _spawn(
        self, spec_path: str, log_path: str, listener: socket.socket, env: dict[str, str]
    ) -> int:
        # posix_spawn rather than subprocess: a Popen object warns when it is collected while its
        # child runs, and outliving the controller is exactly what a worker is for.
        fd = listener.fileno()
        # Whatever else this process holds without close-on-exec (an embedding app's listening
        # socket, say) is closed in the child: a worker holding the daemon's port would keep it
        # in LISTEN after the daemon exits. Spawns run on the trio thread, one at a time, so no
        # other spawn sees the listener inheritable.
        closes = [(os.POSIX_SPAWN_CLOSE, other) for other in inheritable_fds({0, 1, 2, fd})]
        os.set_inheritable(fd, True)
        try:
            return os.posix_spawn(
                self._python,
                # -P: the daemon's working directory is not put on the worker's sys.path, so
                # that no file there can pose as the `controller` package.
                [self._python, "-P", "-m", _WORKER_MODULE, spec_path],
                env,
                file_actions=[
                    *closes,
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (
                        os.POSIX_SPAWN_OPEN,
                        1,
                        log_path,
                        os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                        0o600,
                    ),
                    (os.POSIX_SPAWN_DUP2, 1, 2),
                ],
                setsid=True,  # own session and process group: outlives us, dies as a group
            )
        finally:
            os.set_inheritable(fd, False)

    async def _wait_exit(self, worker: _Worker) -> None:
        await trio.lowlevel.wait_readable(worker.pidfd)
        # Reap it if it is our child (started here, or adopted by a controller reopened in the
        # same process); init reaps the others.
        with contextlib.suppress(ChildProcessError):
            pid, status = os.waitpid(worker.pid, os.WNOHANG)  # noqa: ASYNC222  # never blocks
            if pid == worker.pid:
                worker.exit_status = status

    def _forget(self, worker: _Worker) -> None:
        if self._workers.get(worker.tag) is worker:
            del self._workers[worker.tag]
            os.close(worker.pidfd)

    async def _connect(self, tag: str) -> LineStream:
        try:
            stream = await trio.open_unix_socket(self._socket_path(tag))
        except OSError as exc:
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                raise ReplicaGoneError(
                    tag, "its worker's socket does not answer (the worker is not running)"
                ) from None
            raise
        return LineStream(stream)

    async def _request(self, tag: str, request: dict[str, Any]) -> dict[str, Any]:
        lines = await self._connect(tag)
        try:
            await lines.send(request)
            reply = await lines.receive()
        except (WireError, trio.BrokenResourceError) as exc:
            tail = await trio.to_thread.run_sync(self._log_tail, tag)
            raise ReplicaError(tag, "WorkerDied", f"{exc}{tail}") from None
        finally:
            with trio.CancelScope(shield=True):
                await lines.aclose()
        if not reply.get("ok"):
            traceback = reply.get("traceback")
            raise ReplicaError(
                tag,
                str(reply.get("error_type")),
                str(reply.get("message")),
                traceback if isinstance(traceback, str) else None,
            )
        return reply

    def _log_tail(self, tag: str) -> str:
        # Blocking (a file read): run in a thread. Only the end of the log is read.
        chunk = read_log(self.log_path(tag), tail=1, max_bytes=4096)
        last = chunk.text.strip() if chunk is not None else ""
        return f"; its log ends: {last}" if last else ""

    async def _gone(self, tag: str) -> None:
        """Remove what a worker that is gone leaves behind, but its log: that is kept for people
        to read, and only the oldest beyond `logs_kept` are deleted."""
        base = str(self._base(tag))
        for suffix in (".sock", ".spec.json"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(base + suffix)

        def is_live(other: str) -> bool:
            # A worker is alive exactly while its socket file is there.
            return other in self._workers or os.path.exists(self._socket_path(other))

        # One directory listing, bounded by the live workers and the kept logs; shielded, as a
        # kill's cleanup is.
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(prune_logs, self.logs_dir, is_live, self._logs_kept)


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
