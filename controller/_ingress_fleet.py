"""The daemon's ingress, in processes of its own: started, supervised and adopted by the daemon,
so that nothing a client of the ingress sends runs on the controller's thread.

`workers` processes (``controller._ingress_process``) each bind the ingress port with
``SO_REUSEPORT`` (the kernel spreads connections over them) and follow the daemon over its
API. Each has its own session: a Ctrl-C at the daemon's terminal does not reach it, and it
outlives the daemon, routing on the last snapshot, as replicas do; the next daemon on the same
state dir adopts the processes its records (``ingress/N.json``) name, if they are still the
same processes (pid and start time) and serve what it would start. One that exits is started
again (backoff 0.1 s to 5 s, forgiven after a minute of service) and its end is logged with the
last lines of its log. ``controller shutdown`` stops them; so does a daemon started with
another ingress address, or without one (``--no-ingress``), once its own serve.

Each process also answers on a Unix socket of its own (``ingress/N.sock``): the daemon reads
its health and metrics there, and serves their sum on ``/metrics``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, final

import attrs
import h11
import trio
from prometheus_client.parser import text_string_to_metric_families

from ._errors import StartupError
from ._files import private_dir, write_private
from ._ingress_process import DRAIN_S, ingress_dir, log_path, socket_path
from ._procfs import command_line, describe_exit, exit_status, start_time
from .ingress import SourceError
from .ingress._sources import read_answer

logger = logging.getLogger("controller.daemon")

MODULE = "controller._ingress_process"
#: Waits between starts of a process that keeps exiting.
BACKOFF_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
#: A process that served this long has its earlier exits forgiven.
FORGIVE_AFTER_S = 60.0
#: How long a new process may take to serve (import, first answer of the watch).
START_TIMEOUT_S = 30.0
#: Beyond its own drain, how long a stopping process may take before it is killed.
STOP_MARGIN_S = 3.0
#: How long the daemon waits for a process's health or metrics, and how much it reads of them.
ASK_TIMEOUT_S = 1.0
ANSWER_LIMIT = 16 << 20

State = Literal["starting", "serving", "restarting", "stopping"]


@attrs.frozen
class FleetOptions:
    listen: str
    """``HOST:PORT``; port 0: any free one (chosen once, then kept by the processes)."""
    workers: int
    access_log: bool = False
    log_format: str = "human"

    def digest(self) -> str:
        """What a process must have been started with to be adopted (its address aside)."""
        from . import __version__

        what = json.dumps([self.access_log, self.log_format, __version__, sys.executable])
        return hashlib.sha256(what.encode()).hexdigest()[:16]


@attrs.frozen
class Record:
    """What ``ingress/N.json`` says of the process of slot N."""

    slot: int
    pid: int
    started: str
    """Its start time (``/proc/<pid>/stat``): a pid reused since is not taken for it."""
    listen: str
    digest: str

    @classmethod
    def read(cls, path: Path) -> Record | None:
        try:
            data = json.loads(path.read_text())
            return cls(
                slot=int(data["slot"]),
                pid=int(data["pid"]),
                started=str(data["started"]),
                listen=str(data["listen"]),
                digest=str(data["digest"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def alive(self, state_dir: Path) -> bool:
        """Whether its process still runs, as ours (same start time, same command)."""
        args = command_line(self.pid)
        if args is None or start_time(self.pid) != self.started:
            return False
        return args[:2] == [b"-m", MODULE.encode()] and os.fsencode(state_dir) in args


@final
@attrs.define(eq=False)
class Member:
    """One slot's process as the daemon sees it (written by that slot's supervisor alone)."""

    slot: int
    pid: int | None = None
    state: State = "starting"
    since: float = attrs.field(factory=time.time)
    """When it entered its state (wall clock)."""
    restarts: int = 0
    last_exit: str | None = None
    adopted: bool = False
    """It was started by an earlier daemon."""


@final
class Fleet:
    """The ingress processes of one daemon (its state dir)."""

    def __init__(self, state_dir: Path, options: FleetOptions, env: Mapping[str, str]):
        self.state_dir = state_dir
        self.options = options
        self.env = dict(env)
        self.members = [Member(slot) for slot in range(options.workers)]
        self.address = ""
        """The port the processes serve, ``HOST:PORT`` (known once `claim`ed)."""
        self._digest = options.digest()
        self._adopt: dict[int, Record] = {}
        self._retire: list[Record] = []
        self._holder: socket.socket | None = None
        self.stopping = False
        """Set by `stop`: an exit is then the end, not a cause to start another."""
        self._handles: dict[int, _Handle] = {}
        self._exited: dict[int, trio.Event] = {}
        """Per slot whose process runs: set once it has exited (the supervisor waits on it)."""

    # -- start-up --

    def claim(self) -> None:
        """Find the processes an earlier daemon left (adopted if they serve what this one
        would, else retired once the new ones serve), and make sure the port is free or
        theirs. ``StartupError`` if another process holds it."""
        try:
            private_dir(ingress_dir(self.state_dir), "--state-dir")
        except (OSError, ValueError) as exc:
            raise StartupError(f"cannot use {ingress_dir(self.state_dir)}: {exc}") from None
        host, port = _split(self.options.listen)
        live = [r for r in self._records() if r.alive(self.state_dir)]
        for record in live:
            r_host, r_port = _split(record.listen)
            same = r_host == host and (port in (0, r_port))
            if same and record.digest == self._digest and record.slot < self.options.workers:
                self._adopt[record.slot] = record
            else:
                self._retire.append(record)
        if self._adopt:
            self.address = next(iter(self._adopt.values())).listen
            # The others on another port go; on this one, they are replaced in place.
            return
        ours = {r.listen for r in self._retire}
        self._holder, self.address = _hold(host, port, self.options.listen, ours)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Supervise the processes until cancelled (they keep running). Started once each
        serves (or `START_TIMEOUT_S` passed: late ones are logged and go on starting)."""
        async with trio.open_nursery() as nursery:
            serving = [trio.Event() for _ in self.members]
            for member, event in zip(self.members, serving, strict=True):
                nursery.start_soon(self._supervise, member, event)
            with trio.move_on_after(START_TIMEOUT_S):
                for event in serving:
                    await event.wait()
            late = [m.slot for m in self.members if m.state != "serving"]
            if late:
                logger.error(
                    "ingress: process(es) %s not serving after %gs; still trying (see %s)",
                    ", ".join(map(str, late)),
                    START_TIMEOUT_S,
                    ingress_dir(self.state_dir),
                )
            if self._holder is not None:
                self._holder.close()
                self._holder = None
            # Those of an earlier daemon that this one does not adopt go, now that the new
            # ones serve (on the same port, they overlap for a moment: no gap).
            retired, self._retire = self._retire, []
            await _stop_records(retired, self.state_dir)
            task_status.started()

    async def _supervise(self, member: Member, serving: trio.Event) -> None:
        record = self._adopt.pop(member.slot, None)
        failures, up_since = 0, 0.0
        if record is not None and not await self._answers(member.slot):
            # Alive but not answering (still starting, or hung): not to be trusted with the
            # port; it goes, and a new one is started.
            await _stop_records([record], self.state_dir)
            record = None
        while not self.stopping:
            handle = _Handle.adopt(record) if record is not None else None
            record = None
            if handle is not None:
                member.adopted = True
            else:
                member.adopted = False
                handle = await self._spawn(member)
            if handle is not None:
                exited = self._exited[member.slot] = trio.Event()
                self._handles[member.slot] = handle
                member.pid, member.state, member.since = handle.pid, "serving", time.time()
                up_since = trio.current_time()
                serving.set()
                if self._stopped():
                    handle.signal(signal.SIGTERM)  # started while the fleet began to stop
                try:
                    status = await handle.wait()
                finally:
                    self._handles.pop(member.slot, None)
                    exited.set()
                if self._stopped():
                    return
                member.last_exit = describe_exit(status).removeprefix("worker process ")
            member.restarts += 1
            member.state, member.since = "restarting", time.time()
            if trio.current_time() - up_since > FORGIVE_AFTER_S:
                failures = 0
            failures += 1
            wait = BACKOFF_S[min(failures, len(BACKOFF_S)) - 1]
            logger.warning(
                "ingress process %d (pid %s) %s; starting another in %gs%s",
                member.slot,
                member.pid,
                member.last_exit,
                wait,
                _tail(log_path(self.state_dir, member.slot)),
            )
            await trio.sleep(wait)

    def _stopped(self) -> bool:
        # A method, not the attribute: it changes across the awaits of one supervisor's loop.
        return self.stopping

    async def _spawn(self, member: Member) -> _Handle | None:
        """A new process for `member`'s slot, once it serves; None if it ended first (its
        end in `member.last_exit`)."""
        options = self.options
        argv = [
            sys.executable,
            "-P",
            "-m",
            MODULE,
            "--state-dir",
            str(self.state_dir),
            "--slot",
            str(member.slot),
            "--listen",
            self.address,
            "--log-format",
            options.log_format,
        ]
        if options.access_log:
            argv.append("--access-log")
        member.state, member.since = "starting", time.time()
        log = _open_log(log_path(self.state_dir, member.slot))
        try:
            process = await trio.lowlevel.open_process(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,  # what it says before its own logging is set up (a failed import)
                env=self.env,
                start_new_session=True,  # not stopped by a Ctrl-C at the daemon's terminal
                close_fds=True,
            )
        finally:
            os.close(log)
        member.pid = process.pid
        handle = _Handle(process.pid, process=process)
        write_private(
            _record_path(self.state_dir, member.slot),
            json.dumps(
                attrs.asdict(
                    Record(
                        member.slot,
                        process.pid,
                        start_time(process.pid) or "",
                        self.address,
                        self._digest,
                    )
                )
            ),
        )
        assert process.stdout is not None
        said = b""
        with trio.move_on_after(START_TIMEOUT_S):
            async for chunk in process.stdout:
                said += chunk
                if b"ready\n" in said:
                    break
        await process.stdout.aclose()
        if b"ready\n" in said:
            return handle
        if process.returncode is None and process.poll() is None:
            # Alive but not serving in time: it is stopped, and another tried.
            process.kill()
        member.last_exit = describe_exit(await _reap(process)).removeprefix("worker process ")
        return None

    # -- stopping --

    async def stop(self) -> None:
        """Stop every process (a shutdown, or no ingress wanted): each drains first."""
        self.stopping = True
        handles = dict(self._handles)
        for member in self.members:
            if member.slot in handles:
                member.state, member.since = "stopping", time.time()
        for handle in handles.values():
            handle.signal(signal.SIGTERM)
        # Those this daemon does not supervise (an earlier daemon's, left unadopted).
        pids = {h.pid for h in handles.values()}
        records = [r for r in self._records() if r.alive(self.state_dir) and r.pid not in pids]
        await _stop_records(records, self.state_dir)
        # Their supervisors see them exit (and start no other).
        with trio.move_on_after(DRAIN_S + STOP_MARGIN_S):
            for slot in handles:
                await self._exited[slot].wait()
        for slot, handle in handles.items():
            if not self._exited[slot].is_set():
                handle.signal(signal.SIGKILL)
        with trio.move_on_after(STOP_MARGIN_S):
            for slot in handles:
                await self._exited[slot].wait()
        for slot in range(max(len(self.members), _max_slot(self.state_dir) + 1)):
            with contextlib.suppress(FileNotFoundError):
                _record_path(self.state_dir, slot).unlink()

    def _records(self) -> list[Record]:
        found = []
        with contextlib.suppress(FileNotFoundError):
            for path in sorted(ingress_dir(self.state_dir).glob("*.json")):
                record = Record.read(path)
                if record is not None:
                    found.append(record)
        return found

    # -- what the API shows --

    async def status(self) -> dict[str, Any]:
        """Each process: slot, pid, state, since, restarts, last exit, and what it says of
        itself (whether it follows the daemon)."""
        health = await self._ask_all("/-/healthz")
        processes = []
        for member in self.members:
            said = health.get(member.slot)
            processes.append(
                {
                    "slot": member.slot,
                    "pid": member.pid,
                    "state": member.state,
                    "since": member.since,
                    "restarts": member.restarts,
                    "last_exit": member.last_exit,
                    "adopted": member.adopted,
                    "answers": said is not None,
                    "following": bool(json.loads(said).get("connected")) if said else False,
                }
            )
        return {"listen": self.address, "workers": len(self.members), "processes": processes}

    async def metrics(self) -> bytes:
        """The processes' metrics summed (as if one ingress), and the fleet's own."""
        texts = await self._ask_all("/-/metrics")
        merged = merge_metrics(t.decode() for t in texts.values())
        states = dict.fromkeys(("starting", "serving", "restarting", "stopping"), 0)
        for member in self.members:
            states[member.state] += 1
        own = [
            "# HELP controller_ingress_processes The daemon's ingress processes, by state",
            "# TYPE controller_ingress_processes gauge",
            *(f'controller_ingress_processes{{state="{s}"}} {n}' for s, n in states.items()),
            "# HELP controller_ingress_restarts_total Ingress processes started again after "
            "they exited",
            "# TYPE controller_ingress_restarts_total counter",
            f"controller_ingress_restarts_total {sum(m.restarts for m in self.members)}",
        ]
        return (merged + "\n".join(own) + "\n").encode()

    async def _answers(self, slot: int) -> bool:
        """Whether the process of `slot` answers on its own socket (it is up, not hung)."""
        with trio.move_on_after(ASK_TIMEOUT_S):
            with contextlib.suppress(
                OSError, h11.ProtocolError, trio.BrokenResourceError, SourceError
            ):
                await _get(socket_path(self.state_dir, slot), "/-/healthz")
                return True
        return False

    async def _ask_all(self, target: str) -> dict[int, bytes]:
        answers: dict[int, bytes] = {}

        async def ask(slot: int) -> None:
            with trio.move_on_after(ASK_TIMEOUT_S):
                with contextlib.suppress(
                    OSError, h11.ProtocolError, trio.BrokenResourceError, SourceError
                ):
                    answers[slot] = await _get(socket_path(self.state_dir, slot), target)

        async with trio.open_nursery() as nursery:
            for member in self.members:
                if member.state == "serving":
                    nursery.start_soon(ask, member.slot)
        return answers


@final
class _Handle:
    """A process to wait on: our child (reaped by trio), or an adopted one (a pidfd)."""

    def __init__(self, pid: int, *, process: trio.Process | None = None, pidfd: int = -1):
        self.pid = pid
        self._process = process
        self._pidfd = pidfd

    @classmethod
    def adopt(cls, record: Record) -> _Handle | None:
        """A handle on an earlier daemon's process, told to follow this daemon now (it is up:
        it answered on its socket, so its signal handlers are in place)."""
        try:
            pidfd = os.pidfd_open(record.pid)
        except OSError:
            return None
        handle = cls(record.pid, pidfd=pidfd)
        handle.signal(signal.SIGUSR1)
        return handle

    async def wait(self) -> int | None:
        """Its wait status once it has exited (None if Linux will not say)."""
        if self._process is not None:
            return await _reap(self._process)
        await trio.lowlevel.wait_readable(self._pidfd)
        status = exit_status(self.pid, self._pidfd)
        trio.lowlevel.notify_closing(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = -1
        return status

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            if self._process is not None:
                if self._process.returncode is None:
                    self._process.send_signal(signum)
            elif self._pidfd >= 0:
                signal.pidfd_send_signal(self._pidfd, signum)


async def _reap(process: trio.Process) -> int | None:
    code = await process.wait()
    # trio gives the exit code (negative: the signal); as a wait status, for describe_exit.
    return (-code & 0x7F) if code < 0 else (code << 8)


async def _stop_records(records: list[Record], state_dir: Path) -> None:
    """Stop processes of records (an earlier daemon's): SIGTERM, then SIGKILL after their
    drain. Each is checked to be ours again just before it is signalled."""
    if not records:
        return
    pidfds: list[tuple[Record, int]] = []
    for record in records:
        if not record.alive(state_dir):
            continue
        try:
            pidfd = os.pidfd_open(record.pid)
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        except OSError:
            continue
        pidfds.append((record, pidfd))
        logger.info(
            "ingress: stopping process %d (pid %d) of an earlier daemon (%s)",
            record.slot,
            record.pid,
            record.listen,
        )
    try:
        with trio.move_on_after(DRAIN_S + STOP_MARGIN_S):
            for _, pidfd in pidfds:
                await trio.lowlevel.wait_readable(pidfd)
        for _, pidfd in pidfds:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    finally:
        for _, pidfd in pidfds:
            trio.lowlevel.notify_closing(pidfd)
            os.close(pidfd)


def _split(listen: str) -> tuple[str, int]:
    host, _, port_text = listen.rpartition(":")
    try:
        port = int(port_text)
        if not 0 <= port <= 65535:
            raise ValueError
    except ValueError:
        raise StartupError(f"--ingress-listen {listen!r}: not a HOST:PORT") from None
    return host.strip("[]") or "127.0.0.1", port


def _hold(host: str, port: int, listen: str, ours: set[str]) -> tuple[socket.socket, str]:
    """Make sure `host`:`port` is free (or held by our own processes, in `ours`), and hold it
    until the processes serve: a socket bound with ``SO_REUSEPORT`` (which they join) but not
    listening (so it takes no connection). Port 0 picks a free port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if port != 0 and f"{host}:{port}" not in ours and f"[{host}]:{port}" not in ours:
        probe = socket.socket(family, socket.SOCK_STREAM)
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
        except OSError as exc:
            advice = {
                errno.EADDRINUSE: "another process holds the port (another daemon?): stop it, "
                "or pick another port with --ingress-listen",
                errno.EADDRNOTAVAIL: "this machine has no such address: pick one of its own "
                "with --ingress-listen",
                errno.EACCES: "ports below 1024 need privileges: pick a higher one with "
                "--ingress-listen",
            }.get(exc.errno or 0, "pick another address with --ingress-listen")
            raise StartupError(
                f"cannot listen on {listen}: {exc.strerror or exc}; {advice}"
            ) from None
        finally:
            probe.close()
    holder = socket.socket(family, socket.SOCK_STREAM)
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind((host, port))
    except OSError as exc:
        holder.close()
        raise StartupError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    bound_port = holder.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    return holder, f"{shown}:{bound_port}"


def _record_path(state_dir: Path, slot: int) -> Path:
    return ingress_dir(state_dir) / f"{slot}.json"


def _max_slot(state_dir: Path) -> int:
    slots = [-1]
    with contextlib.suppress(FileNotFoundError):
        for path in ingress_dir(state_dir).glob("*.json"):
            with contextlib.suppress(ValueError):
                slots.append(int(path.stem))
    return max(slots)


def _open_log(path: Path) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, 0o600)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            last = f.read().decode(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return "; its log ends: " + " | ".join(line.strip() for line in last) if last else ""


async def _get(path: Path, target: str) -> bytes:
    """GET `target` from an ingress process's Unix socket."""
    stream = await trio.open_unix_socket(str(path))
    async with stream:
        conn = h11.Connection(h11.CLIENT)
        request = h11.Request(
            method="GET", target=target, headers=[("Host", "ingress"), ("Connection", "close")]
        )
        await stream.send_all(conn.send(request) + (conn.send(h11.EndOfMessage()) or b""))
        return (await read_answer(stream, conn, ANSWER_LIMIT))[1]


def merge_metrics(texts: Any) -> str:
    """Several ingresses' Prometheus texts as one: each sample summed over them (counters,
    histogram buckets, in-flight gauges all add up)."""
    families: dict[str, tuple[str, str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            _, _, samples = families.setdefault(
                family.name, (family.type, family.documentation, {})
            )
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                samples[key] = samples.get(key, 0.0) + sample.value
    out: list[str] = []
    for name, (kind, doc, samples) in families.items():
        out.append(f"# HELP {name} {_escape_help(doc)}")
        out.append(f"# TYPE {name} {kind}")
        for (sample_name, labels), value in samples.items():
            shown = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
            out.append(
                f"{sample_name}{{{shown}}} {_number(value)}"
                if shown
                else f"{sample_name} {_number(value)}"
            )
    return "\n".join(out) + ("\n" if out else "")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def stop_leftovers(state_dir: Path) -> None:
    """Tell the ingress processes an earlier daemon of `state_dir` left to stop (a daemon that
    runs no ingress): each drains and exits on its own."""
    directory = ingress_dir(state_dir)
    if not directory.is_dir():
        return
    for path in sorted(directory.glob("*.json")):
        record = Record.read(path)
        if record is not None and record.alive(state_dir):
            with contextlib.suppress(OSError):
                os.kill(record.pid, signal.SIGTERM)
                logger.info(
                    "ingress: stopping process %d (pid %d): no ingress is wanted",
                    record.slot,
                    record.pid,
                )
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
