"""A replica class whose every method is async trio code, for the conformance check that a
runtime runs such code under trio (``check_trio_methods``). Workers import it by its
entrypoint, ``controller.testing:TrioReplica``."""

from __future__ import annotations

from typing import Any, final

import trio


@final
class TrioReplica:
    def __init__(self) -> None:
        self.config: Any = None
        # Made by one call, used by the next: the calls share one trio loop, as in a worker.
        self.drained = trio.Event()

    async def reconfigure(self, user_config: Any) -> None:
        await trio.lowlevel.checkpoint()
        self.config = user_config

    async def check_health(self) -> None:
        await trio.lowlevel.checkpoint()

    async def drain(self) -> None:
        with trio.fail_after(5):
            await trio.sleep(0.01)
        self.drained.set()
