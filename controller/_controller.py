"""The controller: the public face over the backends, and start-up recovery."""

from __future__ import annotations

import collections
import logging
import random
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import final, overload

import attrs
import trio

from ._backend import Backend, Spec, kill_replica
from ._capacity import demand, extra_replicas, held_by, shortfalls
from ._checkpoint import SpecRecord, dump, events_key, parse_all, replicas_key, spec_key
from ._config import BackendConfig, ReplicaConfig, check_backend_name
from ._errors import ConfigError, ControllerClosedError, InfeasibleError, UnknownBackendError
from ._goal import Goal
from ._history import plural
from ._observe import NullObserver, Observer
from ._placement import Demand
from ._policy import RestartPolicy
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
    A store it cannot read raises ``CheckpointError`` before anything is touched. A stored spec
    that the runtime cannot hold does not stop the opening: that backend is DEPLOY_FAILED
    (reason ``Infeasible``) and starts nothing until a deploy that fits.

    Closing cancels the controller's tasks and leaves every replica as it is, exactly as a crash
    would: the next controller over the same store picks up where this one stopped.
    """
    controller = Controller(
        runtime,
        store,
        restart_policy or RestartPolicy(),
        random.Random(seed),
        observer or NullObserver(),
    )
    try:
        # Lifetimes nest like ownership: the runtime outlives the backends that use it, so the
        # backends' shielded cleanup (a kill begun, a drain) never finds it gone, and a task
        # that had not run yet when the close came cannot mistake a closed runtime for a
        # failed replica and kill it.
        async with trio.open_nursery() as outer:
            await outer.start(runtime.serve, controller._on_death)
            try:
                async with trio.open_nursery() as inner:
                    controller._nursery = inner
                    await controller._recover()
                    try:
                        yield controller
                    finally:
                        controller._closed = True
                        inner.cancel_scope.cancel()
            finally:
                outer.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The body's own exception reaches the caller as itself, not wrapped by our nurseries.
        raise _only_error(group) from None


def _only_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception inside nested groups of one, or the group itself."""
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
        inner = inner.exceptions[0]
    return group if isinstance(inner, BaseExceptionGroup) else inner


@attrs.frozen
class Applied:
    """What ``Controller.apply`` did."""

    goals: Mapping[str, Goal]
    """A goal for each backend of the call, in the order given."""
    changed: frozenset[str]
    """The backends whose spec the call changed (a new generation); the others were unchanged."""
    deleted: Mapping[str, Goal]
    """The backends the call deleted (``prune``), with their goals."""


@final
class Controller:
    """Keeps every backend at its desired replicas. Made by ``open_controller``."""

    def __init__(
        self,
        runtime: Runtime,
        store: Store,
        restart_policy: RestartPolicy,
        rng: random.Random,
        observer: Observer,
    ):
        self._observer = observer
        self._policy = restart_policy
        self._rng = rng
        self._runtime = runtime
        self._store = store
        self._nursery: trio.Nursery | None = None
        self._hub = SnapshotHub()
        self._backends: dict[str, Backend] = {}
        # One lock per name, kept for the controller's life: a deploy, a delete and the final
        # forgetting of a deleted backend never overlap for one name.
        self._locks: collections.defaultdict[str, trio.Lock] = collections.defaultdict(trio.Lock)
        # Held by `apply`, which locks several names: two applies never wait on each other's
        # names, so they cannot deadlock. Single deploys and deletes lock one name only.
        self._apply_lock = trio.Lock()
        # Scale-ups whose spec is being written: counted as held by every capacity check
        # meanwhile, so that two concurrent deploys cannot both take the last room.
        self._pending: dict[str, Demand] = {}
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
        _check_declared(name, backend_config, replica_config)
        self._check_open()
        async with self._locks[name]:
            applied = await self._commit({name: (backend_config, replica_config)}, [])
            return applied.goals[name]

    async def apply(
        self,
        backends: Mapping[str, tuple[BackendConfig, ReplicaConfig]],
        *,
        prune: bool = False,
    ) -> Applied:
        """Deploy every backend of `backends` (name to its two configs) as one change: all of
        them, or, if any cannot be placed beside the others, none (``InfeasibleError``, nothing
        written). With `prune`, the backends not named are deleted in the same change. Every
        spec is written in one store batch; unchanged specs keep their goals."""
        for name, configs in backends.items():
            if not isinstance(configs, tuple) or len(configs) != 2:
                raise ConfigError(
                    f"backends[{name!r}]", "must be a (BackendConfig, ReplicaConfig) pair", configs
                )
            _check_declared(name, *configs)
        self._check_open()
        async with self._apply_lock, AsyncExitStack() as locks:
            for name in sorted(backends):
                await locks.enter_async_context(self._locks[name])
            others: list[str] = []
            if prune:
                others = sorted(n for n in self._backends if n not in backends)
                for name in others:
                    await locks.enter_async_context(self._locks[name])
            return await self._commit(dict(backends), others)

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

    async def _commit(
        self, declared: dict[str, tuple[BackendConfig, ReplicaConfig]], prune: list[str]
    ) -> Applied:
        """Write the specs of `declared` that change something and the deletes of `prune`, in
        one batch, after checking that every scale-up among them fits; then act on them. The
        caller holds the lock of every name involved."""
        records: dict[str, SpecRecord] = {}
        for name, (backend_config, replica_config) in declared.items():
            backend = self._backends.get(name)
            if backend is not None and backend.matches(backend_config, replica_config):
                continue
            generation = backend.spec.generation + 1 if backend is not None else 1
            records[name] = SpecRecord(name, generation, backend_config, replica_config)
        deletes: dict[str, SpecRecord] = {}
        for name in prune:
            backend = self._backends.get(name)
            if backend is None or backend.spec.deleting:
                continue  # forgotten, or being deleted already, while we waited for its lock
            old = backend.spec
            deletes[name] = SpecRecord(
                name, old.generation + 1, old.backend_config, old.replica_config, deleting=True
            )
        specs = {name: Spec.from_record(record) for name, record in records.items()}
        reserved = await self._reserve(specs)
        new: list[Backend] = []
        deleted: dict[str, Goal] = {}
        try:
            if records or deletes:
                await self._store.write(
                    {spec_key(n): dump(r) for n, r in (records | deletes).items()}
                )
            for name, spec in specs.items():
                config = spec.backend_config
                logger.info(
                    "backend %s: deploy generation %d: %s of version %s",
                    name,
                    spec.generation,
                    plural(config.num_replicas, "replica"),
                    spec.version,
                )
                backend = self._backends.get(name)
                if backend is None:
                    new.append(self._new_backend(name, spec))
                else:
                    backend.set_spec(spec, "deploy")
            for name, record in deletes.items():
                logger.info("backend %s: delete (generation %d, pruned)", name, record.generation)
                deleted[name] = self._backends[name].set_spec(Spec.from_record(record), "delete")
        finally:
            # The backends now hold what was reserved for them (or the write failed).
            for name in reserved:
                del self._pending[name]
        assert self._nursery is not None
        for backend in new:
            await self._nursery.start(backend.run)
        return Applied(
            goals={name: self._backends[name].goal for name in declared},
            changed=frozenset(records),
            deleted=deleted,
        )

    async def _reserve(self, specs: Mapping[str, Spec]) -> list[str]:
        """Check that the scale-ups among `specs` fit together beside everything else held or
        being reserved; reserve them (until the caller's write is done). Raises InfeasibleError
        naming every backend that does not fit."""
        if not any(extra_replicas(self._backends.get(n), s) for n, s in specs.items()):
            return []  # nothing grows: never refuse what frees or keeps resources
        nodes = await self._runtime.capacity()
        # From here to the reservation, no checkpoint: what is held cannot change under us.
        wanted = []
        for name, spec in specs.items():
            backend = self._backends.get(name)
            extra = extra_replicas(backend, spec)
            if extra:
                wanted.append(demand(name, backend, spec, extra))
        if nodes is not None:
            held = held_by(self._backends.values()) + list(self._pending.values())
            problem = shortfalls(nodes, held, wanted)
            if problem is not None:
                raise InfeasibleError(problem)
        for want in wanted:
            self._pending[want.name] = want
        return [want.name for want in wanted]

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
        gone: list[str] = []
        for name, record in sorted(checkpoint.specs.items()):
            backend = self._new_backend(name, Spec.from_record(record))
            gone += backend.restore(
                checkpoint.replicas.get(name), live, checkpoint.events.get(name)
            )
            named.update(backend.replicas)
        strays = [
            key(name)
            for records, key in (
                (checkpoint.replicas, replicas_key),
                (checkpoint.events, events_key),
            )
            for name in records
            if name not in checkpoint.specs
        ]
        if strays:
            # Records with no spec cannot come from our write order (but for events written
            # as their backend was forgotten); drop them, and let the kill of unnamed replicas
            # below stop whatever they listed.
            await self._store.write(dict.fromkeys(strays))
        await self._block_what_cannot_fit()
        assert self._nursery is not None
        for backend in list(self._backends.values()):
            await self._nursery.start(backend.run)
        orphans = sorted(live - named)
        if orphans:
            logger.warning("killing %s that no intent names", plural(len(orphans), "replica"))
        # Orphans are killed; replicas that died while no controller ran have their leftovers
        # (a worker's socket and spec files) cleared by the same idempotent kill.
        for tag in orphans + gone:
            self._nursery.start_soon(kill_replica, self._runtime, tag)
        if self._backends:
            logger.info(
                "recovered %s; adopting %s",
                plural(len(self._backends), "backend"),
                plural(len(named), "replica"),
            )

    async def _block_what_cannot_fit(self) -> None:
        """A stored spec may ask for more than the runtime holds (stored before it shrank, or
        by an older controller that did not count slots). Starting it would never converge, and
        a large one would exhaust the machine on every start: such a backend starts nothing new
        until a deploy that fits, and says why."""
        growing = [b for b in self._backends.values() if not b.spec.deleting and _missing(b) > 0]
        if not growing:
            return
        try:
            nodes = await self._runtime.capacity()
        except Exception:
            logger.exception("asking the runtime for its capacity at recovery")
            return
        if nodes is None:
            return
        held = [
            Demand(b.name, b.spec.backend_config.resources, len(b.replicas))
            for b in self._backends.values()
        ]
        for backend in sorted(growing, key=lambda b: b.name):
            want = Demand(backend.name, backend.spec.backend_config.resources, _missing(backend))
            problem = shortfalls(nodes, held, [want])
            if problem is None:
                held.append(want)  # later backends are placed beside this one
            else:
                backend.block_starts(
                    f"the stored spec cannot be placed: {problem} Deploy a spec that fits to "
                    "lift this."
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


def _check_declared(name: str, backend_config: object, replica_config: object) -> None:
    check_backend_name(name)
    if not isinstance(backend_config, BackendConfig):
        raise ConfigError("backend_config", "must be a controller.BackendConfig", backend_config)
    if not isinstance(replica_config, ReplicaConfig):
        raise ConfigError("replica_config", "must be a controller.ReplicaConfig", replica_config)


def _missing(backend: Backend) -> int:
    return max(0, backend.spec.backend_config.num_replicas - len(backend.replicas))
