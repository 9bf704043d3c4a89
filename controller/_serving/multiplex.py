"""Model multiplexing on a replica: ``@controller.multiplexed`` on an async loader, ``async def
get_model(self, model_id) -> model``. The replica holds at most ``max_models_per_replica``
models, the least recently used going first (its ``unload()`` called, if it has one).

A model is loaded once: requests for it while it loads wait for that load. Each load runs as a
system task, so that a caller that leaves (a hang-up, its deadline) cancels only its own wait,
never a load others wait on. Loads of different models run at once, up to
``max_models_per_replica`` of them (fewer if ``max_concurrent_loads`` says so), each making room
first: the models held and being loaded never number more than the limit.

What a replica holds is its `Shelf`'s, one per replica (its server's): every answer carries it
(``HELD_HEADER``), so routers send a model's requests where it is, and its load reports carry it
to the controller, with the requests each model had."""

from __future__ import annotations

import collections
import contextvars
import functools
import inspect
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, overload

import attrs
import outcome
import trio

from .._model.records.code_report import BatchNumbers, CodeReport
from .._model.records.multiplexing import OTHER_MODELS, ReplicaModels
from .._model.values.errors import ConfigError
from .._ports.context import replica_only
from .._ports.hosting import tracebacks
from .._routing.models import Held, model_id_problem
from .calls import escaped, for_one_caller

#: The most models one replica may be told to hold: every answer names them (33 KB at most).
MAX_MODELS_PER_REPLICA = 256
#: The most loads `max_concurrent_loads` may allow at once.
MAX_CONCURRENT_LOADS = 10_000
#: Per-model request counts kept for reports: past this many models, the rest count as one.
MAX_COUNTED_MODELS = 1_000
#: How long an ``unload()`` may take.
UNLOAD_S = 30.0

Loader = Callable[..., Awaitable[Any]]

#: The request's model (its ``x-model-id``), set by the replica's server around its handler.
current_model: contextvars.ContextVar[str | None] = contextvars.ContextVar("model_id", default=None)


def model_id() -> str | None:
    """The model the request being handled names (its ``x-model-id`` header, or the handle's
    ``options(model_id=...)``); None if it names none. As Ray Serve's
    ``serve.get_multiplexed_model_id()``."""
    return current_model.get()


class Counted(Protocol):
    """What the code keeps besides models (a batcher): its numbers for the load report."""

    def numbers(self) -> BatchNumbers: ...


@attrs.define(eq=False)
class Shelf:
    """What a replica's code keeps across its requests: its models, across its loaders (one,
    as a rule), and what they did; and its batchers (``@controller.batch``), whose numbers go
    with its load."""

    on_change: Callable[[], None] = lambda: None
    """Told of each change of what it holds (the server reports load then)."""
    caches: dict[tuple[int, int], _Cache] = attrs.field(factory=dict)
    generation: int = 0
    requests: dict[str, int] = attrs.field(factory=dict)
    hits: int = 0
    misses: int = 0
    loads: int = 0
    evictions: int = 0
    batchers: list[Counted] = attrs.field(factory=list)
    _header: tuple[int, bytes] | None = None

    @property
    def multiplexed(self) -> bool:
        return bool(self.caches)

    def held(self) -> Held:
        models: set[str] = set()
        loading: set[str] = set()
        capacity = 0
        for cache in self.caches.values():
            models.update(cache.held)
            loading.update(cache.loading)
            capacity += cache.limit
        return Held(
            self.generation, max(capacity, 1), frozenset(models | loading), frozenset(loading)
        )

    def header(self) -> bytes:
        """`held` as its answers say it (made once a generation)."""
        if self._header is None or self._header[0] != self.generation:
            self._header = (self.generation, self.held().header())
        return self._header[1]

    def asked(self, model: str) -> None:
        """A request named `model`."""
        requests = self.requests
        if model in requests or len(requests) < MAX_COUNTED_MODELS:
            requests[model] = requests.get(model, 0) + 1
        else:
            requests[OTHER_MODELS] = requests.get(OTHER_MODELS, 0) + 1

    def report(self) -> CodeReport | None:
        """What its load report says of its code (None: nothing, neither multiplexed nor
        batched)."""
        if not self.caches and not self.batchers:
            return None
        batches = tuple(b.numbers() for b in self.batchers)
        return CodeReport(self._models(), batches)

    def _models(self) -> ReplicaModels | None:
        if not self.caches:
            return None
        held = self.held()
        return ReplicaModels(
            held.generation,
            held.capacity,
            tuple(sorted(held.models)),
            dict(self.requests),
            self.hits,
            self.misses,
            self.loads,
            self.evictions,
        )

    def changed(self) -> None:
        self.generation += 1
        self.on_change()


#: The shelf of the replica whose request (or task) this is; else the process's.
current_shelf: contextvars.ContextVar[Shelf | None] = contextvars.ContextVar(
    "model_shelf", default=None
)
_process_shelf = Shelf()


def process_shelf() -> Shelf:
    """The shelf of a process's one replica (a worker's, a Ray actor's): its server's."""
    return _process_shelf


def replica_shelf() -> Shelf:
    """The shelf of the replica this task serves (its request's; else the process's)."""
    shelf = current_shelf.get()
    return _process_shelf if shelf is None else shelf


@attrs.define(eq=False)
class _Load:
    done: trio.Event = attrs.field(factory=trio.Event)
    result: outcome.Outcome[Any] | None = None


@attrs.define(eq=False)
class _Cache:
    """One loader's models on one replica (of one instance, for a method)."""

    load: Callable[[str], Awaitable[Any]]
    limit: int
    shelf: Shelf
    name: str
    at_once: trio.Semaphore
    """Loads under way at once (its loaders' waiters past it count as loading)."""
    started: int = 0
    held: collections.OrderedDict[str, Any] = attrs.field(factory=collections.OrderedDict)
    """Least recently used first."""
    loading: dict[str, _Load] = attrs.field(factory=dict)

    async def get(self, model: str) -> Any:
        held = self.held
        if model in held:
            held.move_to_end(model)
            self.shelf.hits += 1
            return held[model]
        self.shelf.misses += 1
        pending = self.loading.get(model)
        if pending is None:
            pending = self.loading[model] = _Load()
            self.shelf.changed()
            trio.lowlevel.spawn_system_task(
                self._load, model, pending, name=f"load of {model}", context=replica_only()
            )
        await pending.done.wait()
        assert pending.result is not None
        got = pending.result
        if isinstance(got, outcome.Error):
            raise for_one_caller(got.error)  # to every one of its waiters, each its own
        assert isinstance(got, outcome.Value)
        return got.value

    async def _load(self, model: str, pending: _Load) -> None:
        # At most `limit` loads at once (fewer if asked): with the room made first below, the
        # models held and those being loaded are never more than `limit`.
        async with self.at_once:
            self.started += 1
            try:
                # Room first: a model's memory is given back before the next one's is taken.
                await self._evict(len(self.held) + self.started - self.limit)
                got = await outcome.acapture(self.load, model)
            finally:
                self.started -= 1
        del self.loading[model]
        if isinstance(got, outcome.Value):
            self.held[model] = got.value
            self.shelf.loads += 1
        else:
            assert isinstance(got, outcome.Error)
            error = escaped(got.error)
            if error is None:  # Cancelled: the replica stops, and its waiters with it
                error = RuntimeError(f"the load of {model!r} was cancelled: the replica stops")
            got = outcome.Error(error)
            whole, _ = tracebacks(error)
            sys.stderr.write(f"{self.name}: loading model {model!r} failed:\n{whole}")
        pending.result = got
        self.shelf.changed()
        pending.done.set()
        await self._evict(len(self.held) - self.limit)

    async def _evict(self, count: int) -> None:
        """Unload the `count` least recently used models (the newest stays: it was loaded to
        be used)."""
        while count > 0 and self.held:
            model, value = self.held.popitem(last=False)
            count -= 1
            self.shelf.evictions += 1
            self.shelf.changed()
            await _unload(self.name, model, value)


async def _unload(name: str, model: str, value: Any) -> None:
    """Call the model's ``unload()`` (sync in a thread), if it has one; a failure is logged."""
    try:
        method = getattr(value, "unload", None)
        if not callable(method):
            return
        with trio.move_on_after(UNLOAD_S):
            if inspect.iscoroutinefunction(method):
                await method()
            else:
                result = await trio.to_thread.run_sync(method)
                if inspect.isawaitable(result):
                    await result
    except Exception as exc:
        whole, _ = tracebacks(exc)
        sys.stderr.write(f"{name}: unloading model {model!r} failed:\n{whole}")


@overload
def multiplexed(fn: Loader, /) -> Loader: ...
@overload
def multiplexed(
    *, max_models_per_replica: int = 3, max_concurrent_loads: int | None = None
) -> Callable[[Loader], Loader]: ...
def multiplexed(
    fn: Loader | None = None,
    /,
    *,
    max_models_per_replica: int = 3,
    max_concurrent_loads: int | None = None,
) -> Loader | Callable[[Loader], Loader]:
    """Make an async loader, ``async def get_model(self, model_id)`` (or a function of the id),
    a cache of at most `max_models_per_replica` models per replica: called with a model's id (or
    with none: the request's, ``model_id()``), it returns the model, loaded once. As Ray Serve's
    ``@serve.multiplexed`` (3 models by default); loads of different models run at once, up to
    `max_models_per_replica` of them (`max_concurrent_loads` allows fewer)."""
    limit = _count("max_models_per_replica", max_models_per_replica, MAX_MODELS_PER_REPLICA)
    at_once = (
        None
        if max_concurrent_loads is None
        else _count("max_concurrent_loads", max_concurrent_loads, MAX_CONCURRENT_LOADS)
    )

    def decorate(fn: Loader) -> Loader:
        if not inspect.iscoroutinefunction(fn):
            raise ConfigError(
                "multiplexed", "decorates an async def taking a model's id", fn.__qualname__
            )
        params = list(inspect.signature(fn).parameters)
        if len(params) not in (1, 2):
            raise ConfigError(
                "multiplexed",
                "decorates `async def load(model_id)` or a method `async def load(self, model_id)`",
                fn.__qualname__,
            )
        method = len(params) == 2

        @functools.wraps(fn)
        async def get(*args: Any) -> Any:
            owner = args[0] if method else None
            given = args[1:] if method else args
            if len(given) > 1:
                raise TypeError(f"{fn.__qualname__} takes one model id (or none: the request's)")
            model = given[0] if given else current_model.get()
            if model is None:
                raise ValueError(
                    f"{fn.__qualname__}: no model id: the request names none (its x-model-id "
                    "header, or a handle's options(model_id=...)) and none was given"
                )
            problem = model_id_problem(model)
            if problem is not None:
                raise ValueError(f"{fn.__qualname__}: model_id {problem}")
            shelf = replica_shelf()
            key = (id(fn), id(owner))
            cache = shelf.caches.get(key)
            if cache is None:
                # It holds its owner (an instance): the id is not reused while the cache lives.
                load = fn if owner is None else functools.partial(fn, owner)
                loads = limit if at_once is None else min(at_once, limit)
                cache = _Cache(load, limit, shelf, fn.__qualname__, trio.Semaphore(loads))
                shelf.caches[key] = cache
            return await cache.get(model)

        return get

    return decorate if fn is None else decorate(fn)


def _count(field: str, value: object, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise ConfigError(field, f"must be a whole number from 1 to {most}", value)
    return value
