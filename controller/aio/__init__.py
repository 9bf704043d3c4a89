"""The controller inside an asyncio application, two ways:

- ``open_in_guest_mode``: trio runs as a guest of a stock asyncio loop (``asyncio.run``,
  uvicorn). For apps whose server owns the loop; the process must never import trio_asyncio.
- ``open_under_trio_asyncio``: for apps whose entry point is ``trio_asyncio.run`` (or a trio
  program that opened a trio-asyncio loop); MockClock then drives asyncio's time as well.

Both give an ``AioController``: deploy, delete, status and watch as asyncio coroutines.
"""

# Imported on first use: open_under_trio_asyncio imports trio_asyncio, which changes asyncio for
# the whole process, so it must not come along with the guest-mode way.
from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._bridge import AioController as AioController
    from ._bridge import AioGoal as AioGoal
    from ._guest import open_in_guest_mode as open_in_guest_mode
    from ._trio_asyncio import open_under_trio_asyncio as open_under_trio_asyncio

__getattr__, __dir__ = lazy_exports(__name__, __file__)
