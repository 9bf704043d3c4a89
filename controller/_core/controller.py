"""The controller: the public face over the backends.

It writes what users ask (deploy, apply, delete) to the store, under one lock per name, and hands
each new spec to its backend's loop as an event; it never writes a backend's state itself.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Literal, final, overload

import attrs
import trio

from .._backend.goal import Goal
from .._backend.history import plural
from .._backend.loop import Backend, Shared
from .._backend.observe import Observer
from .._backend.replica import Spec, delete_record
from .._backend.watch import SnapshotHub, SnapshotStream
from .._model.checkpoint import dump
from .._model.code import CodeDigest, code_digest
from .._model.config import BackendConfig, ReplicaConfig, check_backend_name
from .._model.errors import (
    ConfigError,
    ControllerClosedError,
    RolloutError,
    UnknownBackendError,
)
from .._model.json_values import JSON
from .._model.load_report import MAX_LOAD_COUNT
from .._model.manifest import Manifest
from .._model.policy import RestartPolicy
from .._model.records import RevisionsRecord, revisions_key, spec_key
from .._model.revisions import Cause, Revision, RevisionBook, merged, with_content
from .._model.scale import scaled
from .._model.status import (
    BackendNumbers,
    BackendSnapshot,
    BackendStatus,
    ControllerStatus,
    LoadReport,
)
from .._ports.runtime import Runtime
from .._ports.store import Store
from . import rollouts as rollouts
from .capacity import Reservations
from .locks import NameLocks
from .routes import RouteClaims, route_of
from .steering import SpecChange, asked, deploy_change, restored

#: A backend's two configs, as a deploy names them.
Configs = tuple[BackendConfig, ReplicaConfig]

logger = logging.getLogger("controller")


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
        code_path: list[str],
    ):
        self._runtime = runtime
        self._code_path = code_path
        # Each backend's revisions, shared with its loop (which notes how rollouts go).
        self._books: dict[str, RevisionBook] = {}
        self._store = store
        self._nursery: trio.Nursery | None = None
        self._hub = SnapshotHub()
        self._backends: dict[str, Backend] = {}
        # What was last asked of each backend, and its goal: written only here, under the name's
        # lock, before the backend's loop has taken it.
        self._requested: dict[str, tuple[Spec, Goal]] = {}
        # Those of them that keep a route, for the route check of each deploy: most backends
        # have none, and a deploy beside 1,000 backends should not look at each.
        self._routed: dict[str, Spec] = {}
        self._locks = NameLocks(lambda name: name in self._backends)
        # Held by `apply`, which locks several names: two applies never wait on each other's
        # names, so they cannot deadlock. Single deploys and deletes lock one name only.
        self._apply_lock = trio.Lock()
        self._routes = RouteClaims()
        self._reservations = Reservations(runtime, self._backends, self._requested_spec)
        # Hand-overs of new specs to their loops not acknowledged yet, released if we close.
        self._handovers: set[trio.Event] = set()
        self._changed = trio.Event()
        self._passes = 0
        self._closed = False
        self._shared = Shared(
            runtime,
            store,
            self._hub,
            restart_policy,
            rng,
            observer,
            requested=lambda name: self._requested[name][0].generation,
            room=self._reservations.room,
            on_pass=self._on_pass,
            on_forgotten=self._forgotten,
            roll_back=self._roll_back_soon,
        )

    # -- changing specs --

    async def deploy(
        self,
        name: str,
        backend_config: BackendConfig,
        replica_config: ReplicaConfig,
        *,
        cause: Cause | None = None,
    ) -> Goal:
        """Make backend `name` run `backend_config.num_replicas` replicas built from
        `replica_config`. Returns once the intent is durable, with the goal to await.

        The same spec again returns the same goal and changes nothing. A different spec supersedes
        the pending goal. A scale-up the runtime cannot fit raises ``InfeasibleError`` and changes
        nothing.

        A deploy that changes what replicas run (their class, arguments, version, user config or
        resources) makes a new revision (see ``revisions``); `cause` says why, for its history.
        """
        _check_declared(name, backend_config, replica_config)
        applied = await self._change_specs(
            {name: (backend_config, replica_config)}, prune=False, cause=cause
        )
        return applied.goals[name]

    async def scale(
        self,
        name: str,
        replicas: int | None = None,
        *,
        min_replicas: int | None = None,
        max_replicas: int | None = None,
        cause: Cause | None = None,
    ) -> Goal:
        """Set how many replicas `name` runs and change nothing else (``kubectl scale``):
        `replicas` for a fixed backend; `min_replicas`, `max_replicas` or both for an autoscaled
        one. The spec is read and written under the name's lock, so that a deploy under way is
        never undone by a scale that read the spec before it. ``ConfigError`` names a count that
        does not fit the backend; ``RolloutError`` (Deleting) if it is being deleted."""

        def scaled_spec(spec: Spec | None) -> tuple[BackendConfig, ReplicaConfig]:
            if spec is None:
                raise UnknownBackendError(name)
            if spec.deleting:
                raise RolloutError("Deleting", f"backend {name!r} is being deleted: no scale")
            config = scaled(
                spec.backend_config, replicas, min_replicas=min_replicas, max_replicas=max_replicas
            )
            pending = self._books[name].get(spec.pending) if spec.paused else None
            if pending is not None:
                # While paused, the spec holds the running revision's content: the scale is of
                # the newest change, which stays pending (asking for what runs would drop it).
                return with_content(config, pending.content), pending.content.replica_config
            return config, spec.replica_config

        check_backend_name(name)
        applied = await self._change_specs({name: scaled_spec}, prune=False, cause=cause)
        return applied.goals[name]

    async def apply_manifest(
        self, manifest: Manifest, *, prune: bool = False, cause: Cause | None = None
    ) -> Applied:
        """`apply` the backends `manifest` declares (``controller apply -f``, a daemon's
        ``--config`` at start): all of them, or none."""
        backends = {d.name: (d.backend_config, d.replica_config) for d in manifest.backends}
        return await self.apply(backends, prune=prune, cause=cause)

    async def apply(
        self,
        backends: Mapping[str, tuple[BackendConfig, ReplicaConfig]],
        *,
        prune: bool = False,
        cause: Cause | None = None,
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
        async with self._apply_lock:
            return await self._change_specs(dict(backends), prune=prune, cause=cause)

    async def delete(self, name: str, *, force: bool = False) -> Goal:
        """Drain and stop every replica of `name`, then forget it. Returns once the intent is
        durable, with the goal to await. `force` skips the graceful drain, and cuts short the
        drains under way."""
        self._check_open()
        async with self._locks.hold([name]):
            if name not in self._backends:
                raise UnknownBackendError(name)
            old, goal = self._requested[name]
            if old.deleting and (old.force or not force):
                return goal
            handovers = await self._commit(
                {name: SpecChange(delete_record(name, old, force=force))}
            )
            goal = self._requested[name][1]
        await self._handed_over(handovers)
        return goal

    # -- steering rollouts (the work is in ``rollouts``) --

    def revisions(self, name: str, *, check_code: bool = True) -> tuple[Revision, ...]:
        """`name`'s revisions, oldest first (``UnknownBackendError`` if there is no such
        backend). With `check_code`, each says whether its entrypoint's source on disk still
        matches (``code_changed``): that reads the source files, on this thread."""
        return rollouts.revisions(self, name, check_code=check_code)

    @property
    def code_path(self) -> tuple[str, ...]:
        """Where replicas' code is looked for, to pin each revision's (see ``open_controller``)."""
        return tuple(self._code_path)

    async def undo(
        self,
        name: str,
        to_revision: int | None = None,
        *,
        force: bool = False,
        cause: Cause | None = None,
    ) -> Goal:
        """Roll `name` back: deploy an earlier revision's content as a new revision, with the
        scale and settings it has now, through the usual rolling update. Plain undo goes back
        to the newest revision that completed with every replica serving (not merely the one
        before); `to_revision` names one. Returns the goal to await.

        Refused (``RolloutError``, nothing written) if the revision is not kept, if none
        completed, while paused or deleting; and (``CodeChangedError``) if the entrypoint's
        source on disk differs from what the revision recorded, unless `force`. Undo to the
        content that runs already changes nothing and returns the current goal.
        """
        return await rollouts.undo(self, name, to_revision, force=force, cause=cause)

    async def pause(self, name: str) -> Goal:
        """Record `name`'s later deploys as revisions without rolling them out (changes of
        scale and settings still apply). A rollout under way goes on. Returns the goal."""
        return await rollouts.steer(self, name, "pause")

    async def resume(self, name: str) -> Goal:
        """Roll out what was deployed while `name` was paused (its newest revision), if
        anything, and stop pausing. Returns the goal."""
        return await rollouts.steer(self, name, "resume")

    def _roll_back_soon(self, name: str, failed: int) -> None:
        """A backend's rollout of revision `failed` failed, with ``on_failure = "rollback"``."""
        if self._nursery is not None and not self._closed:
            self._nursery.start_soon(rollouts.roll_back, self, name, failed)

    def _check_open(self) -> None:
        if self._closed:
            raise ControllerClosedError("the controller is closed; open a new one")

    async def _change_specs(
        self,
        wanted: Mapping[str, Configs | Callable[[Spec | None], Configs]],
        *,
        prune: bool,
        cause: Cause | None,
    ) -> Applied:
        """Write the specs `wanted` (each given, or made from the spec requested last, read
        under its name's lock) and hand them to their loops."""
        self._check_open()
        async with self._locks.hold(wanted) as locks:
            declared = {
                name: configs(self._requested_spec(name)) if callable(configs) else configs
                for name, configs in wanted.items()
            }
            deletes: list[str] = []
            if prune:
                # Locked after the named ones, which is safe: only `apply` locks several names,
                # and one apply runs at a time. A name whose deploy is under way has no backend
                # yet, but its lock: it is waited for, and deleted too once it has one.
                others = sorted(
                    n for n in {*self._backends, *self._locks.names()} if n not in declared
                )
                locks.callback(self._locks.drop, others)  # after they are released
                for name in others:
                    await locks.enter_async_context(self._locks[name])
                deletes = [n for n in others if n in self._backends]
            records: dict[str, SpecChange] = {}
            now = time.time()
            for name, configs in declared.items():
                if not self._matches(name, *configs):
                    records[name] = deploy_change(
                        name,
                        self._requested_spec(name),
                        self._books.get(name) or RevisionBook(),
                        configs,
                        cause=cause or Cause(),
                        code_of=self._code_of,
                        now=now,
                        held=self._held(name),
                        live=self._live_revisions(name),
                    )
            for name in deletes:
                if name in self._backends and not self._requested[name][0].deleting:
                    old = self._requested[name][0]
                    records[name] = SpecChange(delete_record(name, old, force=False))
            handovers = await self._commit(records)
            applied = Applied(
                goals={name: self._requested[name][1] for name in declared},
                changed=frozenset(n for n in records if n in declared),
                deleted={n: self._requested[n][1] for n in records if n not in declared},
            )
        await self._handed_over(handovers)
        return applied

    def _matches(
        self, name: str, backend_config: BackendConfig, replica_config: ReplicaConfig
    ) -> bool:
        """Whether a deploy of these configs would change nothing. It would after a failure: a
        deploy is what lifts DEPLOY_FAILED, even one that came after its goal was reached."""
        if name not in self._requested:
            return False
        spec, goal = self._requested[name]
        return (
            not spec.deleting
            and goal.error is None
            and not self._backends[name].deploy_failed
            and asked(spec, self._books[name]) == (backend_config, replica_config)
        )

    def _held(self, name: str) -> tuple[str, JSON] | None:
        """The config the replicas went back to, if the last spec's own change failed in one."""
        backend, old = self._backends.get(name), self._requested_spec(name)
        if backend is not None and old is not None and backend.spec is old:
            return backend.config_gone_back_to
        return None

    def _live_revisions(self, name: str) -> set[int | None]:
        """The revisions the backend's replicas run (none of them is trimmed from history)."""
        backend = self._backends.get(name)
        return set() if backend is None else {r.revision for r in backend.replicas.values()}

    def _code_of(self, entrypoint: str) -> CodeDigest | None:
        # Read on the loop's thread: only when a deploy makes a revision, or an undo checks
        # one (a few files for most entrypoints; the API lists revisions from a thread).
        return code_digest(entrypoint, self._code_path)

    async def _commit(self, changes: Mapping[str, SpecChange]) -> list[trio.Event]:
        """Write `changes` in one batch (each spec with its revisions), after checking that every
        scale-up among them fits, and hand each to its backend's loop (making new backends).
        The caller holds the lock of every name involved. Returns the hand-overs to wait for."""
        if not changes:
            return []
        specs = {name: Spec.from_record(change.record) for name, change in changes.items()}
        writes: dict[str, str | None] = {spec_key(n): dump(c.record) for n, c in changes.items()}
        claims = self._routes.claim(specs, self._routed.items())
        try:
            reserved = await self._reservations.reserve(specs)
        except BaseException:
            self._routes.release(claims)
            raise
        handovers: list[trio.Event] = []
        new: list[Backend] = []
        try:
            # One step, shielded: a caller cancelled once the write has begun must not leave a
            # spec durable but never handed to its loop (a phantom deploy at the next start).
            with trio.CancelScope(shield=True):
                histories = await self._write_with_histories(writes, changes)
                for name in changes:
                    book = self._books.setdefault(name, RevisionBook())
                    if name in histories:
                        book.revisions = histories[name]
                for name, spec in specs.items():
                    before = self._requested.get(name)
                    if before is not None and before[0].generation == spec.generation:
                        # A pause or a resume that rolls nothing out: the same goal goes on.
                        goal = before[1]
                        logger.info("backend %s: %s", name, "paused" if spec.paused else "resumed")
                    else:
                        kind: Literal["delete", "deploy"] = "delete" if spec.deleting else "deploy"
                        goal = Goal(name, spec.generation, kind)
                        _log_change(name, spec)
                    self._request(name, spec, goal)
                    backend = self._backends.get(name)
                    if backend is None:
                        new.append(self._new_backend(name, spec, goal, self._books[name]))
                    else:
                        handover = backend.request(spec, goal)
                        self._handovers.add(handover)
                        handovers.append(handover)
                assert self._nursery is not None
                for backend in new:
                    await self._nursery.start(backend.run)
        finally:
            self._reservations.release(reserved)
            self._routes.release(claims)
        return handovers

    async def _write_with_histories(
        self, writes: dict[str, str | None], changes: Mapping[str, SpecChange]
    ) -> dict[str, list[Revision]]:
        """Write `writes` with the changes' histories; the histories written. Each was made
        from a copy of its book, and the backend's rollout may mark a revision in the book
        (begun, complete, failed) until its loop takes the new spec, during the write too:
        each history takes the marks made since its copy, and is written again if one came
        during the write."""
        histories = {n: c.revisions for n, c in changes.items() if c.revisions is not None}
        bases = {name: changes[name].base for name in histories}
        due = set(histories)
        while True:
            for name in due:
                now = self._book_now(name)
                histories[name] = merged(histories[name], bases[name], now, changes[name].replaces)
                bases[name] = now
                writes[revisions_key(name)] = dump(RevisionsRecord(name, histories[name]))
            await self._store.write(writes)
            due = {name for name in histories if self._book_now(name) != bases[name]}
            if not due:
                return histories
            writes = {}

    def _book_now(self, name: str) -> tuple[Revision, ...]:
        book = self._books.get(name)
        return () if book is None else tuple(book.revisions)

    async def _handed_over(self, handovers: list[trio.Event]) -> None:
        """Wait until each backend's loop has taken its new spec, so that what the caller reads
        next (a status) shows it."""
        for handover in handovers:
            await handover.wait()
            self._handovers.discard(handover)
        self._check_open()

    def _requested_spec(self, name: str) -> Spec | None:
        requested = self._requested.get(name)
        return None if requested is None else requested[0]

    # -- backends --

    def _new_backend(self, name: str, spec: Spec, goal: Goal, book: RevisionBook) -> Backend:
        backend = Backend(name, spec, goal, self._locks[name], self._shared, book)
        self._backends[name] = backend
        return backend

    def _restored(self, name: str, spec: Spec, kept: RevisionsRecord | None) -> Backend:
        spec, book = restored(spec, kept, self._code_of, time.time())
        self._books[name] = book
        goal = Goal(name, spec.generation, "delete" if spec.deleting else "deploy")
        self._request(name, spec, goal)
        return self._new_backend(name, spec, goal, book)

    def _request(self, name: str, spec: Spec, goal: Goal) -> None:
        self._requested[name] = (spec, goal)
        if route_of(spec) is None:
            self._routed.pop(name, None)
        else:
            self._routed[name] = spec

    def _forgotten(self, backend: Backend) -> None:
        """A deleted backend is gone (its loop holds the name's lock)."""
        name = backend.name
        if self._backends.get(name) is backend:
            del self._backends[name]
            del self._requested[name]
            self._routed.pop(name, None)
            self._books.pop(name, None)
            # The forgetting loop holds it, and does nothing more under it.
            self._locks.drop([name], held_here=True)
            self._reservations.forget(name)

    def _on_death(self, tag: str, reason: str) -> None:
        backend = self._backends.get(tag.rpartition("#")[0])
        if backend is not None:
            backend.notify_died(tag, reason)

    def _on_replica_load(self, tag: str, ongoing: int | None) -> None:
        backend = self._backends.get(tag.rpartition("#")[0])
        if backend is not None and not backend.forgotten:
            # The runtime passes on what the replica's code said: bounded here, as an
            # ingress's report is (10**400 is a bug in a replica, not a load).
            if ongoing is not None and not 0 <= ongoing <= MAX_LOAD_COUNT:
                ongoing = None
            backend.report_replica_load(tag, ongoing)

    def _on_pass(self) -> None:
        self._passes += 1
        self._changed.set()
        self._changed = trio.Event()

    def _close(self) -> None:
        """Fail everyone who waits on this controller: it will not answer them any more."""
        self._closed = True
        for backend in self._backends.values():
            backend.goal.close()
        for _, goal in self._requested.values():
            goal.close()
        for handover in self._handovers:
            handover.set()
        self._hub.close()
        self._changed.set()

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

    def summary(self, name: str) -> BackendStatus:
        """`name`'s status without its replicas and events (``replicas`` and ``events`` empty,
        ``tally`` set): what a listing of many backends shows, at a cost that does not grow
        with the number of replicas."""
        backend = self._backends.get(name)
        if backend is None:
            raise UnknownBackendError(name)
        return backend.status(summary=True)

    def numbers(self) -> list[BackendNumbers]:
        """Every backend's counts (desired, ready, load), without building their statuses."""
        return [backend.numbers() for backend in self._backends.values()]

    def backend_names(self) -> list[str]:
        """The names of every backend held (deleting ones too), sorted."""
        return sorted(self._backends)

    async def wait_until(self, predicate: Callable[[Controller], bool]) -> None:
        """Wait until `predicate(controller)` holds, checked after every pass of any backend's
        loop (for tests: wait for a controller-side condition without polling)."""
        while not predicate(self):
            self._check_open()
            await self._changed.wait()

    @property
    def passes(self) -> int:
        """How many passes its backends' loops have made: anything in `status` may have changed
        when this has grown (a cursor for ``wait_until(lambda c: c.passes > cursor)``)."""
        return self._passes

    def report_load(self, report: LoadReport) -> bool:
        """Take a router's latest load for one backend (``LoadReport``): status and metrics show
        it, summed over every source that reported within ``LOAD_TTL_S``. Never blocks; returns
        False if no such backend is held (the report is dropped)."""
        self._check_open()
        backend = self._backends.get(report.backend)
        if backend is None or backend.forgotten:
            return False
        backend.report_load(report)
        return True

    def snapshot(self, name: str) -> BackendSnapshot:
        """The latest watch snapshot of `name` (no config if it was never deployed, or was
        deleted)."""
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
        this is the long poll of a remote watcher (``since`` = the largest id it has seen). Only
        the newest tombstones are kept: a cursor older than ``watch_floor`` may have missed a
        deletion, so such a watcher should take the full set (``changes_since(0)``) as complete.
        """
        return await self._hub.listen_since(snapshot_id)

    @property
    def watch_cursor(self) -> int:
        """The id of the newest snapshot: a cursor above it was never handed out."""
        return self._hub.last_id

    @property
    def watch_floor(self) -> int:
        """Cursors at or above this have missed no deletion (see ``changes_since``)."""
        return self._hub.floor

    def watch(self, name: str) -> SnapshotStream:
        """``async for snapshot in ctl.watch(name)``: `name`'s snapshot now and on every change.

        A slow consumer skips straight to the newest snapshot; it never sees an older set after a
        newer one. It holds no resources, so it can be abandoned at any point.
        """
        return SnapshotStream(self._hub, name)


def _check_declared(name: str, backend_config: object, replica_config: object) -> None:
    check_backend_name(name)
    if not isinstance(backend_config, BackendConfig):
        raise ConfigError("backend_config", "must be a controller.BackendConfig", backend_config)
    if not isinstance(replica_config, ReplicaConfig):
        raise ConfigError("replica_config", "must be a controller.ReplicaConfig", replica_config)


def _log_change(name: str, spec: Spec) -> None:
    if spec.deleting:
        forced = ", forced" if spec.force else ""
        logger.info("backend %s: delete (generation %d%s)", name, spec.generation, forced)
        return
    logger.info(
        "backend %s: deploy generation %d: %s of version %s",
        name,
        spec.generation,
        plural(spec.backend_config.num_replicas, "replica"),
        spec.version,
    )
