"""``tune_gc``: the collector's thresholds for a large heap, set for the whole process."""

from __future__ import annotations

import gc

from controller._core.gc import THRESHOLDS, tune_gc


def test_tune_gc_sets_the_thresholds_and_returns_the_old_ones() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        assert tune_gc() == (700, 10, 10)
        assert gc.get_threshold() == THRESHOLDS
        young, _, old = THRESHOLDS
        assert young > 700  # fewer young collections than Python's default
        assert old > 10  # and full ones rarer still
    finally:
        gc.set_threshold(*before)
