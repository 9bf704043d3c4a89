"""Python's cycle collector, set for a controller's heap.

A controller holding 100,000 replicas keeps a few million long-lived objects, almost none of
them in reference cycles (reference counting frees a stopped replica's). The collector's
defaults are made for small heaps: a full collection, which walks every object, runs after
every ten collections of the middle generation once the old one has grown by a quarter. At
100,000 replicas that meant about 26 full collections of ~0.6 s each in one scale-up,
recovery and scale-down: half the time (bench/bench.py, "GC settings").

``tune_gc`` collects the young generation after 10,000 new objects instead of 700 (young
garbage, which is where cycles are made, is still collected within that many allocations),
and the old one after 100 middle collections instead of 10. It changes the whole process, so
the daemon calls it (it owns its process) and an application embedding a controller decides
for itself.
"""

from __future__ import annotations

import gc

#: (young, middle, old): see ``gc.set_threshold``.
THRESHOLDS = (10_000, 10, 100)


def tune_gc() -> tuple[int, int, int]:
    """Set the collector's thresholds for a large, long-lived heap (``THRESHOLDS``); returns
    the ones it replaced, for ``gc.set_threshold(*old)``."""
    old = gc.get_threshold()
    gc.set_threshold(*THRESHOLDS)
    return old
