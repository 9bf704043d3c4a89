"""A benchmark leaves no process behind, a crashed or interrupted run included.

``leave_nothing()``, called first thing in a benchmark's ``main``, makes the benchmark's process
a child subreaper (Linux's ``PR_SET_CHILD_SUBREAPER``): whatever it starts, and whatever those
start and abandon (a daemon's workers and fork server, its ingress processes, Ray's raylet and
workers), stays its descendant, even after the process in between is killed -9 or exits, and
instead of passing to init. At the benchmark's exit, however it exits (a normal end, an uncaught
exception, Ctrl-C or SIGTERM), every descendant still alive is killed.

What this cannot cover: the benchmark itself killed with SIGKILL (nothing of it runs then), and
a process that moved out of its tree on purpose (none of ours does).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import sys
import time
from types import FrameType

_PR_SET_CHILD_SUBREAPER = 36
#: How many times to look again: a process killed while it forked may leave a child that the
#: first sweep did not see yet.
_SWEEPS = 5


def leave_nothing() -> None:
    """Adopt every orphaned descendant from now on, and kill all descendants at exit."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        print(f"reaper: cannot become a subreaper ({os.strerror(errno)})", file=sys.stderr)
    # SIGTERM's default ends the process without running atexit: make it an exit.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    atexit.register(kill_descendants)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def descendants(root: int) -> list[int]:
    """The pids of every live descendant of `root` (from /proc, at this instant)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                parent = int(f.read().rpartition(b")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        children.setdefault(parent, []).append(int(entry))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_descendants() -> list[int]:
    """SIGKILL every descendant of this process, reap those that are ours, and return the pids
    killed (and say so: a benchmark that ends cleanly leaves none)."""
    killed: list[int] = []
    for _ in range(_SWEEPS):
        found = [pid for pid in descendants(os.getpid()) if pid not in killed]
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed.extend(found)
        # Reap what is now ours (subreaped orphans included), so no zombie outlives us either.
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.01)
    if killed:
        print(f"reaper: killed {len(killed)} process(es) left behind", file=sys.stderr)
    return killed
