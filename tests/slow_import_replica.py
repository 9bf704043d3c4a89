"""A replica module whose import blocks until a file exists, as one loading a model would take
its time: the test decides when it is done."""

from __future__ import annotations

import os
import time

_BARRIER = os.environ.get("SLOW_IMPORT_BARRIER", "")
while _BARRIER and not os.path.exists(_BARRIER):
    time.sleep(0.01)


class Slow:
    """Nothing to it, once imported."""
