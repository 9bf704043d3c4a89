"""Calling a handler of requests: async code as it is, on the worker's trio loop; sync code in
a thread of a bounded pool of the replica's own (``threads``: so that handlers that block never
take the threads its health checks and ``load()`` run in, nor more than the pool's threads); a
generator, sync or async, iterated an item at a time. A handler's ``SystemExit`` (or
``KeyboardInterrupt``) is an error of its request, not the end of its replica."""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import Any, final

import trio

from .threads import HandlerEscaped, HandlerThreads

#: The most threads a replica's sync handlers take at once (fewer if its
#: ``max_ongoing_requests`` is lower): more only adds contention for the GIL.
MAX_HANDLER_THREADS = 64
#: How long a streamed handler's generator may take to close once its request ends.
CLOSE_S = 5.0


@final
class Caller:
    """Calls a replica's code: its handler (`target`: a function, or a callable instance) with
    a request, or with nothing if it takes no argument; or a method a handle names."""

    def __init__(self, target: Any, on_stuck_change: Callable[[], None]):
        function = target if inspect.isroutine(target) else target.__call__
        self.function = function
        try:
            params = inspect.signature(function).parameters.values()
            self.takes_request = any(
                p.kind
                in (
                    inspect.Parameter.POSITIONAL_ONLY,
                    inspect.Parameter.POSITIONAL_OR_KEYWORD,
                    inspect.Parameter.VAR_POSITIONAL,
                )
                for p in params
            )
        except (TypeError, ValueError):
            self.takes_request = True
        self.is_async, self.makes_stream = _mode(function)
        self.threads = HandlerThreads(on_stuck_change)

    @property
    def in_thread(self) -> bool:
        """Whether it runs in a thread (and so is called with the body read)."""
        return not (self.is_async or self.makes_stream)

    async def __call__(self, request: Any, limit: int) -> Any:
        """Call it with `request`; a sync call in the pool, which grows to `limit` threads
        (its backend's max_ongoing_requests, at most `MAX_HANDLER_THREADS`) as calls need."""
        args = (request,) if self.takes_request else ()
        return await self._run(self.function, args, {}, limit, self.is_async, self.makes_stream)

    async def method(self, function: Callable[..., Any], args: Any, kwargs: Any, limit: int) -> Any:
        """Call a method a handle named, as the handler is called (a generator's items follow
        through `items`)."""
        is_async, makes_stream = _mode(function)
        return await self._run(function, tuple(args), dict(kwargs), limit, is_async, makes_stream)

    async def _run(
        self,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        limit: int,
        is_async: bool,
        makes_stream: bool,
    ) -> Any:
        try:
            if is_async:
                return await function(*args, **kwargs)
            if makes_stream:
                return function(*args, **kwargs)  # the generator: its code runs as it is iterated
            # Let go on cancel (a deadline, a hang-up): the request ends at once, and the
            # thread keeps its place in the pool until the code returns.
            threads = min(limit, MAX_HANDLER_THREADS)
            if kwargs:
                result = await self.threads.run(threads, lambda: function(*args, **kwargs))
            else:
                result = await self.threads.run(threads, function, *args)
            if inspect.isawaitable(result):
                return await result
            return result
        except (SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
            raise HandlerEscaped(f"the handler raised {type(exc).__name__}") from exc

    async def items(self, stream: Iterator[Any] | AsyncIterator[Any]) -> AsyncGenerator[Any, None]:
        """The items of a handler's generator, as it yields them (a sync one's in the pool);
        closed when the caller stops, so that its ``finally`` runs."""
        if isinstance(stream, AsyncIterator):
            try:
                async for item in stream:
                    yield item
            finally:
                # Its own `finally` runs, within a bound: cleanup that hangs ends no less.
                with trio.move_on_after(CLOSE_S, shield=True):
                    await stream.aclose()  # type: ignore[attr-defined]
            return
        done = object()
        try:
            while True:
                item = await self.threads.run(MAX_HANDLER_THREADS, next, stream, done)
                if item is done:
                    return
                yield item
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                with contextlib.suppress(ValueError):  # still running in an abandoned thread
                    close()


def escaped(error: BaseException) -> BaseException | None:
    """What the callers of code that raised `error` get, where several wait on one call (a
    batch, a model's load): an ``Exception`` as it is; ``SystemExit``, ``KeyboardInterrupt``
    and the like as `HandlerEscaped` (an error of theirs, not the end of the replica); None for
    trio's ``Cancelled``, which is the run's to raise."""
    if isinstance(error, trio.Cancelled):
        return None
    if isinstance(error, Exception):
        return error
    wrapped = HandlerEscaped(f"the code raised {type(error).__name__}")
    wrapped.__cause__ = error
    return wrapped


def for_one_caller(error: BaseException) -> BaseException:
    """`error`, for one of several callers to raise: a copy of its own with the original
    traceback. Raising one object in each caller would add every caller's frames to its one
    traceback, so that the n-th caller's log held n tracebacks (quadratic in a batch's size).
    One that cannot be copied is raised as it is."""
    try:
        mine = copy.copy(error)
    except Exception:
        return error
    if type(mine) is not type(error):
        return error
    mine.__cause__, mine.__context__ = error.__cause__, error.__context__
    mine.__suppress_context__ = error.__suppress_context__
    return mine.with_traceback(error.__traceback__)


_MODES: dict[Any, tuple[bool, bool]] = {}


def _mode(function: Any) -> tuple[bool, bool]:
    """Whether `function` is async, and whether it makes a generator (asked once a function:
    a method looked up again is a new bound object, of the same function)."""
    key = getattr(function, "__func__", function)
    mode = _MODES.get(key)
    if mode is None:
        is_async = inspect.iscoroutinefunction(function)
        makes_stream = inspect.isasyncgenfunction(function) or inspect.isgeneratorfunction(function)
        mode = (is_async, makes_stream)
        if len(_MODES) < 4096:
            _MODES[key] = mode
    return mode
