"""The wall clock the controller reads for the times it stores and shows (a canary's step, a
revision's, a cordon's deadline, the events): one function, so that a test under trio's
``MockClock`` drives these times as it drives ``trio.current_time()``, and a restart in the
middle of a canary's step is tested in virtual time (the stored start is where the clock was)."""

from __future__ import annotations

import sys
import time

import trio

#: Where wall time stands at a MockClock's zero: 2026-01-01T00:00:00Z, so that stored times
#: read as dates.
MOCK_EPOCH = 1_767_225_600.0


def wall_now() -> float:
    """Seconds since the Unix epoch: ``time.time()``, or, in a trio run under a ``MockClock``,
    `MOCK_EPOCH` plus its time."""
    try:
        clock = trio.lowlevel.current_clock()
    except RuntimeError:  # outside trio: the CLI, a thread
        return time.time()
    # Looked up, not imported: a MockClock in use means trio.testing was imported, and importing
    # it here would cost every daemon and worker its import of pytest (90 ms, where installed).
    testing = sys.modules.get("trio.testing")
    if testing is not None and isinstance(clock, testing.MockClock):
        virtual: float = clock.current_time()  # (the module is looked up: mypy sees Any)
        return MOCK_EPOCH + virtual
    return time.time()


def wall_offset() -> float:
    """Wall seconds minus trio seconds, now (what turns one into the other)."""
    return wall_now() - trio.current_time()
