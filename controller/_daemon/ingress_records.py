"""What the daemon knows of its ingress processes on disk and in the process table: the record
each one's slot keeps (``ingress/N.json``: its pid and start time, the address it serves and
what it was started with), how to tell a live process of ours from a pid reused since, how to
wait on one that is not our child (a pidfd) and stop one an earlier daemon left, and how the
ingress port is checked free and held while the processes start."""

from __future__ import annotations

import array
import contextlib
import errno
import itertools
import json
import logging
import os
import signal
import socket
from pathlib import Path
from typing import final

import attrs
import h11
import trio

from .._files import open_regular, read_regular
from .._model.values.errors import StartupError
from .._procfs import command_line, exit_status, start_time
from .._routing.sources import read_answer
from ..ingress import SourceError
from .ingress_process import DRAIN_S
from .statedir import StateDir

logger = logging.getLogger("controller.daemon")

MODULE = "controller._daemon.ingress_process"
#: Beyond its own drain, how long a stopping process may take before it is killed.
STOP_MARGIN_S = 3.0
#: How long the daemon waits for a process's health or metrics, and how much of them it reads.
ASK_TIMEOUT_S = 1.0
ANSWER_LIMIT = 16 << 20
#: The most listening sockets one process is asked to give (it has one, or a few inherited).
MAX_LISTENERS = 64


@attrs.frozen
class Record:
    """What ``ingress/N.json`` says of the process of slot N."""

    slot: int
    pid: int
    started: str
    """Its start time (``/proc/<pid>/stat``): a pid reused since is not taken for it."""
    listen: str
    digest: str
    restarts: int = 0
    """How many times its slot's process was started again, over daemons."""

    @classmethod
    def read(cls, path: Path) -> Record | None:
        try:
            data = json.loads(read_regular(path))
            return cls(
                slot=int(data["slot"]),
                pid=int(data["pid"]),
                started=str(data["started"]),
                listen=str(data["listen"]),
                digest=str(data["digest"]),
                restarts=int(data.get("restarts", 0)),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def forget(self, state: StateDir) -> None:
        """Its process is gone: its socket goes, and its record if no other process of its
        slot has replaced it there (its log stays)."""
        forget_sockets(state, self.slot, self.pid)
        path = state.ingress_record(self.slot)
        now = Record.read(path)
        if now is not None and now.pid == self.pid:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def alive(self, state: StateDir) -> bool:
        """Whether its process still runs, as ours (same start time, same command, the same
        state dir however reached: through a symlink or not)."""
        args = command_line(self.pid)
        if args is None or start_time(self.pid) != self.started:
            return False
        return args[:2] == [b"-m", MODULE.encode()] and _same_dir(_state_dir_of(args), state.path)


@final
class Handle:
    """A process to wait on: our child (reaped by trio), or an adopted one (a pidfd)."""

    def __init__(self, pid: int, *, process: trio.Process | None = None, pidfd: int = -1):
        self.pid = pid
        self._process = process
        self._pidfd = pidfd

    @classmethod
    def adopt(cls, record: Record) -> Handle | None:
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
            return await reap(self._process)
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


async def reap(process: trio.Process) -> int | None:
    code = await process.wait()
    # trio gives the exit code (negative: the signal); as a wait status, for describe_exit.
    return (-code & 0x7F) if code < 0 else (code << 8)


async def stop_records(records: list[Record], state: StateDir) -> None:
    """Stop processes of records (an earlier daemon's): SIGTERM, then SIGKILL after their
    drain. Each is checked to be ours again just before it is signalled."""
    if not records:
        return
    pidfds: list[tuple[Record, int]] = []
    for record in records:
        if not record.alive(state):
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
        for record in records:
            record.forget(state)


def split(listen: str) -> tuple[str, int]:
    host, _, port_text = listen.rpartition(":")
    try:
        port = int(port_text)
        if not 0 <= port <= 65535:
            raise ValueError
    except ValueError:
        raise StartupError(f"--ingress-listen {listen!r}: not a HOST:PORT") from None
    return host.strip("[]") or "127.0.0.1", port


def hold(host: str, port: int, listen: str, ours: set[str]) -> tuple[socket.socket, str]:
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
                errno.EADDRINUSE: _holders(port)
                or "another process holds the port (another daemon?): stop it, "
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


def _holders(port: int) -> str:
    """Who holds `port`, if ingress processes of ours do (of any state dir): what says how to
    stop them; else nothing."""
    by_dir: dict[str, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            args = command_line(int(entry))
            if args is None or args[:2] != [b"-m", MODULE.encode()]:
                continue
            options = dict(zip(args[2::2], args[3::2], strict=False))
            listen = options.get(b"--listen", b"").decode(errors="replace")
            if listen.rpartition(":")[2] == str(port):
                where = os.path.realpath(os.fsdecode(options.get(b"--state-dir", b"?")))
                by_dir.setdefault(where, []).append(int(entry))
    said = []
    for where, pids in sorted(by_dir.items()):
        held = (
            f"it is held by the ingress processes (pids {', '.join(map(str, sorted(pids)))}) of "
            f"the controller whose state dir is {where}"
        )
        if StateDir(Path(where)).running():
            said.append(f"{held}, which runs: pick another port with --ingress-listen")
        else:
            said.append(
                f"{held}, which no longer runs: `controller --state-dir {where} shutdown` "
                "stops them (they stop by themselves after its --ingress-orphan-timeout)"
            )
    return "; ".join(said)


def _state_dir_of(args: list[bytes]) -> bytes | None:
    """The ``--state-dir`` an ingress process was started with."""
    for flag, value in itertools.pairwise(args):
        if flag == b"--state-dir":
            return value
    return None


def _same_dir(a: bytes | None, b: Path) -> bool:
    return a is not None and os.path.realpath(os.fsdecode(a)) == os.path.realpath(b)


def max_slot(state: StateDir) -> int:
    slots = [-1]
    with contextlib.suppress(FileNotFoundError):
        for path in state.ingress.glob("*.json"):
            with contextlib.suppress(ValueError):
                slots.append(int(path.stem))
    return max(slots)


def open_log(path: Path) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, 0o600)


def tail(path: Path, lines: int = 3) -> str:
    try:
        with open_regular(path) as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            last = f.read().decode(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return "; its log ends: " + " | ".join(line.strip() for line in last) if last else ""


async def ask(state: StateDir, slot: int, pid: int, target: str) -> bytes | None:
    """What the process `pid` of `slot` answers to ``GET target`` on its own socket, within
    `ASK_TIMEOUT_S`; None if it does not (gone, stopped, stuck, or no such socket)."""
    with trio.move_on_after(ASK_TIMEOUT_S):
        with contextlib.suppress(OSError, h11.ProtocolError, trio.BrokenResourceError, SourceError):
            stream = await trio.open_unix_socket(str(state.ingress_socket(slot, pid)))
            async with stream:
                conn = h11.Connection(h11.CLIENT)
                request = h11.Request(
                    method="GET",
                    target=target,
                    headers=[("Host", "ingress"), ("Connection", "close")],
                )
                await stream.send_all(conn.send(request) + (conn.send(h11.EndOfMessage()) or b""))
                return (await read_answer(stream, conn, ANSWER_LIMIT))[1]
    return None


def forget_sockets(state: StateDir, slot: int, pid: int) -> None:
    """The Unix sockets (and the beat) of process `pid` of `slot`, which has exited: one that
    was killed could not remove them itself."""
    for path in (
        state.ingress_socket(slot, pid),
        state.ingress_handover(slot, pid),
        state.ingress_beat(slot, pid),
    ):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


async def take_listeners(state: StateDir, record: Record) -> list[int]:
    """Descriptors of the listening sockets of `record`'s process (now also ours, close-on-exec),
    for its successor; [] if it does not give them in `ASK_TIMEOUT_S`."""
    room = socket.CMSG_SPACE(MAX_LISTENERS * array.array("i").itemsize)
    with trio.move_on_after(ASK_TIMEOUT_S):
        with contextlib.suppress(OSError):
            sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with sock:
                await sock.connect(str(state.ingress_handover(record.slot, record.pid)))
                _, ancillary, _, _ = await sock.recvmsg(1, room, socket.MSG_CMSG_CLOEXEC)
                fds = array.array("i")
                for level, kind, data in ancillary:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                return list(fds)
    return []


def left_behind(state: StateDir) -> list[Record]:
    """The ingress processes of `state` still running (as ours) with no daemon there: what a
    daemon stopped by a signal left for the next one to adopt."""
    directory = state.ingress
    if not directory.is_dir():
        return []
    found = [Record.read(path) for path in sorted(directory.glob("*.json"))]
    return [r for r in found if r is not None and r.alive(state)]


def stop_leftovers(state: StateDir) -> None:
    """Tell the ingress processes an earlier daemon of `state` left to stop (a daemon that
    runs no ingress): each drains and exits on its own."""
    directory = state.ingress
    if not directory.is_dir():
        return
    for path in sorted(directory.glob("*.json")):
        record = Record.read(path)
        if record is not None and record.alive(state):
            with contextlib.suppress(OSError):
                os.kill(record.pid, signal.SIGTERM)
                logger.info(
                    "ingress: stopping process %d (pid %d): no ingress is wanted",
                    record.slot,
                    record.pid,
                )
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
