"""A trio loop in a thread of a Ray actor, for the replica's async methods.

LocalRuntime's worker runs trio, so a replica class may ``await trio.sleep(...)`` in its
``drain``. A Ray actor's own loop is asyncio's, where that fails ("Task got bad yield"): the
actor hands its replica's coroutines to this loop instead, so that one class runs on either
runtime. One loop for the actor's life, as the worker has one: what a method leaves behind (an
Event, a lock) is there for the next call.

No thread is parked per call: the coroutine runs as a task of the loop's nursery, and its
outcome comes back to asyncio through ``call_soon_threadsafe``. Cancelling the asyncio caller
cancels the trio task.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any, final

import outcome
import trio


@final
class TrioThread:
    """Started by the first call; a daemon thread, so it never holds the actor's exit."""

    def __init__(self) -> None:
        self._loop: tuple[trio.Nursery, trio.lowlevel.TrioToken] | None = None
        self._starting = threading.Lock()

    async def run(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """``await fn(*args)`` under trio, its result or exception returned to the caller."""
        nursery, token = self._loop if self._loop is not None else await self._start()
        loop = asyncio.get_running_loop()
        done: asyncio.Future[outcome.Outcome[Any]] = loop.create_future()
        scope = trio.CancelScope()

        async def call() -> None:
            with scope:
                result = await outcome.acapture(fn, *args)
                # Its caller's loop may have closed meanwhile (the actor, or a test's loop,
                # going away): nobody waits for the outcome, and the trio loop must go on.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_settle, done, result)

        token.run_sync_soon(nursery.start_soon, call)
        try:
            result = await done
        except asyncio.CancelledError:
            token.run_sync_soon(scope.cancel)
            raise
        return result.unwrap()

    async def start(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start `fn(*args)` as a service of the loop, as ``nursery.start`` does (it calls
        ``task_status.started()`` when it is up), and return once it is: it runs on, in the
        loop's own nursery, after this call. It must catch its own errors."""

        async def start_in_loop() -> None:
            nursery = self._loop[0] if self._loop is not None else None
            assert nursery is not None
            await nursery.start(fn, *args)

        await self.run(start_in_loop)

    async def _start(self) -> tuple[trio.Nursery, trio.lowlevel.TrioToken]:
        return await asyncio.to_thread(self._started)

    def _started(self) -> tuple[trio.Nursery, trio.lowlevel.TrioToken]:
        with self._starting:
            if self._loop is None:
                ready = threading.Event()
                held: list[tuple[trio.Nursery, trio.lowlevel.TrioToken]] = []

                async def hold() -> None:
                    # Its tasks capture every outcome: nothing ever reaches this nursery.
                    async with trio.open_nursery() as nursery:
                        held.append((nursery, trio.lowlevel.current_trio_token()))
                        ready.set()
                        await trio.sleep_forever()

                thread = threading.Thread(target=trio.run, args=(hold,), daemon=True)
                thread.name = "replica-trio"
                thread.start()
                ready.wait()
                self._loop = held[0]
            return self._loop


def _settle(done: asyncio.Future[outcome.Outcome[Any]], result: outcome.Outcome[Any]) -> None:
    if not done.done():  # not if its caller was cancelled meanwhile
        done.set_result(result)
