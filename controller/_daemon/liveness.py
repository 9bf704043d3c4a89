"""Whether an ingress process still runs its own code, told within two seconds: a health check
over its socket is too slow a signal (an answer may lag behind a flood of its own work, so
three must be missed, five seconds apart), so each process also beats.

The process writes the time (``time.monotonic()``, one clock for every process of the machine)
into a file of its own every `BEAT_PERIOD_S`, from a task of its event loop: a loop that is
stuck (a blocking call, a spin, a frozen cgroup) stops beating. The daemon reads the process
table and the beat every `LOOK_PERIOD_S` and kills a process found stopped (SIGSTOP) or with a
beat older than `STALE_AFTER_S` on two looks in a row. A look that itself came late (the daemon
starved of CPU, the machine suspended) judges nothing: a busy machine delays the beats as much.
A process that writes no beat (one started by an earlier version) is judged by the process
table and its health checks only.
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from pathlib import Path

import attrs
import trio

from .._procfs import is_stopped

#: How often a process writes its beat.
BEAT_PERIOD_S = 0.2
#: How often the daemon looks at each process.
LOOK_PERIOD_S = 0.25
#: A beat this old is stale: the process's loop has run none of its tasks for that long.
STALE_AFTER_S = 1.25
#: A look that comes this much later than asked judges nothing (the daemon was not running).
LATE_LOOK_S = 0.5
_BEAT = struct.Struct("<d")


async def keep_beating(path: Path) -> None:
    """Write the time into `path` (0600) every `BEAT_PERIOD_S` until cancelled; remove it then."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        while True:
            # One small write at offset 0: a reader sees the old time or the new, whole.
            os.pwrite(fd, _BEAT.pack(time.monotonic()), 0)
            await trio.sleep(BEAT_PERIOD_S)
    finally:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def beat_of(path: Path) -> float | None:
    """The time of the last beat in `path`; None if there is no such file (or nothing whole)."""
    try:
        with open(path, "rb") as f:
            data = f.read(_BEAT.size)
    except OSError:
        return None
    return _BEAT.unpack(data)[0] if len(data) == _BEAT.size else None


@attrs.define
class Judge:
    """A process's looks so far; `look` says why it is to be killed, once it is."""

    stopped: int = 0
    stale: int = 0

    def look(self, *, late_s: float, stopped: bool, beat_age_s: float | None) -> str | None:
        """One look, `late_s` after it was due: the reason to kill the process (found stopped
        or stale on two looks in a row), or None."""
        if late_s > LATE_LOOK_S:
            self.stopped = self.stale = 0  # the daemon did not run: the beats may be as late
            return None
        self.stopped = self.stopped + 1 if stopped else 0
        stale = not stopped and beat_age_s is not None and beat_age_s > STALE_AFTER_S
        self.stale = self.stale + 1 if stale else 0
        if self.stopped >= 2:
            return "was stopped (SIGSTOP?)"
        if self.stale >= 2:
            return f"ran none of its code for {beat_age_s:.1f}s (stuck?)"
        return None


async def until_dead_or_stuck(pid: int, beat: Path) -> str:
    """Look at process `pid` (and its `beat`) every `LOOK_PERIOD_S`; return why it is to be
    killed, once it is (or be cancelled)."""
    judge = Judge()
    while True:
        due = trio.current_time() + LOOK_PERIOD_S
        await trio.sleep_until(due)
        late_s = trio.current_time() - due
        last = beat_of(beat)
        age = None if last is None else time.monotonic() - last
        why = judge.look(late_s=late_s, stopped=is_stopped(pid), beat_age_s=age)
        if why is not None:
            return why
