"""What LocalRuntime asks Linux about processes: descriptors, exit statuses, memory."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import struct
from pathlib import Path
from typing import IO

# struct pidfd_info of <linux/pidfd.h> (its first version, 64 bytes): the mask in and out, the
# cgroup id, then eleven 32-bit ids, then the exit code (a wait status).
_PIDFD_INFO_SIZE = 64
_PIDFD_INFO_EXIT = 1 << 3
_EXIT_CODE_AT = 16 + 4 * 11
# _IOWR(PIDFS_IOCTL_MAGIC=0xFF, 11, struct pidfd_info)
_PIDFD_GET_INFO = (3 << 30) | (_PIDFD_INFO_SIZE << 16) | (0xFF << 8) | 11


def inheritable_fds(keep: set[int]) -> list[int]:
    """This process's open descriptors that a child would inherit (no close-on-exec), but for
    `keep`. Python opens everything close-on-exec; what is left was made inheritable on
    purpose by someone (hypercorn does it to its listening sockets) and is not for our workers."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd in keep:
            continue
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            if os.get_inheritable(fd):
                found.append(fd)
    return found


def exit_status(pid: int, pidfd: int) -> int | None:
    """The wait status of an exited process that is not our child, or None if Linux will not
    say. After init reaps it, only its pidfd knows (Linux 6.15 and later); before, its zombie's
    ``/proc/<pid>/stat`` does (and the pid cannot be reused while it is a zombie)."""
    info = bytearray(struct.pack("=Q", _PIDFD_INFO_EXIT) + bytes(_PIDFD_INFO_SIZE - 8))
    with contextlib.suppress(OSError):
        fcntl.ioctl(pidfd, _PIDFD_GET_INFO, info)
        (mask,) = struct.unpack_from("=Q", info, 0)
        if mask & _PIDFD_INFO_EXIT:
            (status,) = struct.unpack_from("=i", info, _EXIT_CODE_AT)
            return int(status)
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
    except OSError:
        return None
    # After the command: state is the first field, exit_code the 50th (Linux 3.5 and later).
    if len(fields) < 50 or fields[0] != b"Z":
        return None
    return int(fields[49])


def describe_exit(status: int | None) -> str:
    """``worker process killed by SIGKILL``, ``worker process exited with code 3``..."""
    if status is None:
        return "worker process exited (its exit status is unknown)"
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"worker process killed by {name}"
    return f"worker process exited with code {code}"


def memory_bytes() -> int | None:
    """This machine's memory in all, from ``/proc/meminfo``."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def scan_workers(
    runtime_dir: Path,
    module: str,
    zygote_module: str | None = None,
    unreadable: dict[int, str] | None = None,
) -> dict[str, set[int]]:
    """The live workers of `runtime_dir`, from /proc: each tag with the pids that claim it (one,
    unless something poses as the worker: only the real one holds its socket, which is how
    LocalRuntime tells them apart).

    A spawned worker's command line names its spec file. A worker forked by the fork server
    (`zygote_module`) has the fork server's command line, which names `runtime_dir`: it is found
    by the ``<id>.pid`` file it wrote there, whose pid and start time it must match (a pid
    reused since is not taken for it), and its tag is in ``<id>.spec.json`` beside it.

    A worker of `runtime_dir` whose spec file cannot be read (a link put in its place, gone,
    damaged) has no tag to be found by: it goes in `unreadable` (pid: why), if given."""
    found: dict[str, set[int]] = {}
    prefix = str(runtime_dir) + os.sep
    forked = _pid_files(runtime_dir) if zygote_module is not None else {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        args = command_line(pid)
        if args is None:
            continue
        if len(args) == 3 and args[:2] == [b"-m", module.encode()]:
            spec_path = os.fsdecode(args[2])
            if not spec_path.startswith(prefix):
                continue
        elif (
            zygote_module is not None
            and args[:3] == [b"-m", zygote_module.encode(), os.fsencode(runtime_dir)]
            and pid in forked
            and forked[pid][0] == start_time(pid)
        ):
            spec_path = forked[pid][1]
        else:
            continue
        try:
            with _open_no_link(spec_path) as f:
                found.setdefault(json.load(f)["tag"], set()).add(pid)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if unreadable is not None:
                unreadable[pid] = f"its spec file {spec_path} cannot be read ({exc})"
            continue
    return found


def _pid_files(runtime_dir: Path) -> dict[int, tuple[str, str]]:
    """What the ``<id>.pid`` files of `runtime_dir` say: each pid with its start time and the
    spec file beside it."""
    found: dict[int, tuple[str, str]] = {}
    # No directory (yet): no pid files; what is wrong with it is for its creation to say.
    with (
        contextlib.suppress(FileNotFoundError, NotADirectoryError),
        os.scandir(runtime_dir) as entries,
    ):
        for entry in entries:
            if not entry.name.endswith(".pid") or entry.name.startswith("."):
                continue
            try:
                with _open_no_link(entry.path) as f:
                    pid, start = f.read().split()
                found[int(pid)] = (start, entry.path[: -len(".pid")] + ".spec.json")
            except (OSError, ValueError):
                continue
    return found


def _open_no_link(path: str) -> IO[str]:
    """A worker's file, to read, not through a symlink (``_files.open_regular``'s way; this
    floor may not import that one): a link planted in the runtime dir would name a worker by
    any file's content."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags), encoding="utf-8")


def start_time(pid: int) -> str | None:
    """When `pid` started, in clock ticks after boot (``/proc/<pid>/stat``, field 22)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[19].decode()
    except (OSError, IndexError):
        return None


def run_state(pid: int) -> str | None:
    """`pid`'s state letter in ``/proc/<pid>/stat`` (``R`` running or waiting for a CPU, ``S``
    asleep, ``D`` in an uninterruptible wait, ``T`` stopped...); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return None


def cpu_ticks(pid: int) -> int | None:
    """The CPU time `pid` has had, user and system, in clock ticks (``/proc/<pid>/stat``,
    fields 14 and 15); None if it cannot be read (gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def command_line(pid: int) -> list[bytes] | None:
    """The arguments of `pid` after the interpreter and its ``-P``, if it may be a worker of
    ours: our user in every uid (a setuid program run by another user is not), and a session
    leader (a worker's forked children share its command line but not its session)."""
    me = os.geteuid()
    try:
        with open(f"/proc/{pid}/status") as f:
            uids = next(line for line in f if line.startswith("Uid:")).split()[1:]
        if any(int(uid) != me for uid in uids) or os.getsid(pid) != pid:
            return None
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except (OSError, StopIteration, ValueError):
        return None  # gone meanwhile
    # The argv after the interpreter, less the empty string after the last NUL.
    args = argv[1:-1]
    if args[:1] == [b"-P"]:
        args = args[1:]
    return args
