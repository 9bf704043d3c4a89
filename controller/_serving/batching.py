"""Dynamic batching: ``@controller.batch`` on an async function or method that takes a list and
returns a list of the same length. Each caller passes one item and awaits its own result; the
items that arrive within ``batch_wait_timeout_s`` of the first (or ``max_batch_size`` of them,
whichever comes first) run as one call.

A batcher is one task per decorated function (per instance, for a method) and trio run: a
system task, so that no caller's cancellation can break a batch the others wait on. A caller
cancelled while its item waits takes it out; one cancelled while its batch runs leaves it
running for the others, and its result is dropped. An exception of the call fails exactly the
callers of that batch.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, overload

import attrs
import outcome
import trio

from .._model.records.code_report import BatchNumbers
from .._model.values.errors import ConfigError
from .._ports.context import replica_only
from .calls import escaped, for_one_caller
from .multiplex import replica_shelf

#: A function batched: called with one item (and its `self`, for a method), it returns that
#: item's result. (Typed loosely: the decorated function takes the list.)
Batched = Callable[..., Awaitable[Any]]

#: The most items one batch may hold: a batch holds that many requests' places at once.
MAX_BATCH_SIZE = 10_000


@attrs.define(eq=False)
class _Item:
    value: object
    at: float
    done: trio.Event = attrs.field(factory=trio.Event)
    taken: bool = False
    result: outcome.Outcome[Any] | None = None


@attrs.define(eq=False)
class BatchStats:
    """What a batcher has done: for tests and a replica's own view (``batch_stats``)."""

    batches: int = 0
    items: int = 0
    largest: int = 0
    sizes: list[int] = attrs.field(factory=list)
    """The sizes of the most recent batches (the last 1,000)."""
    waited_s: float = 0.0
    """How long its batches waited, each from its first item's arrival to its run, summed."""


@attrs.define(eq=False)
class _Batcher:
    call: Callable[[list[Any]], Awaitable[Any]]
    max_size: int
    wait_s: float
    name: str
    queue: list[_Item] = attrs.field(factory=list)
    arrived: trio.Event = attrs.field(factory=trio.Event)
    stats: BatchStats = attrs.field(factory=BatchStats)

    async def submit(self, value: object) -> Any:
        item = _Item(value, trio.current_time())
        self.queue.append(item)
        self.arrived.set()
        try:
            await item.done.wait()
        except trio.Cancelled:
            if not item.taken:
                self.queue.remove(item)  # it leaves; the batch goes on without it
            raise
        assert item.result is not None
        return item.result.unwrap()

    async def run(self) -> None:
        # Until the trio run ends (then whoever still waits is cancelled with it).
        while True:
            await self._next_batch()

    async def _next_batch(self) -> None:
        while not self.queue:
            self.arrived = trio.Event()
            await self.arrived.wait()
        # The wait counts from the first item's arrival as the batcher sees it: the items that
        # come meanwhile join, up to the batch's size.
        with trio.move_on_after(self.wait_s):
            while len(self.queue) < self.max_size:
                self.arrived = trio.Event()
                await self.arrived.wait()
        batch, self.queue = self.queue[: self.max_size], self.queue[self.max_size :]
        if not batch:
            return  # all left while it waited
        for item in batch:
            item.taken = True
        self._count(len(batch), trio.current_time() - batch[0].at)
        got = await outcome.acapture(self.call, [item.value for item in batch])
        results: Sequence[outcome.Outcome[Any]]
        if isinstance(got, outcome.Error):
            error = escaped(got.error)
            if error is None:  # Cancelled: the run ends, and its waiters with it
                got.unwrap()
            assert error is not None
            # One outcome each (an outcome is unwrapped once), each with its own copy.
            results = [outcome.Error(for_one_caller(error)) for _ in batch]
        elif not isinstance(got.value, list | tuple) or len(got.value) != len(batch):
            problem = TypeError(
                f"{self.name}: a batched function must return a list of one result per item "
                f"(got {_shape(got.value)} for {len(batch)} items)"
            )
            results = [outcome.Error(problem) for _ in batch]
        else:
            results = [outcome.Value(value) for value in got.value]
        for item, result in zip(batch, results, strict=True):
            item.result = result
            item.done.set()

    def numbers(self) -> BatchNumbers:
        """What its replica's load report says of it."""
        stats = self.stats
        return BatchNumbers(self.name, stats.batches, stats.items, stats.largest, stats.waited_s)

    def _count(self, size: int, waited_s: float) -> None:
        stats = self.stats
        stats.waited_s += waited_s
        stats.batches += 1
        stats.items += size
        stats.largest = max(stats.largest, size)
        stats.sizes.append(size)
        del stats.sizes[:-1000]


def _shape(value: object) -> str:
    if isinstance(value, list | tuple):
        return f"{len(value)} results"
    return type(value).__name__


@overload
def batch(fn: Callable[..., Awaitable[Any]], /) -> Batched: ...
@overload
def batch(
    *, max_batch_size: int = 10, batch_wait_timeout_s: float = 0.01
) -> Callable[[Callable[..., Awaitable[Any]]], Batched]: ...
def batch(
    fn: Callable[..., Awaitable[Any]] | None = None,
    /,
    *,
    max_batch_size: int = 10,
    batch_wait_timeout_s: float = 0.01,
) -> Batched | Callable[[Callable[..., Awaitable[Any]]], Batched]:
    """Run the calls that arrive within `batch_wait_timeout_s` of each other (at most
    `max_batch_size` of them) as one call of the decorated ``async def f(items: list) -> list``
    (or method ``async def m(self, items)``); each caller calls it with one item and gets its
    own result. As Ray Serve's ``@serve.batch``, with its defaults (10, 10 ms)."""
    size = _size(max_batch_size)
    wait_s = _wait(batch_wait_timeout_s)

    def decorate(fn: Callable[..., Awaitable[Any]]) -> Batched:
        if not inspect.iscoroutinefunction(fn):
            raise ConfigError(
                "batch",
                "decorates an async def taking a list of items",
                getattr(fn, "__name__", fn),
            )
        params = list(inspect.signature(fn).parameters)
        method = len(params) == 2
        if len(params) not in (1, 2):
            raise ConfigError(
                "batch",
                "decorates `async def f(items)` or a method `async def m(self, items)`",
                fn.__qualname__,
            )
        batchers: trio.lowlevel.RunVar[dict[int, _Batcher]] = trio.lowlevel.RunVar(
            f"batchers of {fn.__qualname__}"
        )

        @functools.wraps(fn)
        async def one(*args: Any) -> Any:
            if len(args) != len(params):
                raise TypeError(
                    f"{fn.__qualname__} is batched: call it with one item (its callers' items "
                    "are gathered into the list it takes)"
                )
            owner, value = (args[0], args[1]) if method else (None, args[0])
            return await _batcher(batchers, fn, owner, size, wait_s).submit(value)

        one.batch_stats = functools.partial(_stats, batchers)  # type: ignore[attr-defined]
        return one

    return decorate if fn is None else decorate(fn)


def _batcher(
    batchers: trio.lowlevel.RunVar[dict[int, _Batcher]],
    fn: Callable[..., Awaitable[Any]],
    owner: object,
    size: int,
    wait_s: float,
) -> _Batcher:
    try:
        known = batchers.get()
    except LookupError:
        known = {}
        batchers.set(known)
    key = id(owner)
    found = known.get(key)
    if found is None:
        # It holds its owner (an instance): the id is not reused while the batcher lives.
        call = fn if owner is None else functools.partial(fn, owner)
        found = known[key] = _Batcher(call, size, wait_s, fn.__qualname__)
        replica_shelf().batchers.append(found)  # its numbers go with its replica's load
        # Outside every request's scope: the replica it serves, not the request that started it
        # (a deadline, a canary's side), is what its calls see.
        trio.lowlevel.spawn_system_task(
            found.run, name=f"batcher of {fn.__qualname__}", context=replica_only()
        )
    return found


def _stats(batchers: trio.lowlevel.RunVar[dict[int, _Batcher]], owner: object = None) -> BatchStats:
    """The batcher's numbers in this trio run (of `owner`'s, for a method)."""
    try:
        found = batchers.get().get(id(owner))
    except LookupError:
        found = None
    return BatchStats() if found is None else found.stats


def _size(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH_SIZE:
        raise ConfigError(
            "max_batch_size", f"must be a whole number from 1 to {MAX_BATCH_SIZE}", value
        )
    return value


def _wait(value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= 3600
    ):
        raise ConfigError("batch_wait_timeout_s", "must be seconds from 0 to 3600", value)
    return float(value)
