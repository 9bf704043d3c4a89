"""The Ray actor's trio loop for replicas' async methods, without Ray: asyncio calling in."""

from __future__ import annotations

import asyncio

import pytest
import trio

from controller.ray._trio_thread import TrioThread


def test_async_methods_run_under_trio_and_share_one_loop() -> None:
    thread = TrioThread()
    made: list[trio.Event] = []

    async def make() -> int:
        await trio.sleep(0.001)
        made.append(trio.Event())
        return 42

    async def use() -> bool:
        made[0].set()  # an Event of the first call: one loop for both
        await made[0].wait()
        return True

    async def fails() -> None:
        await trio.lowlevel.checkpoint()
        raise ValueError("bad port")

    async def main() -> None:
        assert await thread.run(make) == 42
        assert await thread.run(use) is True
        with pytest.raises(ValueError, match="bad port"):
            await thread.run(fails)

    asyncio.run(main())


def test_cancelling_the_caller_cancels_the_trio_task() -> None:
    thread = TrioThread()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        begun: asyncio.Future[None] = loop.create_future()
        cancelled: asyncio.Future[None] = loop.create_future()

        async def hangs() -> None:
            loop.call_soon_threadsafe(begun.set_result, None)
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                loop.call_soon_threadsafe(cancelled.set_result, None)
                raise

        call = asyncio.ensure_future(thread.run(hangs))
        await begun
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.wait_for(cancelled, 10)  # a bound, not a wait: it comes at once

    asyncio.run(main())
