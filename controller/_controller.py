"""The controller: the public face over the backends, and start-up recovery."""

from __future__ import annotations

import collections
import logging
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import final, overload

import trio

from ._backend import Backend, Spec, kill_replica
from ._checkpoint import SpecRecord, dump, parse_all, replicas_key, spec_key
from ._config import BackendConfig, ReplicaConfig, check_backend_name
from ._errors import ConfigError, ControllerClosedError, InfeasibleError, UnknownBackendError
from ._goal import Goal
from ._observe import NullObserver, Observer
from ._placement import count_fitting, total
from ._policy import RestartPolicy
from ._reconcile import resolve_limits
from ._runtime import Runtime
from ._state import BackendSnapshot, BackendStatus, ControllerStatus
from ._store import Store
from ._watch import SnapshotHub

logger = logging.getLogger("controller")


@asynccontextmanager
async def open_controller(
    *,
    runtime: Runtime,
    store: Store,
    restart_policy: RestartPolicy | None = None,
    seed: int | None = None,
    observer: Observer | None = None,
) -> AsyncIterator[Controller]:
    """Open a controller over `runtime` and `store`; close it on exit.

    `restart_policy` sets the backoff after failures (``RestartPolicy()`` by default). `seed`
    fixes the backoff jitter, for reproducible tests (replica tags stay random: they must be
    unique across controller lifetimes). `observer` is told of the loops' work (for metrics).

    Opening recovers: it reads the store, adopts the live replicas its intent names, stops those it
    meant to stop, kills replicas of the runtime that no intent names, and starts what is missing.
    A store it cannot read raises ``CheckpointError`` before anything is touched.

    Closing cancels the controller's tasks and leaves every replica as it is, exactly as a crash
    would: the next controller over the same store picks up where this one stopped.
    """
    try:
        async with trio.open_nursery() as nursery:
            controller = Controller(
                runtime,
                store,
                nursery,
                restart_policy or RestartPolicy(),
                random.Random(seed),
                observer or NullObserver(),
            )
            await nursery.start(runtime.serve, controller._on_death)
            await controller._recover()
            try:
                yield controller
            finally:
                controller._closed = True
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The body's own exception reaches the caller as itself, not wrapped by our nursery.
        if len(group.exceptions) == 1 and not isinstance(group.exceptions[0], BaseExceptionGroup):
            raise group.exceptions[0] from None
        raise


@final
class Controller:
    """Keeps every backend at its desired replicas. Made by ``open_controller``."""

    def __init__(
        self,
        runtime: Runtime,
        store: Store,
        nursery: trio.Nursery,
        restart_policy: RestartPolicy,
        rng: random.Random,
        observer: Observer,
    ):
        self._observer = observer
        self._policy = restart_policy
        self._rng = rng
        self._runtime = runtime
        self._store = store
        self._nursery = nursery
        self._hub = SnapshotHub()
        self._backends: dict[str, Backend] = {}
        # One lock per name, kept for the controller's life: a deploy, a delete and the final
        # forgetting of a deleted backend never overlap for one name.
        self._locks: collections.defaultdict[str, trio.Lock] = collections.defaultdict(trio.Lock)
        self._closed = False

    # -- changing specs --

    async def deploy(
        self, name: str, backend_config: BackendConfig, replica_config: ReplicaConfig
    ) -> Goal:
        """Make backend `name` run `backend_config.num_replicas` replicas built from
        `replica_config`. Returns once the intent is durable, with the goal to await.

        The same spec again returns the same goal and changes nothing. A different spec supersedes
        the pending goal. A scale-up the runtime cannot fit raises ``InfeasibleError`` and changes
        nothing.
        """
        check_backend_name(name)
        if not isinstance(backend_config, BackendConfig):
            raise ConfigError(
                "backend_config", "must be a controller.BackendConfig", backend_config
            )
        if not isinstance(replica_config, ReplicaConfig):
            raise ConfigError(
                "replica_config", "must be a controller.ReplicaConfig", replica_config
            )
        self._check_open()
        async with self._locks[name]:
            backend = self._backends.get(name)
            if backend is not None and backend.matches(backend_config, replica_config):
                return backend.goal
            generation = backend.spec.generation + 1 if backend is not None else 1
            record = SpecRecord(name, generation, backend_config, replica_config)
            spec = Spec.from_record(record)
            await self._check_capacity(name, backend, spec)
            await self._store.write({spec_key(name): dump(record)})
            logger.info(
                "backend %s: deploy generation %d: %d replicas of version %s",
                name,
                generation,
                backend_config.num_replicas,
                spec.version,
            )
            if backend is None:
                backend = self._new_backend(name, spec)
                await self._nursery.start(backend.run)
                return backend.goal
            return backend.set_spec(spec, "deploy")

    async def delete(self, name: str, *, force: bool = False) -> Goal:
        """Drain and stop every replica of `name`, then forget it. Returns once the intent is
        durable, with the goal to await. `force` skips the graceful drain."""
        self._check_open()
        async with self._locks[name]:
            backend = self._backends.get(name)
            if backend is None:
                raise UnknownBackendError(name)
            old = backend.spec
            if old.deleting and (old.force or not force):
                return backend.goal
            record = SpecRecord(
                name,
                old.generation + 1,
                old.backend_config,
                old.replica_config,
                deleting=True,
                force=force,
            )
            await self._store.write({spec_key(name): dump(record)})
            logger.info(
                "backend %s: delete (generation %d%s)",
                name,
                record.generation,
                ", forced" if force else "",
            )
            return backend.set_spec(Spec.from_record(record), "delete")

    def _check_open(self) -> None:
        if self._closed:
            raise ControllerClosedError("the controller is closed; open a new one")

    async def _check_capacity(self, name: str, backend: Backend | None, spec: Spec) -> None:
        config = spec.backend_config
        if not config.resources:
            return
        held_now = len(backend.replicas) if backend is not None else 0
        # A rolling replacement holds up to max_surge replicas above num_replicas at its peak.
        replacing = backend is not None and backend.spec.version != spec.version
        surge, _ = resolve_limits(config.num_replicas, config.max_surge, config.max_unavailable)
        peak = config.num_replicas + surge if replacing else config.num_replicas
        wanted = max(peak, held_now)
        already = backend.reserved() if backend is not None else 0
        if wanted <= already:
            return  # not a scale-up: never refuse what frees or keeps resources
        nodes = await self._runtime.capacity()
        if nodes is None:
            return
        held = [
            (other.spec.backend_config.resources, other.reserved())
            for other in self._backends.values()
            if other.name != name
        ]
        if backend is not None:
            held.append((backend.spec.backend_config.resources, already))
        extra = wanted - already
        fitting = count_fitting(nodes, held, config.resources, extra)
        if fitting < extra:
            # Only the resources asked for: a node's full inventory would bury the answer.
            keys = sorted(config.resources)
            in_use = _only(total([r for r, n in held for _ in range(n)]), keys)
            raise InfeasibleError(
                f"backend {name!r}: cannot place {extra} more replicas needing "
                f"{dict(config.resources)} each; only {fitting} fit. The runtime offers "
                f"{_describe_nodes([_only(node, keys) for node in nodes])}; this controller's "
                f"replicas already hold {in_use}. Lower num_replicas or resources, or add "
                "capacity."
            )

    def _new_backend(self, name: str, spec: Spec) -> Backend:
        backend = Backend(
            name,
            spec,
            runtime=self._runtime,
            store=self._store,
            hub=self._hub,
            lock=self._locks[name],
            on_forgotten=self._forgotten,
            policy=self._policy,
            rng=self._rng,
            observer=self._observer,
        )
        self._backends[name] = backend
        return backend

    def _forgotten(self, backend: Backend) -> None:
        if self._backends.get(backend.name) is backend:
            del self._backends[backend.name]

    def _on_death(self, tag: str, reason: str) -> None:
        backend = self._backends.get(tag.rpartition("#")[0])
        if backend is not None:
            backend.notify_died(tag, reason)

    # -- recovery --

    async def _recover(self) -> None:
        checkpoint = parse_all(await self._store.read_all())
        live = set(await self._runtime.list_replicas())
        named: set[str] = set()
        for name, record in sorted(checkpoint.specs.items()):
            backend = self._new_backend(name, Spec.from_record(record))
            replicas = checkpoint.replicas.get(name)
            backend.restore(replicas, live)
            named.update(backend.replicas)
        stray_records = [name for name in checkpoint.replicas if name not in checkpoint.specs]
        if stray_records:
            # A replica set with no spec cannot come from our write order; drop it, and let the
            # kill of unnamed replicas below stop whatever it listed.
            await self._store.write({replicas_key(name): None for name in stray_records})
        for backend in list(self._backends.values()):
            await self._nursery.start(backend.run)
        orphans = sorted(live - named)
        if orphans:
            logger.warning("killing %d replicas that no intent names", len(orphans))
        for tag in orphans:
            self._nursery.start_soon(kill_replica, self._runtime, tag)
        if self._backends:
            logger.info(
                "recovered %d backends; adopting %d replicas", len(self._backends), len(named)
            )

    # -- reading --

    @overload
    def status(self) -> ControllerStatus: ...
    @overload
    def status(self, name: str) -> BackendStatus: ...
    def status(self, name: str | None = None) -> ControllerStatus | BackendStatus:
        """A frozen view of every backend, or of one (``UnknownBackendError`` if there is none)."""
        if name is not None:
            backend = self._backends.get(name)
            if backend is None:
                raise UnknownBackendError(name)
            return backend.status()
        return ControllerStatus(tuple(self._backends[n].status() for n in sorted(self._backends)))

    def snapshot(self, name: str) -> BackendSnapshot:
        """The latest watch snapshot of `name` (id 0 and no config if it was never deployed)."""
        return self._hub.get(name)

    async def listen_for_change(
        self, snapshot_ids: Mapping[str, int] | None = None, *, all_backends: bool = False
    ) -> dict[str, BackendSnapshot]:
        """Wait until a backend's config or serving replicas change; return the new snapshots.

        `snapshot_ids` maps backend names to the snapshot id the caller holds (0 for none); the
        call returns at once if any snapshot is newer, else waits for one. With `all_backends`
        (or no `snapshot_ids` at all), backends the caller does not list count as held at id 0,
        so a new backend wakes the call too: this is how a router follows every backend.
        """
        if snapshot_ids is None:
            snapshot_ids, all_backends = {}, True
        return await self._hub.listen(snapshot_ids, everything=all_backends)

    async def changes_since(self, snapshot_id: int) -> list[BackendSnapshot]:
        """Wait until some backend's snapshot is newer than `snapshot_id`; return the latest
        snapshot of every backend above it, oldest first (deleted backends as tombstones).

        Snapshot ids of all backends come from one counter, so one number is a complete cursor:
        this is the long poll of a remote watcher (``since`` = the largest id it has seen).
        """
        return await self._hub.listen_since(snapshot_id)

    def watch(self, name: str) -> SnapshotStream:
        """``async for snapshot in ctl.watch(name)``: `name`'s snapshot now and on every change.

        A slow consumer skips straight to the newest snapshot; it never sees an older set after a
        newer one. It holds no resources, so it can be abandoned at any point.
        """
        return SnapshotStream(self._hub, name)


@final
class SnapshotStream:
    """The snapshots of one backend, as an async iterator that never ends on its own."""

    def __init__(self, hub: SnapshotHub, name: str):
        self._hub = hub
        self._name = name
        self._known = 0

    def __aiter__(self) -> SnapshotStream:
        return self

    async def __anext__(self) -> BackendSnapshot:
        snapshot = (await self._hub.listen({self._name: self._known}, everything=False))[self._name]
        self._known = snapshot.snapshot_id
        return snapshot


def _only(resources: Mapping[str, float], keys: Sequence[str]) -> dict[str, float]:
    return {key: resources.get(key, 0.0) for key in keys}


def _describe_nodes(nodes: Sequence[Mapping[str, float]]) -> str:
    if len(nodes) == 1:
        return f"{dict(nodes[0])} in all"
    return f"{len(nodes)} nodes ({', '.join(str(dict(n)) for n in nodes)}; {total(nodes)} in all)"
