"""The threads a replica's sync handlers run in: a bounded pool of its own, cheaper per call than
``trio.to_thread`` (measured on this machine: 85-105 us of CPU a call with 32 callers, against
a few microseconds here), since what makes a call costly is waking threads, not running them.

Calls wait in one queue; a thread takes the next when it is free (up to the caller's limit of
threads, started as the calls need them). A finished call's result goes on a list, and only the
first to land there since the loop last looked wakes the trio loop: under load, one wake-up
delivers many results. A caller cancelled meanwhile (a deadline, a hang-up) is let go at once;
its call goes on in its thread until the code returns, still holding that thread, so the pool
stays bounded (and a pool all of whose threads are so held says so: its replica is replaced).
"""

from __future__ import annotations

import _thread
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any, final

import outcome
import trio


class HandlerEscaped(Exception):
    """A handler raised ``SystemExit``, ``KeyboardInterrupt`` or ``GeneratorExit`` (its cause):
    an error of that request (500), not the end of the replica."""


@final
class _Call:
    __slots__ = ("abandoned", "args", "context", "fn", "task")

    def __init__(self, task: trio.lowlevel.Task, fn: Callable[..., Any], args: tuple[Any, ...]):
        self.task = task
        self.fn = fn
        self.args = args
        self.context = contextvars.copy_context()  # the caller's (its replica's context, say)
        self.abandoned = False


@final
class HandlerThreads:
    """The threads for the sync calls of one replica."""

    def __init__(self, on_stuck_change: Callable[[], None], name: str = "handler"):
        self._on_stuck_change = on_stuck_change
        """Told when `stuck` moves (it is part of the replica's load)."""
        self.limit = 1
        """The most threads the latest call allowed."""
        self.stuck = 0
        """Calls let go of (their request ended) that still run in their threads."""
        self._name = name
        self._queue: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._started = 0
        self._busy = 0  # calls handed over and not yet delivered (abandoned ones included)
        self._done: list[tuple[_Call, outcome.Outcome[Any]]] = []
        self._lock = threading.Lock()
        self._waking = False
        self._token: trio.lowlevel.TrioToken | None = None

    @property
    def wedged(self) -> bool:
        """Every thread it may have is held by a call let go of: no sync call can run."""
        return self.stuck >= self.limit

    async def run(self, limit: int, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in a thread of the pool, which grows to `limit` threads as calls need
        them (those started stay, idle, if the limit went down); its result, or what it
        raised."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._token is None:
            self._token = trio.lowlevel.current_trio_token()
        call = _Call(trio.lowlevel.current_task(), fn, args)
        self.limit = limit
        self._busy += 1
        if self._busy > self._started and self._started < limit:
            self._start_thread()
        self._queue.put(call)

        def abort(_: Any) -> trio.lowlevel.Abort:
            call.abandoned = True  # its thread finishes it; no one hears the result
            self.stuck += 1
            self._on_stuck_change()
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abort)

    def _start_thread(self) -> None:
        self._started += 1
        # Not threading.Thread.start, which waits until the new thread runs: on a busy machine
        # that is milliseconds of the loop's time, every request of the replica held meanwhile.
        _thread.start_new_thread(self._work, (f"{self._name}-{self._started}",))

    def _work(self, name: str) -> None:
        threading.current_thread().name = name  # for tracebacks and py-spy
        while True:
            call = self._queue.get()
            try:
                result: outcome.Outcome[Any] = outcome.Value(call.context.run(call.fn, *call.args))
            except (SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
                escaped = HandlerEscaped(f"the handler raised {type(exc).__name__}")
                escaped.__cause__ = exc
                result = outcome.Error(escaped)
            except BaseException as exc:
                result = outcome.Error(exc)
            with self._lock:
                self._done.append((call, result))
                wake, self._waking = not self._waking, True
            if wake:
                assert self._token is not None
                try:
                    self._token.run_sync_soon(self._deliver)
                except trio.RunFinishedError:
                    return  # the replica's loop has ended: no one waits for anything

    def _deliver(self) -> None:
        with self._lock:
            done, self._done, self._waking = self._done, [], False
        self._busy -= len(done)
        unstuck = False
        for call, result in done:
            if call.abandoned:
                self.stuck -= 1
                unstuck = True
            else:
                trio.lowlevel.reschedule(call.task, result)
        if unstuck:
            self._on_stuck_change()
