"""Awaiting a Ray ObjectRef from trio, without a thread per wait.

``ref.future()`` gives a ``concurrent.futures.Future`` that Ray completes from its own thread; its
done-callback hands the wake-up to the trio loop with ``run_sync_soon``, which is thread-safe. So a
wait costs no thread, and cancelling it simply stops waiting (``trio.to_thread.run_sync(ray.get)``
could not be cancelled at all). ``wait_refs`` waits for many with one task (a wave of health
checks).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Callable, Sequence
from typing import TypeVar

import ray
import trio

from .._ports.arrivals import Arrivals

T = TypeVar("T")


async def wait_ref(ref: ray.ObjectRef[T], *, cancel_remote: bool = False) -> T:
    """The value of `ref`, or the exception Ray raises for it (e.g. ``RayActorError``).

    Cancellation propagates as usual and stops only the wait: the remote call goes on unless
    `cancel_remote` asks Ray to cancel it too (best effort; used for calls that never end).
    """
    future: concurrent.futures.Future[T] = ref.future()
    if not future.done():
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()

        def wake(_: object) -> None:
            # If the trio run ended meanwhile, nobody is waiting any more.
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(done.set)

        future.add_done_callback(wake)
        try:
            await done.wait()
        except trio.Cancelled:
            if cancel_remote:
                ray.cancel(ref)
            raise
    else:
        await trio.lowlevel.checkpoint()
    return future.result()


async def wait_refs(
    refs: Sequence[ray.ObjectRef[T]],
    on_done: Callable[[list[tuple[int, concurrent.futures.Future[T]]]], None],
) -> None:
    """Wait for all of `refs` with one task: `on_done` is handed those done since it was last
    called (each as its index and its future, whose ``result`` is the value or raises), until
    all are. Cancelled, it stops waiting, and hands on nothing more."""
    futures = [ref.future() for ref in refs]
    token = trio.lowlevel.current_trio_token()
    done: Arrivals[int] = Arrivals()
    for index, future in enumerate(futures):

        def wake(_: object, index: int = index) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(done.put, index)

        future.add_done_callback(wake)
    left = len(futures)
    while left:
        got = await done.take()
        left -= len(got)
        on_done([(index, futures[index]) for index in got])
