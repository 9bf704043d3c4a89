"""The Store protocol: where the controller keeps its intent. A flat map of keys to JSON text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class Store(Protocol):
    """Durable key-value storage for checkpoints.

    ``write`` is atomic: every change in one call lands, or none does. When it returns, the
    changes survive a crash of the controller. Writes issued concurrently may be grouped into one
    transaction; a later write of a key wins over an earlier one.
    """

    async def read_all(self) -> dict[str, str]:
        """Every key and its text."""
        ...

    async def write(self, changes: Mapping[str, str | None]) -> None:
        """Set each key to its text; None deletes the key."""
        ...
