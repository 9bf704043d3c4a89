"""The verdict on an ingress process's liveness (`controller._daemon.liveness`), from exact
looks, and its beat as written and read (links, FIFOs, garbage), in virtual time."""

from __future__ import annotations

import math
import os
import struct
import time
from pathlib import Path

import trio
import trio.testing

from controller._daemon.liveness import (
    LATE_LOOK_S,
    SPIN_AFTER_S,
    STALE_AFTER_S,
    Judge,
    Look,
    beat_age,
    keep_beating,
)

FRESH = 0.1
STALE = STALE_AFTER_S + 0.1


def looks(judge: Judge, *seen: tuple[float | None, int], late_s: float = 0.0) -> list[str | None]:
    """`judge`'s verdict on each (beat age, CPU ticks so far) look."""
    return [judge.look(Look(late_s, False, age, cpu)) for age, cpu in seen]


def test_a_stale_beat_and_no_cpu_time_on_two_looks_in_a_row_kills() -> None:
    """Frozen, or blocked in a call: it runs nothing, so its CPU time stands still."""
    verdicts = looks(Judge(), (FRESH, 10), (STALE, 10), (STALE + 0.25, 10))
    assert verdicts == [None, None, f"ran none of its code for {STALE + 0.25:.1f}s (stuck?)"]


def test_a_stale_beat_while_the_process_has_cpu_time_is_a_busy_process_not_a_stuck_one() -> None:
    """Found by a trial: a flood on a loaded machine delayed a healthy process's beat by 1.6 s,
    and it was killed. It had CPU time meanwhile: it is spared until its loop looks spun."""
    judge = Judge()
    assert looks(judge, (FRESH, 10), (STALE, 12), (STALE + 1, 15), (STALE + 2, 19)) == [None] * 4
    spun = looks(judge, (SPIN_AFTER_S + 0.1, 30), (SPIN_AFTER_S + 0.35, 40))
    assert spun == [None, f"ran no task of its event loop for {SPIN_AFTER_S + 0.35:.1f}s (a spin?)"]


def test_a_stale_beat_while_the_process_waits_for_a_cpu_is_a_starved_process() -> None:
    """An idle ingress process gets no measurable CPU time in a quarter of a second, so on a
    loaded machine one that waited a second for a CPU looked stuck. Waiting for a CPU (``R``),
    it is spared until its beat is as old as a spin's."""
    judge = Judge()
    for _ in range(4):
        assert judge.look(Look(0, False, STALE + 1, 10, runnable=True)) is None
    assert judge.look(Look(0, False, SPIN_AFTER_S + 0.1, 10, runnable=True)) is None
    assert judge.look(Look(0, False, SPIN_AFTER_S + 0.35, 10, runnable=True)) is not None


def test_one_stuck_look_between_fresh_ones_kills_nothing() -> None:
    judge = Judge()
    seen = [(STALE, 10), (FRESH, 10), (STALE, 10), (FRESH, 10), (STALE, 10)]
    assert looks(judge, *seen) == [None] * 5


def test_a_late_look_judges_nothing_and_starts_the_count_again() -> None:
    """The daemon itself did not run (starved, suspended): the beats may be as late as it."""
    judge = Judge()
    assert looks(judge, (STALE, 10), (STALE, 10)) == [
        None,
        looks(Judge(), (STALE, 1), (STALE, 1))[1],
    ]
    judge = Judge()
    assert looks(judge, (STALE, 10)) == [None]
    assert looks(judge, (STALE, 10), late_s=LATE_LOOK_S + 0.1) == [None]
    assert looks(judge, (STALE, 10)) == [None]
    assert looks(judge, (STALE, 10)) != [None]


def test_a_stopped_process_is_told_as_stopped_not_stuck() -> None:
    judge = Judge()
    assert judge.look(Look(0, True, STALE, 10)) is None
    assert judge.look(Look(0, True, STALE, 10)) == "was stopped (SIGSTOP?)"


def test_a_beat_gone_after_it_was_seen_is_as_stale_as_can_be() -> None:
    """Found by a trial: a beat file removed just before the process froze was never written
    again, and the frozen process was judged by its health checks only (killed after 18 s)."""
    verdicts = looks(Judge(), (FRESH, 10), (None, 10), (None, 10))
    assert verdicts == [None, None, "ran none of its code since it beat (stuck?)"]


def test_a_process_that_writes_no_beat_is_judged_by_the_process_table_only() -> None:
    """One started by an earlier version: its health checks still judge it, slowly."""
    assert looks(Judge(), *[(None, 10)] * 10) == [None] * 10


async def test_the_beat_is_written_while_the_loop_runs_and_removed_after(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    beat = tmp_path / "0.1.beat"
    assert beat_age(beat) is None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(keep_beating, beat)
        await trio.testing.wait_all_tasks_blocked()
        age = beat_age(beat)
        assert age is not None
        assert 0 <= age < 5  # the machine's monotonic clock, shared by its processes
        assert beat.stat().st_mode & 0o777 == 0o600
        # Removed, or replaced by another file: written anew at the next beat.
        beat.unlink()
        await trio.sleep(1)
        assert beat_age(beat) is not None
        beat.write_bytes(struct.pack("<d", 0.0))
        await trio.sleep(1)
        again = beat_age(beat)
        assert again is not None
        assert again < 5
        nursery.cancel_scope.cancel()
    assert not beat.exists()


async def test_a_link_or_a_fifo_in_place_of_the_beat_holds_up_no_one(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Found by a trial: a FIFO behind a symlink where the beat was hung the daemon's loop (the
    read's open waited for a writer) for 18 s, and its lease was renewed late."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    beat = tmp_path / "0.1.beat"
    beat.symlink_to(fifo)
    with trio.fail_after(1):  # virtual time: a wait on the FIFO would block the whole run
        assert beat_age(beat) is None
        beat.unlink()
        os.mkfifo(beat)
        assert beat_age(beat) is None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_beating, beat)  # removes the FIFO, then beats
            await trio.sleep(0.5)
            assert beat_age(beat) is not None
            nursery.cancel_scope.cancel()


def test_a_torn_a_garbled_or_a_future_beat(tmp_path: Path) -> None:
    beat = tmp_path / "0.1.beat"
    beat.write_bytes(b"\x01\x02")
    assert beat_age(beat) is None  # not whole: none
    beat.write_bytes(b"AAAAAAAA")  # a time far in the future: not one the process wrote
    assert beat_age(beat) == math.inf
    beat.write_bytes(struct.pack("<d", time.monotonic() - 3))
    age = beat_age(beat)
    assert age is not None
    assert 3 <= age < 10
