"""A leader's view of its store and runtime: every intent write carries its epoch (the store
refuses a stale one), and a refusal from either makes it stop acting at once.

The store and the replicas are what check the epoch (fencing tokens), not this code: these
wrappers only hand the epoch on and tell the leader when it was refused.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import NoReturn, TypeVar, final

import trio

from .._model.values.errors import FencedError
from .._ports.runtime import CheckReport, Runtime
from .._ports.store import LeaseStore
from .._ports.wrap import RuntimeWrapper, StoreWrapper

T = TypeVar("T")

#: Told of the first refusal (each later one too); it must not block.
OnFenced = Callable[[FencedError], None]


@final
class FencedStore(StoreWrapper):
    """`inner`, written only as the leader of `epoch` (``write_fenced``)."""

    def __init__(self, inner: LeaseStore, epoch: int, on_fenced: OnFenced):
        super().__init__(inner)
        self._lease_store = inner
        self.epoch = epoch
        self._on_fenced = on_fenced

    async def write(self, changes: Mapping[str, str | None]) -> None:
        try:
            await self._lease_store.write_fenced(self.epoch, changes)
        except FencedError as exc:
            await _step_down(self._on_fenced, exc)


@final
class FencedRuntime(RuntimeWrapper):
    """`inner`, fenced at `epoch`: a replica's refusal is passed on to `on_fenced`."""

    def __init__(self, inner: Runtime, epoch: int, on_fenced: OnFenced):
        super().__init__(inner)
        inner.fence(epoch)
        self.epoch = epoch
        self._on_fenced = on_fenced

    async def around(self, op: str, tag: str | None, work: Callable[[], Awaitable[T]]) -> T:
        try:
            return await work()
        except FencedError as exc:
            await _step_down(self._on_fenced, exc)

    async def check_health_replicas(self, tags: Sequence[str], report: CheckReport) -> None:
        def passed_on(results: list[tuple[str, Exception | None]]) -> None:
            # A refused check is not reported, as in ``around``: the leader steps down, and the
            # checks unwind as cancelled.
            kept: list[tuple[str, Exception | None]] = []
            for tag, exc in results:
                if isinstance(exc, FencedError):
                    self._on_fenced(exc)
                else:
                    kept.append((tag, exc))
            if kept:
                report(kept)

        await self.inner_checks(tags, passed_on)


async def _step_down(on_fenced: OnFenced, exc: FencedError) -> NoReturn:
    """Tell the leader, whose scope then cancels: the caller unwinds as cancelled (a controller
    closing, which leaves every replica as it is), not as failed. Where it is shielded (a kill
    under way), it gets the refusal itself."""
    on_fenced(exc)
    await trio.lowlevel.checkpoint_if_cancelled()
    raise exc
