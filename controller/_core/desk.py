"""The spec desk: the one writer of what is asked of every backend.

Every spec, revision history, route claim and capacity reservation is written here and nowhere
else, under one lock per name: a deploy, a delete, an undo or an automatic rollback each makes a
``SpecChange`` (the pure functions of ``steering``) and commits it through ``commit``, which
writes the spec with its revisions in one store batch and then hands it to the backend's loop
as an event. Its revision books have one writer, its ``Histories`` (``histories``): a change's
new revisions and the outcomes backends' rollouts report are both marked there.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from typing import Any, Literal, final

import attrs
import trio

from .._backend.goal import Goal
from .._backend.history import log_spec_change
from .._backend.loop import Backend
from .._backend.observe import Observer
from .._backend.shared import Member, Nodes, Shared
from .._backend.turns import take_turns
from .._backend.watch import SnapshotHub
from .._clock import wall_now
from .._model.config.cause import Cause
from .._model.config.config import BackendConfig
from .._model.config.replica_config import ReplicaConfig
from .._model.decisions.policy import RestartPolicy
from .._model.decisions.spec import Spec, delete_record
from .._model.decisions.steering import SpecChange, asked, deploy_change, restored
from .._model.records.checkpoint import dump
from .._model.records.records import RevisionsRecord, spec_key
from .._model.records.revisions import RevisionBook
from .._model.values.code import CodeDigest
from .._model.values.errors import ControllerClosedError, UnknownBackendError
from .._model.values.json_values import JSON
from .._ports.runtime import Runtime
from .._ports.store import Store
from .._sources import code_digest
from .capacity import Reservations
from .histories import Histories
from .locks import Held, NameLocks
from .routes import RouteClaims, route_of

#: A backend's two configs, as a deploy names them.
Configs = tuple[BackendConfig, ReplicaConfig]
#: More writes for a commit's batch, made from the specs it writes (by name).
Also = Callable[[Mapping[str, Spec]], Mapping[str, str | None]]

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
    same_version: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    """The backends whose change of how replicas start (entrypoint, arguments, resources) kept
    the version: their running replicas keep the old, new ones get the new (a mixed fleet)."""


@final
class SpecDesk:
    """What is asked of each backend, its revisions and its goal, and the backends themselves:
    written only by the desk's own methods, each under the name's lock."""

    def __init__(
        self,
        runtime: Runtime,
        store: Store,
        hub: SnapshotHub,
        restart_policy: RestartPolicy,
        rng: random.Random,
        observer: Observer,
        code_path: list[str],
        *,
        on_pass: Callable[[], None],
        roll_back: Callable[[str, int], None],
        on_promoted: Callable[[str], None],
    ):
        self._store = store
        self._code_path = code_path
        self._backends: dict[str, Backend] = {}
        # What was last asked of each backend, and its goal, before its loop has taken it.
        self._requested: dict[str, tuple[Spec, Goal]] = {}
        # Those of them that keep a route, for the route check of each deploy: most backends
        # have none, and a deploy beside 1,000 backends should not look at each.
        self._routed: dict[str, Spec] = {}
        # Each backend's revisions: read by its loop, written by `Histories` only.
        self._histories = Histories(store)
        self._locks = NameLocks(lambda name: name in self._backends)
        self._routes = RouteClaims()
        self._reservations = Reservations(
            runtime, self._backends, self.spec, lambda: self._shared.nodes.cordoned
        )
        # Hand-overs of new specs to their loops not acknowledged yet, released if we close.
        self._handovers: set[trio.Event] = set()
        self._nursery: trio.Nursery | None = None
        self._closed = False
        self._shared = Shared(
            runtime,
            store,
            hub,
            restart_policy,
            rng,
            observer,
            requested=lambda name: self._requested[name][0].generation,
            room=self._reservations.room,
            on_pass=on_pass,
            on_forgotten=self._forgotten,
            roll_back=roll_back,
            report_outcome=self._histories.report,
            on_promoted=on_promoted,
            canary_phase=self._leading_phase,
        )

    # -- reading --

    @property
    def backends(self) -> Mapping[str, Backend]:
        return self._backends

    @property
    def nodes(self) -> Nodes:
        """What the backends read of the nodes (the node desk writes it)."""
        return self._shared.nodes

    @property
    def code_path(self) -> tuple[str, ...]:
        return tuple(self._code_path)

    @property
    def locked_names(self) -> int:
        """How many names have a lock now (for tests: none is left once nothing is asked)."""
        return len(self._locks)

    def spec(self, name: str) -> Spec | None:
        """The spec last asked of `name` (None if there is none)."""
        requested = self._requested.get(name)
        return None if requested is None else requested[0]

    def goal(self, name: str) -> Goal:
        return self._requested[name][1]

    def book(self, name: str) -> RevisionBook:
        return self._histories[name]

    def held(self, name: str) -> tuple[str, JSON] | None:
        """The config the replicas went back to, if the last spec's own change failed in one."""
        backend, old = self._backends.get(name), self.spec(name)
        if backend is not None and old is not None and backend.spec is old:
            return backend.reading.config_gone_back_to
        return None

    def live_revisions(self, name: str) -> set[int | None]:
        """The revisions the backend's replicas run (none of them is trimmed from history)."""
        backend = self._backends.get(name)
        return set() if backend is None else {r.revision for r in backend.replicas.values()}

    def code_of(self, entrypoint: str) -> CodeDigest | None:
        # Read on the loop's thread: only when a deploy makes a revision, or an undo checks
        # one (a few files for most entrypoints; the API lists revisions from a thread).
        return code_digest(entrypoint, self._code_path)

    # -- writing --

    @asynccontextmanager
    async def hold(self, names: Collection[str]) -> AsyncIterator[Held]:
        """Hold the lock of every name of `names` (sorted, so that two holders never deadlock).
        Meanwhile their rollouts' outcomes are held for the change to mark
        (``Histories.holding``)."""
        self.check_open()
        async with self._locks.hold(names) as held:
            with self._histories.holding(names):
                yield held

    def check_open(self) -> None:
        if self._closed:
            raise ControllerClosedError("the controller is closed; open a new one")

    async def change_specs(
        self,
        wanted: Mapping[str, Configs | Callable[[Spec | None], Configs]],
        *,
        prune: bool,
        cause: Cause | None,
        applied: Mapping[str, str] | None = None,
        also: Also | None = None,
    ) -> Applied:
        """Write the specs `wanted` (each given, or made from the spec asked last, read under
        its name's lock) and hand them to their loops. `applied`: for a manifest's apply, the
        fields it set per backend, kept for the next apply's merge (a change of them alone is
        written too). `also`: see ``commit``."""
        texts = applied or {}
        async with self.hold(wanted) as locks:
            declared = {}
            for name, configs in wanted.items():
                declared[name] = configs(self.spec(name)) if callable(configs) else configs
                await take_turns(len(declared))  # each name is ours: its spec stays
            deletes: list[str] = []
            if prune:
                # Locked after the named ones, which is safe: only `apply` locks several names,
                # and one apply runs at a time. A name whose deploy is under way has no backend
                # yet, but its lock: it is waited for, and deleted too once it has one.
                others = sorted(
                    n for n in {*self._backends, *self._locks.names()} if n not in declared
                )
                locks.after_release(functools.partial(self._locks.drop, others))
                for name in others:
                    await locks.take(name)
                deletes = [n for n in others if n in self._backends]
            records: dict[str, SpecChange] = {}
            now = wall_now()
            # One read of each entrypoint's source for the whole change, not one a backend.
            code_of = functools.cache(self.code_of)
            for done, (name, configs) in enumerate(declared.items(), 1):
                await take_turns(done)
                text = texts.get(name)
                if not self._matches(name, *configs) or (
                    text is not None and self._requested[name][0].applied != text
                ):
                    change = deploy_change(
                        name,
                        self.spec(name),
                        self._histories.get(name) or RevisionBook(),
                        configs,
                        cause=cause or Cause(),
                        code_of=code_of,
                        now=now,
                        held=self.held(name),
                        live=self.live_revisions(name),
                    )
                    if text is not None:
                        change = attrs.evolve(
                            change, record=attrs.evolve(change.record, applied=text)
                        )
                    records[name] = change
            for name in deletes:
                if name in self._backends and not self._requested[name][0].deleting:
                    old = self._requested[name][0]
                    records[name] = SpecChange(delete_record(name, old, force=False))
            handovers = await self.commit(records, also)
            result = Applied(
                goals={name: self._requested[name][1] for name in declared},
                changed=frozenset(n for n in records if n in declared),
                deleted={n: self._requested[n][1] for n in records if n not in declared},
                same_version={n: c.same_version for n, c in records.items() if c.same_version},
            )
        await self.handed_over(handovers)
        return result

    async def delete(self, name: str, *, force: bool) -> Goal:
        async with self.hold([name]):
            if name not in self._backends:
                raise UnknownBackendError(name)
            old, goal = self._requested[name]
            if old.deleting and (old.force or not force):
                return goal
            handovers = await self.commit({name: SpecChange(delete_record(name, old, force=force))})
            goal = self._requested[name][1]
        await self.handed_over(handovers)
        return goal

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
            and not self._backends[name].reading.deploy_failed
            and asked(spec, self._histories[name]) == (backend_config, replica_config)
        )

    async def commit(
        self, changes: Mapping[str, SpecChange], also: Also | None = None
    ) -> list[trio.Event]:
        """Write `changes` in one batch (each spec with its revisions, and what `also` makes of
        the new specs: an application's record), after checking that every scale-up among them
        fits, and hand each to its backend's loop (making new backends). The caller holds the
        lock of every name involved. Returns the hand-overs to wait for."""
        if not changes and also is None:
            return []
        specs: dict[str, Spec] = {}
        writes: dict[str, str | None] = {}
        for name, change in changes.items():
            specs[name] = Spec.from_record(change.record)
            writes[spec_key(name)] = dump(change.record)
            await take_turns(len(specs))
        if also is not None:
            writes.update(also(specs))
            if not writes:  # an application's record that would not change, alone
                return []
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
                await self._histories.write(writes, changes)
                for done, (name, spec) in enumerate(specs.items(), 1):
                    # Shielded, not frozen: the names are ours, and other backends go on.
                    await take_turns(done)
                    before = self._requested.get(name)
                    if before is not None and before[0].generation == spec.generation:
                        # A pause or a resume that rolls nothing out: the same goal goes on.
                        goal = before[1]
                        logger.info("backend %s: %s", name, "paused" if spec.paused else "resumed")
                    else:
                        kind: Literal["delete", "deploy"] = "delete" if spec.deleting else "deploy"
                        goal = Goal(name, spec.generation, kind)
                        log_spec_change(name, spec)
                    self._request(name, spec, goal)
                    backend = self._backends.get(name)
                    if backend is None:
                        new.append(self._new_backend(name, spec, goal, self._histories[name]))
                    else:
                        handover = backend.request(spec, goal)
                        self._handovers.add(handover)
                        handovers.append(handover)
                assert self._nursery is not None
                for backend in new:
                    if self._closed:
                        # Closed during the write (a leader that lost its lease): the change
                        # is stored, and the controller that opens the store next goes on.
                        raise ControllerClosedError(
                            "the controller closed while the change was being written (it "
                            "stopped leading, or is shutting down); the change is stored, and "
                            "the next controller to open the store (a new leader) carries it out"
                        )
                    await self._nursery.start(backend.run)
        finally:
            self._reservations.release(reserved)
            self._routes.release(claims)
        return handovers

    async def handed_over(self, handovers: list[trio.Event]) -> None:
        """Wait until each backend's loop has taken its new spec, so that what the caller reads
        next (a status) shows it."""
        for handover in handovers:
            await handover.wait()
            self._handovers.discard(handover)
        self.check_open()

    # -- backends --

    def restored(self, name: str, spec: Spec, kept: RevisionsRecord | None) -> Backend:
        """A backend made from what the store holds (a recovery, or a standby's view)."""
        spec, book = restored(spec, kept, self.code_of, wall_now())
        self._histories.restore(name, book)
        goal = Goal(name, spec.generation, "delete" if spec.deleting else "deploy")
        self._request(name, spec, goal)
        return self._new_backend(name, spec, goal, book)

    def _new_backend(self, name: str, spec: Spec, goal: Goal, book: RevisionBook) -> Backend:
        backend = Backend(name, spec, goal, self._locks[name], self._shared, book)
        self._backends[name] = backend
        return backend

    def _request(self, name: str, spec: Spec, goal: Goal) -> None:
        self._requested[name] = (spec, goal)
        if route_of(spec) is None:
            self._routed.pop(name, None)
        else:
            self._routed[name] = spec

    def _leading_phase(self, name: str) -> str:
        """`name`'s canary phase, for a canary that follows it: "off" unless it leads (it
        follows none itself, so that no ring of followers waits on itself)."""
        backend = self._backends.get(name)
        canary = None if backend is None else backend.spec.backend_config.canary
        if backend is None or canary is None or canary.follows is not None:
            return "off"
        return backend.reading.canary.phase

    def _forgotten(self, backend: Member) -> None:
        """A deleted backend is gone (its loop holds the name's lock)."""
        name = backend.name
        if self._backends.get(name) is backend:
            del self._backends[name]
            del self._requested[name]
            self._routed.pop(name, None)
            self._histories.forget(name)
            # The forgetting loop holds it, and does nothing more under it.
            self._locks.drop([name], held_here=True)
            self._reservations.forget(name)

    # -- lifetime --

    def open(self, nursery: trio.Nursery) -> None:
        """Run new backends (and the desk's own tasks) in `nursery` from now on."""
        self._nursery = nursery

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: object) -> None:
        """Run `fn(*args)` in the desk's nursery, unless it is closed (then nothing)."""
        if self._nursery is not None and not self._closed:
            self._nursery.start_soon(fn, *args)

    def close(self) -> None:
        """Fail every goal and hand-over waited on: nothing will answer them any more."""
        self._closed = True
        for backend in self._backends.values():
            backend.goal.close()
        for _, goal in self._requested.values():
            goal.close()
        for handover in self._handovers:
            handover.set()
