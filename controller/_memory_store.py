"""A store that keeps checkpoints in memory: for tests, and for controllers that need no restart."""

from __future__ import annotations

from collections.abc import Mapping
from typing import final

import attrs
import trio


@final
@attrs.define(eq=False)
class MemoryStore:
    """Checkpoints in a dict. Hand the same instance to a new controller to simulate a restart."""

    data: dict[str, str] = attrs.field(factory=dict)
    """The stored keys and their JSON text; tests may read or corrupt it."""
    writes: int = 0
    """How many ``write`` calls landed."""

    async def read_all(self) -> dict[str, str]:
        await trio.lowlevel.checkpoint()
        return dict(self.data)

    async def write(self, changes: Mapping[str, str | None]) -> None:
        # A checkpoint first, like a real store's I/O, so that callers cannot rely on writes
        # being synchronous.
        await trio.lowlevel.checkpoint()
        for key, text in changes.items():
            if text is None:
                self.data.pop(key, None)
            else:
                self.data[key] = text
        self.writes += 1
