"""The verdict on an ingress process's liveness (`controller._daemon.liveness`), from exact
looks, and its beat as written and read, in virtual time."""

from __future__ import annotations

import time
from pathlib import Path

import trio
import trio.testing

from controller._daemon.liveness import (
    LATE_LOOK_S,
    STALE_AFTER_S,
    Judge,
    beat_of,
    keep_beating,
)

FRESH = 0.1
STALE = STALE_AFTER_S + 0.1


def test_a_stale_beat_on_two_looks_in_a_row_kills() -> None:
    judge = Judge()
    assert judge.look(late_s=0, stopped=False, beat_age_s=STALE) is None
    why = judge.look(late_s=0, stopped=False, beat_age_s=STALE + 0.25)
    assert why == f"ran none of its code for {STALE + 0.25:.1f}s (stuck?)"


def test_one_stale_look_between_fresh_ones_kills_nothing() -> None:
    judge = Judge()
    for age in (STALE, FRESH, STALE, FRESH, STALE):
        assert judge.look(late_s=0, stopped=False, beat_age_s=age) is None


def test_a_late_look_judges_nothing_and_starts_the_count_again() -> None:
    """The daemon itself did not run (starved, suspended): the beats may be as late as it."""
    judge = Judge()
    assert judge.look(late_s=0, stopped=False, beat_age_s=STALE) is None
    assert judge.look(late_s=LATE_LOOK_S + 0.1, stopped=False, beat_age_s=STALE) is None
    assert judge.look(late_s=0, stopped=False, beat_age_s=STALE) is None
    assert judge.look(late_s=0, stopped=False, beat_age_s=STALE) is not None


def test_a_stopped_process_is_told_as_stopped_not_stuck() -> None:
    judge = Judge()
    assert judge.look(late_s=0, stopped=True, beat_age_s=STALE) is None
    assert judge.look(late_s=0, stopped=True, beat_age_s=STALE) == "was stopped (SIGSTOP?)"


def test_a_process_that_writes_no_beat_is_judged_by_the_process_table_only() -> None:
    """One started by an earlier version: its health checks still judge it, slowly."""
    judge = Judge()
    for _ in range(10):
        assert judge.look(late_s=0, stopped=False, beat_age_s=None) is None


async def test_the_beat_is_written_while_the_loop_runs_and_removed_after(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    beat = tmp_path / "0.1.beat"
    assert beat_of(beat) is None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(keep_beating, beat)
        await trio.testing.wait_all_tasks_blocked()
        first = beat_of(beat)
        assert first is not None
        assert abs(first - time.monotonic()) < 5  # the machine's monotonic clock
        assert beat.stat().st_mode & 0o777 == 0o600
        await trio.sleep(1)
        later = beat_of(beat)
        assert later is not None
        assert later >= first
        nursery.cancel_scope.cancel()
    assert not beat.exists()


def test_a_torn_or_empty_beat_reads_as_none(tmp_path: Path) -> None:
    beat = tmp_path / "0.1.beat"
    beat.write_bytes(b"\x01\x02")
    assert beat_of(beat) is None
