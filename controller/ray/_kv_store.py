"""RayKVStore: the controller's checkpoints in the Ray cluster's own key-value store (the GCS).

A controller on any host connected to the same cluster reads the same intent, so it can take over
from one that died. The KV store writes one key atomically but not several, so a write of several
keys goes through a journal: the whole batch is put under one key first, then applied, then the
journal is removed. A reader that finds a journal left by a crash applies it again (applying is
idempotent), so a batch lands in full or not at all.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TypeVar, final

import trio
from ray.exceptions import RayError
from ray.experimental import internal_kv

from .._errors import ConfigError, StoreError

T = TypeVar("T")

_DATA = b"k/"
_JOURNAL = b"journal"


@final
class RayKVStore:
    """The Store protocol over Ray's GCS key-value store, in its own `namespace`.

    Needs a Ray connection (``ray.init``) before first use. Give each controller its own
    namespace; the same namespace is how a new driver finds the intent of one that is gone.
    """

    def __init__(self, namespace: str = "controller"):
        if not namespace:
            raise ConfigError("namespace", "must be a non-empty string", namespace)
        self.namespace = namespace
        # One write at a time: the journal is a single key.
        self._lock = trio.Lock()

    async def read_all(self) -> dict[str, str]:
        async with self._lock:
            return await trio.to_thread.run_sync(_as_store_error, "reading", self._read_all)

    async def write(self, changes: Mapping[str, str | None]) -> None:
        if not changes:
            return
        async with self._lock:
            # Not cancellable once begun (a thread runs it), so a batch is never left halfway
            # by this process; a crash halfway leaves the journal for the next reader.
            batch = dict(changes)
            await trio.to_thread.run_sync(_as_store_error, "writing", lambda: self._write(batch))

    # -- blocking parts, run in a thread --

    def _check(self) -> None:
        if not internal_kv._internal_kv_initialized():  # type: ignore[no-untyped-call]
            raise StoreError("RayKVStore needs a Ray connection: call ray.init() first")

    def _read_all(self) -> dict[str, str]:
        self._check()
        journal = internal_kv._internal_kv_get(_JOURNAL, namespace=self.namespace)
        if journal is not None:
            self._apply(json.loads(journal))
            internal_kv._internal_kv_del(_JOURNAL, namespace=self.namespace)
        out: dict[str, str] = {}
        for key in internal_kv._internal_kv_list(_DATA, namespace=self.namespace):
            value = internal_kv._internal_kv_get(key, namespace=self.namespace)
            if value is not None:  # deleted meanwhile
                out[key[len(_DATA) :].decode()] = value.decode()
        return out

    def _write(self, changes: dict[str, str | None]) -> None:
        self._check()
        if len(changes) == 1:
            self._apply(changes)  # one key: atomic as it is
            return
        internal_kv._internal_kv_put(_JOURNAL, json.dumps(changes), namespace=self.namespace)
        self._apply(changes)
        internal_kv._internal_kv_del(_JOURNAL, namespace=self.namespace)

    def _apply(self, changes: Mapping[str, str | None]) -> None:
        for key, value in changes.items():
            raw = _DATA + key.encode()
            if value is None:
                internal_kv._internal_kv_del(raw, namespace=self.namespace)
            else:
                internal_kv._internal_kv_put(raw, value, namespace=self.namespace)


def _as_store_error(doing: str, fn: Callable[[], T]) -> T:
    # The controller retries a StoreError with backoff; Ray's own errors (a lost connection to the
    # control store, say) are exactly such failures. A bug of ours (a TypeError, a KeyError) is
    # not: retried, it would fail for ever; raised as it is, it is seen.
    try:
        return fn()
    except (RayError, ConnectionError, TimeoutError, OSError) as exc:
        raise StoreError(f"{doing} Ray's KV store: {type(exc).__name__}: {exc}") from exc
