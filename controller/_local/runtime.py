"""LocalRuntime: each replica is a worker process on this machine, reached over a Unix socket.

Layout of the runtime directory, per replica (``<id>`` is a digest of its tag, to keep socket
paths short): ``<id>.spec.json`` (what the worker runs), ``<id>.sock`` (its socket),
``<id>.pid`` (a forked worker's pid) and ``logs/<tag>.log`` (its stdout and stderr, kept after it
is gone); ``zygote.log``, the fork server's stderr; and ``fence``, the highest epoch fenced
over the directory (see Fencing below). Workers run in their own session and process group, so
they outlive the controller and are killed as a group, and they inherit exactly three
descriptors (stdin from /dev/null, the log, and their socket): nothing the controller's process
holds, such as a listening port, outlives it in a worker.

How workers start: forked by the fork server (``zygote``), a process that has imported the
worker's code once, in milliseconds; or, while it is not ready (or if it is turned off or
failed), spawned as ``python -m controller.worker``, in a hundred and more.

How a restarted controller finds its workers: by their command lines in ``/proc``, which name the
spec file, so even a worker started an instant before a crash is found; a forked worker has the
fork server's command line instead, and is found by the ``<id>.pid`` file it writes before
anything else. How death is noticed: a "monitor" connection per worker, which the worker never
answers; it ends only when the process does. How exits are awaited: pidfds, which work for
workers that are not our children too.

Fencing (several daemons over one directory, one of them the leader of an epoch; see
``Runtime.fence``): every request to a worker carries this runtime's epoch, and the worker, which
remembers the highest epoch that has commanded it, refuses one from a lower epoch (see
``worker``); the refusal is raised as ``FencedError``. An adoption raises the worker's epoch.
A kill goes through the worker too: it is asked to ``stop``, and only once it has accepted is its
group signalled (SIGTERM, then SIGKILL); a worker that accepted a stop is committed to ending
and takes no adoption, so the check and the kill are one act against a newer leader's adoption.
A worker that does not answer at all (its socket gone, or no reply within `term_timeout_s`: hung,
or stopped) cannot check anything, and is signalled as before fencing, as is a worker started
before fencing existed (it knows no ``stop``): the only cases in which a stale leader's kill may
land. Health checks from a lower epoch are refused as well, so that a
stale leader learns it is stale at its next check. Starts are checked against ``fence``, a file
in the directory that ``fence`` raises to the highest epoch fenced there: a start from a lower
epoch is refused before anything is written. That check is not atomic with a newer leader's
fencing and recovery (a start under way as it fences may still land, unseen by its recovery);
the store, which refuses the stale leader's intent before it asks for a start, closes that.
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

from .._files import private_dir, write_private
from .._model.errors import ConfigError, FencedError, ReplicaError, ReplicaGoneError
from .._model.json_values import JSON
from .._model.placement import SLOTS
from .._ports.hosting import host_spec
from .._ports.runtime import DeathListener, ReplicaInfo, ReplicaSpec, Watchers
from .._procfs import describe_exit, exit_status, memory_bytes, scan_workers
from .fence_file import fenced_at, raise_fence
from .logs import DEFAULT_MAX_BYTES, LogChunk, log_file, log_tags, prune_logs, read_log
from .wire import LineStream, WireError
from .zygote import ZYGOTE_MODULE, ForkLost, ForkServer, spawn_python

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
    forked_by: int | None = None
    """The pid of our fork server, if it forked this worker (it is then the worker's parent,
    which reaps it when asked); None if spawned, or forked by an earlier fork server."""


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

    With `fork_server` (the default), ``serve`` starts a fork server in the background: a Python
    process that imports the worker's code and the `preload_modules` once (with `pythonpath`
    in front of its ``sys.path``), then forks each worker from itself, ready in milliseconds.
    Its workers are what spawned ones are (a session and process group each, their own socket,
    nothing inherited but their three descriptors, adopted by a later controller), except that
    they share the fork server's environment, working directory and command line, taken when
    it started, and its preloaded modules. Workers are spawned instead while it is not ready
    yet (``open`` never waits for it) and when it is gone: if it fails to start (a preload
    failing, or starting a thread or keeping a file open on import), a warning says why and
    every worker is spawned for the runtime's life; if it dies later, a warning says so, the
    start at hand spawns its worker, and it starts a new fork server for those after it. The
    fork server dies with this process and is killed when the runtime closes; its workers live
    on. ``wait_fork_server_ready`` waits for it.
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
        fork_server: bool = True,
        preload_modules: Sequence[str] = (),
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
        self._epoch = 0
        self._workers: dict[str, _Worker] = {}
        self._watchers = Watchers("LocalRuntime")
        if isinstance(preload_modules, str) or not all(
            isinstance(name, str) and name for name in preload_modules
        ):
            raise ConfigError("preload_modules", "must be a list of module names", preload_modules)
        if preload_modules and not fork_server:
            raise ConfigError(
                "preload_modules",
                "needs the fork server (fork_server=True): only it preloads",
                list(preload_modules),
            )
        self._fork_server = (
            ForkServer(
                self.runtime_dir,
                python=python,
                pythonpath=self._pythonpath,
                env=self._worker_env,
                preload=list(preload_modules),
                # Beside the logs directory, which holds the replicas' logs only.
                log_path=self.runtime_dir / "zygote.log",
            )
            if fork_server
            else None
        )

    # -- paths --

    def _base(self, tag: str) -> Path:
        return self.runtime_dir / hashlib.sha256(tag.encode()).hexdigest()[:16]

    def _socket_path(self, tag: str) -> str:
        return str(self._base(tag)) + ".sock"

    def _worker_env(self) -> dict[str, str]:
        return dict(os.environ if self._env is None else self._env)

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
        async with trio.open_nursery() as nursery:
            if self._fork_server is not None:
                # It becomes ready in the background: a start meanwhile spawns its worker.
                await nursery.start(self._fork_server.run)
            try:
                await self._watchers.serve(on_death, task_status, self._let_go)
            finally:
                nursery.cancel_scope.cancel()

    @property
    def fork_server_pid(self) -> int | None:
        """The fork server's pid while it serves (workers it forks are its children)."""
        return self._fork_server.pid if self._fork_server is not None else None

    async def wait_fork_server_ready(self) -> bool:
        """Wait until the fork server serves (starting a new one if the last died): True; or
        False if there is none (``fork_server=False``, or it failed to start)."""
        self._watchers.check_running()
        if self._fork_server is None:
            return False
        return await self._fork_server.wait_ready()

    @property
    def epoch(self) -> int:
        """The epoch this runtime commands its workers with (0 until ``fence``)."""
        return self._epoch

    def fence(self, epoch: int) -> None:
        """Command workers as the leader of `epoch` from now on, and raise the directory's
        ``fence`` file to it (under an exclusive ``flock``), so that starts from a lower epoch
        are refused (see the module's docstring)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError("epoch", "must be a whole number >= 0", epoch)
        private_dir(self.runtime_dir, "runtime_dir")
        raise_fence(self.runtime_dir, epoch)
        self._epoch = epoch

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
        found = scan_workers(self.runtime_dir, _WORKER_MODULE, ZYGOTE_MODULE)
        # Our own fork server has a forked worker's command line: never take it for one (a pid
        # file naming it would have to be stale and its start time a match, but still).
        zygote = self.fork_server_pid
        if zygote is not None:
            for pids in found.values():
                pids.discard(zygote)
        return {tag: pids for tag, pids in found.items() if pids}

    async def _pids(self, tag: str) -> set[int]:
        return (await trio.to_thread.run_sync(self._scan)).get(tag, set())

    async def start_replica(self, spec: ReplicaSpec) -> ReplicaInfo:
        self._watchers.check_running()
        newer = await trio.to_thread.run_sync(fenced_at, self.runtime_dir)
        if newer > self._epoch:
            raise FencedError(f"start of replica {spec.tag}", self._epoch, newer)
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
                "epoch": self._epoch,
            }
            await trio.to_thread.run_sync(write_private, Path(spec_path), json.dumps(worker_spec))
            forked = None
            if self._fork_server is not None:
                try:
                    forked = await self._fork_server.fork(
                        spec_path, str(log_path), str(base) + ".pid", listener
                    )
                except ForkLost:
                    # Not spawned instead: a worker we do not know of may hold the socket. The
                    # controller stops the tag, which finds that worker if it is there.
                    raise ReplicaError(
                        spec.tag, "WorkerDied", "the fork server died while forking its worker"
                    ) from None
            if forked is None:
                pid, forked_by = self._spawn(spec_path, str(log_path), listener), None
            else:
                pid, forked_by = forked
        finally:
            listener.close()  # the worker holds its own copy now
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            # Only a forked worker can be gone already (dead, and reaped by init after its fork
            # server died): a spawned one stays our zombie.
            raise ReplicaError(spec.tag, "WorkerDied", "its worker exited at once") from None
        worker = _Worker(spec.tag, pid, pidfd, forked_by=forked_by)
        self._workers[spec.tag] = worker
        await self._attach(worker)
        await self._request(spec.tag, {"op": "wait_ready"})
        return ReplicaInfo(f"127.0.0.1:{port}", pid, self._node)

    async def adopt_replica(self, tag: str) -> ReplicaInfo:
        self._watchers.check_running()
        pids = await self._pids(tag)
        if not pids:
            raise ReplicaGoneError(tag, "no worker process has this tag")
        # The socket decides which process is the worker: only the real one holds it. This hello
        # is the adoption: it raises the worker's epoch to ours, or is refused.
        hello = await self._request(tag, {"op": "hello", "adopt": True})
        pid = hello.get("pid")
        if not isinstance(pid, int) or pid not in pids:
            raise ReplicaGoneError(tag, f"its socket answered for pid {pid}, not one of {pids}")
        spec = json.loads(await trio.Path(str(self._base(tag)) + ".spec.json").read_text())
        port = int(spec["port"])
        try:
            worker = _Worker(tag, pid, os.pidfd_open(pid), forked_by=self._forked_by(pid))
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
        """Stop the worker of `tag`: ask it to ``stop`` (raising ``FencedError``, with nothing
        done, if it refuses), then SIGTERM its group and SIGKILL it after `term_timeout_s`. A
        worker that does not answer is signalled all the same (see the module's docstring)."""
        worker = self._workers.get(tag)
        held = worker is not None
        if worker is None:
            pid = await self._which(tag)
            if pid is None:
                await self._gone(tag)
                return
            try:
                worker = _Worker(tag, pid, os.pidfd_open(pid), forked_by=self._forked_by(pid))
            except ProcessLookupError:
                await self._gone(tag)
                return
        try:
            await self._ask_to_stop(tag)
        except BaseException:
            if not held:
                os.close(worker.pidfd)
            raise
        if not held:
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

    async def _ask_to_stop(self, tag: str) -> None:
        """Have the worker of `tag` accept a stop from our epoch; raise ``FencedError`` if it
        refuses. Returns too if it cannot say: its socket does not answer, it fails, or it has
        not replied within `term_timeout_s` (a hung or stopped worker, which is then signalled:
        it can check nothing), or it already accepted a stop, or it predates ``stop``."""
        with trio.move_on_after(self.term_timeout_s):
            # FencedError is neither; OSError: a socket that takes no more connections.
            with contextlib.suppress(ReplicaError, OSError):
                await self._request(
                    tag, {"op": "stop", "grace_s": 2 * self.term_timeout_s + _STOP_MARGIN_S}
                )

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

    def _forked_by(self, pid: int) -> int | None:
        """Our fork server's pid if it is the parent of `pid` (a worker found, not started, that
        it forked in this runtime's life), so that it is asked to reap the worker; else None."""
        zygote = self.fork_server_pid
        if zygote is None:
            return None
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                parent = int(f.read().rpartition(b")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        return zygote if parent == zygote else None

    async def _attach(self, worker: _Worker) -> None:
        """Open the monitor connection, whose end means the process ended."""
        self._watchers.check_running()
        lines = await self._connect(worker.tag)
        await lines.send({"op": "monitor"})
        self._watchers.start_soon(self._monitor, worker, lines)

    async def _monitor(self, worker: _Worker, lines: LineStream) -> None:
        try:
            while True:
                # Nothing but the replica's own load comes this way; the end is the news.
                load = (await lines.receive()).get("load")
                if load is None or (isinstance(load, int) and not isinstance(load, bool)):
                    self._watchers.load(worker.tag, load)
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

    def _spawn(self, spec_path: str, log_path: str, listener: socket.socket) -> int:
        return spawn_python(
            self._python,
            ["-m", _WORKER_MODULE, spec_path],
            self._worker_env(),
            keep_fd=listener.fileno(),
            log_path=Path(log_path),
        )

    async def _wait_exit(self, worker: _Worker) -> None:
        await trio.lowlevel.wait_readable(worker.pidfd)
        if worker.forked_by is not None and self._fork_server is not None:
            # Its fork server leaves it a zombie until asked: read how it ended first, while
            # its /proc entry still says, then have it reaped.
            status = exit_status(worker.pid, worker.pidfd)
            reaped = await self._fork_server.reap(worker.pid, worker.forked_by)
            worker.exit_status = status if status is not None else reaped
            return
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
        """Send `request` (with our epoch) to the worker of `tag` and return its reply; raise
        ``FencedError`` if the worker refuses our epoch, ``ReplicaError`` if it fails."""
        lines = await self._connect(tag)
        try:
            await lines.send({**request, "epoch": self._epoch})
            reply = await lines.receive()
        except (WireError, trio.BrokenResourceError) as exc:
            tail = await trio.to_thread.run_sync(self._log_tail, tag)
            raise ReplicaError(tag, "WorkerDied", f"{exc}{tail}") from None
        finally:
            with trio.CancelScope(shield=True):
                await lines.aclose()
        if not reply.get("ok"):
            if reply.get("fenced") is True:
                newer = reply.get("epoch")
                raise FencedError(
                    f"{_WHAT.get(str(request.get('op')), request.get('op'))} of replica {tag}",
                    self._epoch,
                    newer if isinstance(newer, int) and not isinstance(newer, bool) else None,
                )
            if reply.get("error_type") == "WorkerStopping":
                raise ReplicaGoneError(tag, "its worker accepted a stop and is ending")
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
        for suffix in (".sock", ".spec.json", ".pid"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(base + suffix)

        def is_live(other: str) -> bool:
            # A worker is alive exactly while its socket file is there.
            return other in self._workers or os.path.exists(self._socket_path(other))

        # One directory listing, bounded by the live workers and the kept logs; shielded, as a
        # kill's cleanup is.
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(prune_logs, self.logs_dir, is_live, self._logs_kept)


#: How much longer than our own SIGTERM-then-SIGKILL a worker that accepted a stop waits before
#: ending itself (should this runtime vanish in between).
_STOP_MARGIN_S = 5.0
#: What a request is called in a FencedError.
_WHAT = {
    "hello": "adoption",
    "wait_ready": "start",
    "reconfigure": "reconfigure",
    "check_health": "health check",
    "drain": "drain",
    "stop": "kill",
}


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
