"""RayKVStore: the controller's checkpoints in the Ray cluster's own key-value store (the GCS).

A controller on any host connected to the same cluster reads the same intent, so it can take over
from one that died. The KV store writes one key atomically but not several, so a write of several
keys goes through a journal: the whole batch is put under one key first, then applied, then the
journal is removed. A reader that finds a journal left by a crash applies it again (applying is
idempotent), so a batch lands in full or not at all.

It is a ``LeaseStore`` too. The key layout of a namespace::

    k/<key>          the intent, one KV key per store key (all that read_all returns)
    journal          a plain write's batch while it is applied (or after a crash)
    lease            the lease (Lease.to_json), whose epoch fences the intent
    fenced-journal   a fenced write's batch while it is applied (or after a crash)

The KV store cannot compare and write in one step, so the lease and every fenced write go through
one fencing actor per namespace (``_fence_actor``): a sync actor runs one call at a time, and each
call reads the lease and writes in that one call. A stale leader's write is checked when the
actor runs it, so it is refused if any claim ran before it, even one that arrived while the write
was on its way; its fenced batch, if a crash cut it short, is finished by the actor itself before
any later call. Plain ``write`` (for a controller that leads nobody) goes straight to the KV
store as before; do not mix it with fenced writes on one namespace.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, final

import ray
import ray.exceptions
import trio
from ray.exceptions import RayError
from ray.experimental import internal_kv
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .._model.decisions.lease import Lease
from .._model.values.errors import ConfigError, FencedError, StoreError
from ._await import wait_ref
from ._fence_actor import ACTOR_NAMESPACE, DATA, FENCED_JOURNAL, LEASE, FenceActor, apply

T = TypeVar("T")

_JOURNAL = b"journal"

_Fence = ray.remote(FenceActor)


@final
class RayKVStore:
    """The Store protocol over Ray's GCS key-value store, in its own `namespace`; a LeaseStore.

    Needs a Ray connection (``ray.init``) before first use. Give each controller its own
    namespace; the same namespace is how a new driver finds the intent of one that is gone. The
    first lease call creates the namespace's fencing actor (or finds it): a detached actor of no
    CPU, in the Ray namespace ``controller-fences``, named after this store's namespace.
    """

    def __init__(self, namespace: str = "controller"):
        if not namespace:
            raise ConfigError("namespace", "must be a non-empty string", namespace)
        self.namespace = namespace
        # One write at a time: the journal is a single key.
        self._lock = trio.Lock()
        self._fence: Any = None
        # Fenced writes whose caller was cancelled while the actor still had them: the next
        # read or write of this store waits for them, so that it never sees one halfway.
        self._unsettled: list[ray.ObjectRef[str]] = []

    async def read_all(self) -> dict[str, str]:
        async with self._lock:
            await self._settle()
            data, halfway = await trio.to_thread.run_sync(
                _as_store_error, "reading", self._read_all
            )
            if halfway:
                # A fenced batch a crash cut short: only the actor may finish it (in its own
                # order), then the data are read again.
                await self._ask("reading", "repair")
                data, _ = await trio.to_thread.run_sync(_as_store_error, "reading", self._read_all)
            return data

    async def write(self, changes: Mapping[str, str | None]) -> None:
        if not changes:
            return
        async with self._lock:
            # Not cancellable once begun (a thread runs it), so a batch is never left halfway
            # by this process; a crash halfway leaves the journal for the next reader.
            batch = dict(changes)
            await trio.to_thread.run_sync(_as_store_error, "writing", lambda: self._write(batch))

    # -- the LeaseStore protocol --

    async def read_lease(self) -> Lease | None:
        # One key, put in one step by the actor: read straight from the KV store.
        text = await trio.to_thread.run_sync(
            _as_store_error, "reading the lease of", self._get_lease
        )
        return None if text is None else Lease.from_json(text)

    async def claim_lease(self, seen: Lease | None, new: Lease) -> bool:
        seen_json = None if seen is None else seen.to_json()
        reply = await self._ask("claiming the lease of", "claim", seen_json, new.to_json())
        return reply["claimed"] is True

    async def renew_lease(self, lease: Lease) -> None:
        reply = await self._ask("renewing the lease of", "renew", lease.to_json())
        if "fenced" in reply:
            raise FencedError("renewing the lease", lease.epoch, reply["fenced"])

    async def write_fenced(self, epoch: int, changes: Mapping[str, str | None]) -> None:
        # Even with nothing to write, the actor is asked: a stale leader learns it is stale.
        text = json.dumps(dict(changes))
        async with self._lock:
            await self._settle()
            reply = await self._ask("writing", "write", epoch, text, settle=True)
        if "fenced" in reply:
            raise FencedError("writing intent", epoch, reply["fenced"])

    async def retire(self) -> None:
        """Kill this namespace's fencing actor, if there is one: no daemon uses the store (a
        shutdown no standby took over from). It keeps nothing of its own; a daemon that uses
        the store again makes a new one (one that had it in hand fails one call first)."""
        await trio.to_thread.run_sync(
            _as_store_error, "removing the fencing actor of", self._kill_fence
        )
        self._fence = None

    def _kill_fence(self) -> None:
        self._check()
        try:
            actor = ray.get_actor(self.namespace, namespace=ACTOR_NAMESPACE)
        except ValueError:
            return  # never made, or gone already
        ray.kill(actor, no_restart=True)

    # -- the fencing actor --

    async def _ask(
        self, doing: str, method: str, *args: object, settle: bool = False
    ) -> dict[str, Any]:
        """Call `method` of the fencing actor; its reply, a refusal included (``fenced``).
        Ray's failures are ``StoreError``: the call may or may not have run."""
        if self._fence is None:
            self._fence = await trio.to_thread.run_sync(
                _as_store_error, f"starting the fencing actor of {self.namespace!r}:", self._make
            )
        fence = self._fence
        try:
            # Submitting a call to a known actor does not block (about 0.1 ms).
            ref = getattr(fence, method).remote(*args)
            try:
                text = await wait_ref(ref)
            except trio.Cancelled:
                if settle:
                    self._unsettled.append(ref)
                raise
        except ray.exceptions.ActorDiedError as exc:
            # Gone for good (killed by hand): the next call finds or makes a new one.
            if self._fence is fence:
                self._fence = None
            raise StoreError(f"{doing} Ray's KV store: the fencing actor died: {exc}") from exc
        except ray.exceptions.RayTaskError:
            raise  # a bug of ours in the actor: seen, never retried
        except RayError as exc:  # unavailable for now (restarting, its node lost)
            raise StoreError(f"{doing} Ray's KV store: {type(exc).__name__}: {exc}") from exc
        reply: dict[str, Any] = json.loads(text)
        if not reply["ok"] and "fenced" not in reply:
            raise StoreError(f"{doing} Ray's KV store: {reply.get('error')}")
        return reply

    async def _settle(self) -> None:
        """Wait for the fenced writes a cancelled caller left with the actor (see __init__)."""
        while self._unsettled:
            ref = self._unsettled[0]
            # It failed (the actor died): nothing of it is left halfway but its journal.
            with contextlib.suppress(RayError):
                await wait_ref(ref)
            del self._unsettled[0]

    def _make(self) -> Any:
        self._check()
        options: dict[str, Any] = {
            "name": self.namespace,
            "namespace": ACTOR_NAMESPACE,
            "lifetime": "detached",
            "get_if_exists": True,  # one per namespace, whoever asks first makes it
            "max_restarts": -1,  # it keeps nothing of its own: restarted, it goes on
            "num_cpus": 0,
            # Beside the daemon that makes it (the head, as a rule), not on whichever worker
            # Ray picks: a worker node lost would cost the leader its lease while Ray notices
            # and restarts the actor. Soft: should that node go, Ray places it elsewhere.
            "scheduling_strategy": NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=True
            ),
        }
        return _Fence.options(**options).remote(self.namespace)

    # -- blocking parts, run in a thread --

    def _check(self) -> None:
        if not internal_kv._internal_kv_initialized():  # type: ignore[no-untyped-call]
            raise StoreError("RayKVStore needs a Ray connection: call ray.init() first")

    def _get_lease(self) -> str | None:
        self._check()
        text = internal_kv._internal_kv_get(LEASE, namespace=self.namespace)
        return None if text is None else text.decode()

    def _read_all(self) -> tuple[dict[str, str], bool]:
        """The data, and whether a fenced batch is halfway (the actor must finish it)."""
        self._check()
        journal = internal_kv._internal_kv_get(_JOURNAL, namespace=self.namespace)
        if journal is not None:
            apply(self.namespace, json.loads(journal))
            internal_kv._internal_kv_del(_JOURNAL, namespace=self.namespace)
        halfway = internal_kv._internal_kv_exists(FENCED_JOURNAL, namespace=self.namespace)
        out: dict[str, str] = {}
        for key in internal_kv._internal_kv_list(DATA, namespace=self.namespace):
            value = internal_kv._internal_kv_get(key, namespace=self.namespace)
            if value is not None:  # deleted meanwhile
                out[key[len(DATA) :].decode()] = value.decode()
        return out, bool(halfway)

    def _write(self, changes: dict[str, str | None]) -> None:
        self._check()
        if len(changes) == 1:
            apply(self.namespace, changes)  # one key: atomic as it is
            return
        internal_kv._internal_kv_put(_JOURNAL, json.dumps(changes), namespace=self.namespace)
        apply(self.namespace, changes)
        internal_kv._internal_kv_del(_JOURNAL, namespace=self.namespace)


def _as_store_error(doing: str, fn: Callable[[], T]) -> T:
    # The controller retries a StoreError with backoff; Ray's own errors (a lost connection to the
    # control store, say) are exactly such failures. A bug of ours (a TypeError, a KeyError) is
    # not: retried, it would fail for ever; raised as it is, it is seen.
    try:
        return fn()
    except (RayError, ConnectionError, TimeoutError, OSError) as exc:
        raise StoreError(f"{doing} Ray's KV store: {type(exc).__name__}: {exc}") from exc
