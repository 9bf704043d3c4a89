"""Whether an ingress process still runs its own code, told within two seconds: a health check
over its socket is too slow a signal (an answer may lag behind a flood of its own work, so
three must be missed, five seconds apart), so each process also beats.

The process writes the time (``time.monotonic()``, one clock for every process of the machine)
into a file of its own every `BEAT_PERIOD_S`, from a task of its event loop: a loop that is
stuck (a blocking call, a deadlock, a frozen cgroup) stops beating. The daemon looks at the
process table and the beat every `LOOK_PERIOD_S`. A process found stopped (SIGSTOP) on two
looks in a row is killed; so is one whose beat is older than `STALE_AFTER_S` on two looks in a
row while it had no CPU time between them and was not waiting for one (it runs nothing: frozen,
or blocked). One that had CPU time is busy, and one waiting for a CPU is starved, not stuck (a
flood, or a loaded machine, delays a healthy process's beats by a second or more), unless its
beat is older than `SPIN_AFTER_S` (its loop spins, or the machine is hopelessly overloaded). A
look that itself came late (the daemon starved of CPU, the machine suspended) judges nothing.
A process that writes no beat (one started by an earlier version) is judged by the process
table and its health checks only.

The beat is written by path each time, never through a link (a file removed or replaced is
written anew at the next beat), and read as a regular file only: the daemon's loop never waits
on what it finds there.
"""

from __future__ import annotations

import contextlib
import math
import os
import struct
import time
from pathlib import Path

import attrs
import trio

from .._files import open_regular
from .._procfs import cpu_ticks, run_state

#: How often a process writes its beat.
BEAT_PERIOD_S = 0.2
#: How often the daemon looks at each process.
LOOK_PERIOD_S = 0.25
#: A beat this old is stale: the process's loop has run none of its tasks for that long.
STALE_AFTER_S = 1.0
#: A beat this old is stale even while the process has CPU time: its loop spins.
SPIN_AFTER_S = 5.0
#: A look that comes this much later than asked judges nothing (the daemon was not running).
LATE_LOOK_S = 0.5
_BEAT = struct.Struct("<d")


async def keep_beating(path: Path) -> None:
    """Write the time into `path` (0600) every `BEAT_PERIOD_S` until cancelled; remove it then."""
    try:
        while True:
            _beat(path)
            await trio.sleep(BEAT_PERIOD_S)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _beat(path: Path) -> None:
    # O_NOFOLLOW and O_NONBLOCK: a link or a FIFO put in its place is refused at once (a FIFO
    # without a reader would hold the loop); it is removed, and the next beat writes anew.
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    try:
        # One small write at offset 0: a reader sees the old time or the new, whole.
        os.pwrite(fd, _BEAT.pack(time.monotonic()), 0)
    except OSError:
        pass  # not a regular file after all: the next beat finds out again
    finally:
        os.close(fd)


def beat_age(path: Path) -> float | None:
    """How long ago the last beat in `path` was written; None if there is no readable beat
    (no such file, not a regular file, not whole). A time in the future is not one the
    process wrote: infinitely old."""
    try:
        with open_regular(path) as f:
            data = f.read(_BEAT.size)
    except OSError:
        return None
    if len(data) != _BEAT.size:
        return None
    age: float = time.monotonic() - _BEAT.unpack(data)[0]
    return age if age > -1.0 else math.inf


@attrs.frozen
class Look:
    """What one look at a process saw."""

    late_s: float
    """How much later than due the look came."""
    stopped: bool
    beat_age_s: float | None
    cpu_ticks: int | None
    runnable: bool = False
    """Waiting for a CPU (``R``): on a loaded machine, a healthy process's beat is late by as
    long as it waits, and it gets no CPU time meanwhile either."""


@attrs.define
class Judge:
    """A process's looks so far; `look` says why it is to be killed, once it is."""

    stopped: int = 0
    stuck: int = 0
    last_cpu: int | None = None
    beats: bool = False
    """Whether a beat was ever seen: then one gone is as stale as can be (the process writes
    it anew at each beat), not a process of an earlier version that writes none."""

    def look(self, seen: Look) -> str | None:
        """One look: the reason to kill the process, or None."""
        if seen.beat_age_s is not None:
            self.beats = True
        elif self.beats:
            seen = attrs.evolve(seen, beat_age_s=math.inf)
        ran = (
            seen.cpu_ticks is not None
            and self.last_cpu is not None
            and seen.cpu_ticks > self.last_cpu
        )
        self.last_cpu = seen.cpu_ticks
        if seen.late_s > LATE_LOOK_S:
            self.stopped = self.stuck = 0  # the daemon did not run: the beats may be as late
            return None
        self.stopped = self.stopped + 1 if seen.stopped else 0
        age = seen.beat_age_s
        stale = not seen.stopped and age is not None and age > STALE_AFTER_S
        idle = not ran and not seen.runnable  # asleep or blocked, its beat overdue
        stuck = stale and (idle or (age is not None and age > SPIN_AFTER_S))
        self.stuck = self.stuck + 1 if stuck else 0
        if self.stopped >= 2:
            return "was stopped (SIGSTOP?)"
        if self.stuck >= 2:
            # Infinitely old: its beat is gone, or says a time to come.
            since = f"for {age:.1f}s" if age is not None and age < math.inf else "since it beat"
            if ran:
                return f"ran no task of its event loop {since} (a spin?)"
            return f"ran none of its code {since} (stuck?)"
        return None


async def until_dead_or_stuck(pid: int, beat: Path) -> str:
    """Look at process `pid` (and its `beat`) every `LOOK_PERIOD_S`; return why it is to be
    killed, once it is (or be cancelled)."""
    judge = Judge()
    while True:
        due = trio.current_time() + LOOK_PERIOD_S
        await trio.sleep_until(due)
        state = run_state(pid)
        late_s = trio.current_time() - due
        seen = Look(late_s, state in ("T", "t"), beat_age(beat), cpu_ticks(pid), state == "R")
        why = judge.look(seen)
        if why is not None:
            return why
