"""A Ray replica's own ``load()``, carried to the controller: one call in flight a replica
(``ReplicaHost.load_changed``), answered by the actor when the figure changes, so the runtime
waits on it without polling; the actor reads ``load()`` every 0.1 s, as LocalRuntime's worker
does (``_local.own_load``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

import ray
import trio

from .._model.records.code_report import CodeReport, parse_code_report
from ._await import wait_ref


class _Actor(Protocol):
    tag: str
    handle: Any
    killing: bool


class _Told(Protocol):
    def load(
        self,
        tag: str,
        ongoing: int | None,
        served: int | None = None,
        code: CodeReport | None = None,
    ) -> None: ...


async def follow_load(actor: _Actor, current: Callable[[], bool], told: _Told) -> None:
    """Hand `told` each new figure of `actor`'s ``load()``, while `current()` says the actor is
    still this runtime's, until it dies or says it has no ``load()``."""
    seq = 0
    while current() and not actor.killing:
        call = await trio.to_thread.run_sync(actor.handle.load_changed.remote, seq)
        try:
            reply = json.loads(await wait_ref(call))
        except trio.Cancelled:
            if not actor.killing:  # never cancel a call to an actor being killed (see kills)
                ray.cancel(call)
            raise
        except ray.exceptions.RayError:
            return  # it died: its monitor says so
        if reply.get("none"):
            return
        seq = int(reply["seq"])
        load, served = reply.get("load"), reply.get("served")
        told.load(actor.tag, _count(load), _count(served), parse_code_report(reply))


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
