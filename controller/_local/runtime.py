"""LocalRuntime: each replica is a worker process on this machine, reached over a Unix socket.

The runtime directory holds each replica's spec, socket, pid file and log (see ``layout``), and
``fence``, the highest epoch fenced over it (see Fencing below). Workers run in their own
session and process group, so they outlive the controller and are killed as a group, and they
inherit exactly three descriptors (stdin from /dev/null, the log, and their socket): nothing the
controller's process holds, such as a listening port, outlives it in a worker.

How workers start: forked by the fork server (``zygote``), a process that has imported the
worker's code once, in milliseconds; or, while it is not ready (or if it is turned off or
failed), spawned as ``python -m controller.worker``, in a hundred and more.

How a restarted controller finds its workers: by their command lines in ``/proc``, which name the
spec file, so even a worker started an instant before a crash is found; a forked worker has the
fork server's command line instead, and is found by the ``<id>.pid`` file it writes before
anything else. How death is noticed and exits are awaited: see ``process``, the runtime's side
of one worker process; what it asks of a worker, and how a refusal is raised: ``commands``.

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

import json
import logging
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, final

import trio

from .._files import private_dir, read_regular, write_private
from .._model.decisions.placement import SLOTS
from .._model.decisions.spec import ReplicaSpec
from .._model.values.errors import ConfigError, FencedError, ReplicaError, ReplicaGoneError
from .._model.values.json_values import JSON
from .._ports.runtime import CheckReport, DeathListener, LogChunk, ReplicaInfo, Watchers
from .._procfs import memory_bytes
from .check_wave import check_links
from .commands import ask_to_stop, command, connect, died, log_tail, refused
from .fence_file import fenced_at, raise_fence
from .layout import (
    LOGS,
    ROUTES,
    ZYGOTE_LOG,
    check_socket_room,
    remove_replica_files,
    spec_path,
)
from .link import ENDED, MonitorLink
from .link_reader import LinkReader
from .logs import DEFAULT_MAX_BYTES, log_file, log_tags, read_log
from .node import OneNode
from .process import WorkerProcess, launch
from .scan import WorkerScan
from .wire import MONITOR_CHECKS
from .zygote import ForkServer

# The default limit on workers: one per this much memory, and at most this many per core.
#: How long a worker whose connection broke as it started is given to exit, so that its exit
#: status says how it ended (it is killed by a signal at once, usually).
DIED_WAIT_S = 2.0
#: How much of its log such a worker's failure carries (a C-level fault's traceback).
DIED_LOG_LINES = 60
_MEMORY_PER_REPLICA = 64 << 20
_REPLICAS_PER_CORE = 256

logger = logging.getLogger("controller.runtime")


def default_max_replicas() -> int:
    """How many workers this machine holds by default: one per 64 MiB of memory (an idle
    worker takes about 25 MiB), at most 256 per core."""
    cores = os.cpu_count() or 1
    memory = memory_bytes()
    by_memory = memory // _MEMORY_PER_REPLICA if memory else cores * _REPLICAS_PER_CORE
    return max(1, min(by_memory, cores * _REPLICAS_PER_CORE))


@final
class LocalRuntime(OneNode):
    """Replicas as worker processes on this machine (``python -m controller.worker``).

    `runtime_dir` holds the workers' sockets, specs and logs; a controller reopened with the same
    directory finds and adopts the workers. It is created private (0700), and refused if other
    users may write in it. `capacity` is what this machine may give replicas (default:
    ``{"CPU": os.cpu_count()}``; add custom resources as you like). `max_replicas` is how many
    workers it holds at all, whatever they ask for (default: one per 64 MiB of memory, at most
    256 per core). `pythonpath` entries are put in front of ``sys.path`` in each worker, so
    that entrypoints can be found. `env` is the workers' environment (default: this process's).
    A worker that does not exit within `term_timeout_s` of SIGTERM gets SIGKILL. Each worker's
    log is rotated past `log_max_bytes`; the newest `logs_kept` gone replicas' logs are kept.

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
        check_socket_room(self.runtime_dir)
        if max_replicas is not None and (
            isinstance(max_replicas, bool) or not isinstance(max_replicas, int) or max_replicas < 1
        ):
            raise ConfigError("max_replicas", "must be a whole number >= 1", max_replicas)
        self.max_replicas = max_replicas if max_replicas is not None else default_max_replicas()
        self._routes: str | None = None
        """What `publish_routes` said, as ``routes.json`` holds it."""
        self._capacity = (
            dict(capacity) if capacity is not None else {"CPU": float(os.cpu_count() or 1)}
        )
        self._capacity[SLOTS] = float(self.max_replicas)
        self.logs_dir = self.runtime_dir / LOGS
        self._log_max_bytes = log_max_bytes
        self._logs_kept = logs_kept
        self._node = socket.gethostname()
        # Absolute, but through its symlinks: a `current -> releases/N` directory switched to
        # another release is what the next worker imports (and what revisions pin).
        self._pythonpath = [os.path.abspath(p) for p in pythonpath]
        self._python = python
        self._env = dict(env) if env is not None else None
        self.term_timeout_s = term_timeout_s
        self._epoch = 0
        self._workers: dict[str, WorkerProcess] = {}
        self._scan = WorkerScan(self.runtime_dir, lambda: self.fork_server_pid)
        self._watchers = Watchers("LocalRuntime")
        self._reader = LinkReader()
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
                log_path=self.runtime_dir / ZYGOTE_LOG,
            )
            if fork_server
            else None
        )

    # -- paths --

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
        if self._routes is not None:
            write_private(self.runtime_dir / ROUTES, self._routes)
        async with trio.open_nursery() as nursery:
            await nursery.start(self._reader.serve)
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
            worker.close()
        self._workers.clear()

    async def capacity(self) -> Sequence[Mapping[str, float]] | None:
        return [self._capacity]

    async def list_replicas(self) -> Sequence[str]:
        found = await trio.to_thread.run_sync(self._scan)
        return sorted(found)

    async def _pids(self, tag: str) -> set[int]:
        return (await trio.to_thread.run_sync(self._scan)).get(tag, set())

    def publish_routes(self, url: str, token: str) -> None:
        """Where its workers' handles follow the routes: a daemon's API at `url`, read with
        `token` (the route token, which reads the watch and changes nothing). Written to
        ``routes.json`` in the runtime dir, which workers read when a handle is first used
        (and again whenever the daemon cannot be reached), so that the workers of an earlier
        daemon follow this one too."""
        self._routes = json.dumps({"url": url, "token": token})
        if self.runtime_dir.is_dir():
            write_private(self.runtime_dir / ROUTES, self._routes)

    async def start_replica(self, spec: ReplicaSpec) -> ReplicaInfo:
        self._watchers.check_running()
        self.check_placeable(spec.tag)
        newer = await trio.to_thread.run_sync(fenced_at, self.runtime_dir)
        if newer > self._epoch:
            raise FencedError(f"start of replica {spec.tag}", self._epoch, newer)
        worker, port = await launch(
            self.runtime_dir,
            spec,
            pythonpath=self._pythonpath,
            log_max_bytes=self._log_max_bytes,
            epoch=self._epoch,
            fork_server=self._fork_server,
            python=self._python,
            env=self._worker_env,
        )
        self._workers[spec.tag] = worker
        try:
            await self._attach(worker, checks=True)  # it runs this version's worker
            await self._request(spec.tag, {"op": "wait_ready"})
        except ReplicaGoneError as exc:
            raise await self._died_starting(worker, exc) from None
        except ReplicaError as exc:
            if exc.error_type != "WorkerDied":
                raise
            raise await self._died_starting(worker, exc) from None
        worker.started = True
        return ReplicaInfo(f"127.0.0.1:{port}", worker.pid, self._node)

    async def _died_starting(
        self, worker: WorkerProcess, exc: ReplicaError | ReplicaGoneError
    ) -> ReplicaError | ReplicaGoneError:
        """A worker whose connection broke as it started: how its process ended (a signal, an
        exit status), and the end of its log (a C-level fault's traceback, which the worker's
        ``faulthandler`` writes there), rather than the socket's error alone."""
        with trio.move_on_after(DIED_WAIT_S):
            how = await worker.wait_end(self._fork_server)
            said, tail = await self._ended(worker.tag, how)
            return ReplicaError(worker.tag, "WorkerDied", f"{said} while starting", tail or None)
        return exc  # still running: the connection's end is all there is to say

    async def _ended(self, tag: str, how: str) -> tuple[str, str]:
        """`how` a worker ended, with Python's own words for a fatal signal if it wrote them
        (``Fatal Python error: Aborted``); and the end of its log, where they are."""
        tail = await trio.to_thread.run_sync(
            partial(log_tail, self.runtime_dir, tag, lines=DIED_LOG_LINES)
        )
        fatal = [line for line in tail.splitlines() if line.startswith("Fatal Python error")]
        return how + (f" ({fatal[-1]})" if fatal else ""), tail

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
        spec = json.loads(
            await trio.to_thread.run_sync(read_regular, spec_path(self.runtime_dir, tag))
        )
        port = int(spec["port"])
        try:
            worker = WorkerProcess.found(tag, pid, self.fork_server_pid)
        except ProcessLookupError:
            raise ReplicaGoneError(tag, "its worker exited during adoption") from None
        self._workers[tag] = worker
        # A worker started by an older version answers no checks on its monitor connection.
        await self._attach(worker, checks=hello.get(MONITOR_CHECKS) is True)
        await self._request(tag, {"op": "wait_ready"})
        worker.started = True
        return ReplicaInfo(f"127.0.0.1:{port}", pid, self._node)

    async def reconfigure_replica(self, tag: str, user_config: JSON) -> None:
        await self._request(tag, {"op": "reconfigure", "user_config": user_config})

    async def check_health_replica(self, tag: str) -> None:
        """Call the replica's ``check_health``; raises ReplicaError if it raises. Asked over
        the worker's monitor connection if it answers checks there (see ``wire``), else over a
        connection of its own."""
        worker = self._workers.get(tag)
        link = worker.link if worker is not None else None
        if link is None or not link.checks:
            await self._request(tag, {"op": "check_health"})
            return
        epoch = self._epoch
        answer = await link.check(epoch)
        if answer is ENDED:
            raise await died(self.runtime_dir, tag, link.why)
        if answer is not None:
            raise refused(tag, epoch, "check_health", answer)

    async def check_health_replicas(self, tags: Sequence[str], report: CheckReport) -> None:
        """The checks of `tags` as a wave over their monitor connections (``check_wave``)."""
        links = {tag: w.link if (w := self._workers.get(tag)) else None for tag in tags}
        await check_links(self, links, self._epoch, self.runtime_dir, report)

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
                worker = WorkerProcess.found(tag, pid, self.fork_server_pid)
            except ProcessLookupError:
                await self._gone(tag)
                return
        try:
            await ask_to_stop(self.runtime_dir, tag, self._epoch, self.term_timeout_s)
        except BaseException:
            if not held:
                worker.close()
            raise
        if not held:
            self._workers[tag] = worker
        worker.killing = True
        try:
            await worker.terminate(self.term_timeout_s, self._fork_server)
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

    async def _attach(self, worker: WorkerProcess, *, checks: bool) -> None:
        """Open the monitor connection, whose end means the process ended (and over which it
        is checked, if `checks`)."""
        self._watchers.check_running()
        lines = await connect(self.runtime_dir, worker.tag)
        try:
            await lines.send({"op": "monitor"})
            worker.link = link = MonitorLink(worker.tag, lines, checks=checks)
            self._watchers.start_soon(self._monitor, worker, link)
        except BaseException:
            # Cancelled mid-send (the runtime closed while adopting), or its watchers closed:
            # the connection is no one's yet, so it is closed here, not left to the collector.
            with trio.CancelScope(shield=True):
                await lines.aclose()
            raise

    async def _monitor(self, worker: WorkerProcess, link: MonitorLink) -> None:
        # Until the connection ends, which is the news, or the process does: a child it forked
        # (multiprocessing, a fork in the user's code) holds the connection open after it.
        async with trio.open_nursery() as watching:
            if worker.pidfd >= 0:
                watching.start_soon(self._exited, worker, watching.cancel_scope)
            await self._reader.read(link, partial(self._watchers.load, worker.tag))
            watching.cancel_scope.cancel()
        if worker.killing or self._workers.get(worker.tag) is not worker:
            return
        if not worker.started:
            return  # its start fails with how it ended (``_died_starting``): said once, there
        how = await worker.wait_end(self._fork_server)
        if worker.killing or self._workers.get(worker.tag) is not worker:
            return  # a stop came while it ended: the stop says what became of it
        how, _ = await self._ended(worker.tag, how)
        self._forget(worker)
        await self._gone(worker.tag)
        self._watchers.died(worker.tag, how)

    async def _exited(self, worker: WorkerProcess, reading: trio.CancelScope) -> None:
        try:
            await worker.wait_exit(self._fork_server)
        except trio.ClosedResourceError:
            return  # forgotten by a stop, which sees its end itself
        reading.cancel()

    def _forget(self, worker: WorkerProcess) -> None:
        if self._workers.get(worker.tag) is worker:
            del self._workers[worker.tag]
            worker.close()

    async def _request(self, tag: str, request: dict[str, Any]) -> dict[str, Any]:
        """Send `request` to the worker of `tag` with our epoch; its reply (see ``command``)."""
        return await command(self.runtime_dir, tag, self._epoch, request)

    async def _gone(self, tag: str) -> None:
        """Remove what a worker that is gone leaves behind, but its log (and old logs)."""
        await remove_replica_files(self.runtime_dir, tag, self._workers, self._logs_kept)
