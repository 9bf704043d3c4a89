"""The controller: the public face over the backends.

It checks what users ask (deploy, apply, scale, delete, undo) and hands it to the spec desk
(``desk``), the one writer of specs; what it answers (status, snapshots, watches) it reads from
the backends and the snapshot hub. It never writes a backend's state itself.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator, Mapping
from typing import final, overload

import trio

from .._backend.goal import Goal
from .._backend.loop import Backend
from .._backend.observe import Observer
from .._backend.watch import SnapshotHub, SnapshotStream
from .._model.config.cause import Cause, Via
from .._model.config.config import BackendConfig, check_backend_name
from .._model.config.last_applied import BackendDiff
from .._model.config.manifest import Manifest
from .._model.config.nodes import NodeRow
from .._model.config.replica_config import ReplicaConfig
from .._model.config.scale import scaled
from .._model.decisions.policy import RestartPolicy
from .._model.decisions.spec import Spec, check_declared
from .._model.records.code_report import CodeReport
from .._model.records.records import RevisionsRecord
from .._model.records.revisions import Revision, with_content
from .._model.values.errors import ConfigError, RolloutError, UnknownBackendError
from .._model.views.load_report import MAX_LOAD_COUNT
from .._model.views.status import (
    BackendNumbers,
    BackendSnapshot,
    BackendStatus,
    ControllerStatus,
    LoadReport,
)
from .._ports.runtime import Runtime
from .._ports.store import Store
from .._routing.handle import Handle
from .._serving import handles
from . import manifests, rollouts
from .applications import Applications
from .desk import Applied, SpecDesk
from .nodes import NodeDesk

logger = logging.getLogger("controller")


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
        self._hub = SnapshotHub()
        # Held by `apply`, which locks several names: two applies never wait on each other's
        # names, so they cannot deadlock. Single deploys and deletes lock one name only.
        self._apply_lock = trio.Lock()
        self._changed = trio.Event()
        self._passes = 0
        self._desk = SpecDesk(
            runtime,
            store,
            self._hub,
            restart_policy,
            rng,
            observer,
            code_path,
            on_pass=self._on_pass,
            roll_back=self._roll_back_soon,
            on_promoted=lambda name: self._apps.promoted(name),
        )
        self._backends = self._desk.backends
        self._apps = Applications(self._desk)
        self._nodes = NodeDesk(runtime, store, self._backends, self._desk.nodes)

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
        check_declared(name, backend_config, replica_config)
        if name in self._apps.names():
            raise ConfigError("name", "is an application's name; a backend may not share it", name)
        applied = await self._desk.change_specs(
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
            pending = self._desk.book(name).get(spec.pending) if spec.paused else None
            if pending is not None:
                # While paused, the spec holds the running revision's content: the scale is of
                # the newest change, which stays pending (asking for what runs would drop it).
                return with_content(config, pending.content), pending.content.replica_config
            return config, spec.replica_config

        check_backend_name(name)
        applied = await self._desk.change_specs({name: scaled_spec}, prune=False, cause=cause)
        return applied.goals[name]

    async def apply_manifest(
        self, manifest: Manifest, *, prune: bool = False, cause: Cause | None = None
    ) -> Applied:
        """`apply` the backends `manifest` declares (``controller apply -f``, a daemon's
        ``--config`` at start): all of them, or none. Each merges with what a manifest applied
        to it last, as ``kubectl apply`` does: a field the manifest changed since (or dropped)
        is applied, the others keep their live values, so the same file again changes nothing
        that ``scale`` or ``undo`` did. A backend no manifest applied takes it whole."""
        async with self._apply_lock:
            return await self._apps.apply(manifest, prune=prune, cause=cause)

    async def preview_manifest(
        self, manifest: Manifest, *, prune: bool = False
    ) -> list[BackendDiff]:
        """What ``apply_manifest`` would change now, backend by backend and field by field
        (``apply --dry-run``); nothing is written. ``ConfigError`` as the apply would raise."""
        manifest = manifest.with_application_canaries()
        self._apps.check(manifest, prune)
        return await manifests.preview(self._desk, manifest, prune=prune)

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
            check_declared(name, *configs)
        async with self._apply_lock:
            return await self._apps.apply_backends(backends, prune=prune, cause=cause)

    async def delete(self, name: str, *, force: bool = False) -> Goal:
        """Drain and stop every replica of `name`, then forget it. Returns once the intent is
        durable, with the goal to await. `force` skips the graceful drain, and cuts short the
        drains under way. A member of an application is deleted with it (``applications``)."""
        app = self._apps.owner(name)
        if app is not None:
            raise RolloutError(
                "Member",
                f"backend {name!r} is a member of application {app!r}: delete the application "
                f"(`controller delete {app}`), or apply its manifest without this backend",
            )
        return await self._desk.delete(name, force=force)

    @property
    def applications(self) -> Applications:
        """The applications (backends applied as one, ``[applications.NAME]`` of a manifest):
        their status and revisions, and undo, restart, delete and canary steps of every member
        at once."""
        return self._apps

    # -- steering rollouts (the work is in ``rollouts``) --

    def revisions(self, name: str, *, check_code: bool = True) -> tuple[Revision, ...]:
        """`name`'s revisions, oldest first (``UnknownBackendError`` if there is no such
        backend). With `check_code`, each says whether its entrypoint's source on disk still
        matches (``code_changed``): that reads the source files, on this thread."""
        return rollouts.revisions(self._desk, name, check_code=check_code)

    @property
    def code_path(self) -> tuple[str, ...]:
        """Where replicas' code is looked for, to pin each revision's (see ``open_controller``)."""
        return self._desk.code_path

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
        return await rollouts.undo(self._desk, name, to_revision, force=force, cause=cause)

    async def restart(self, name: str, *, cause: Cause | None = None) -> Goal:
        """Replace every replica of `name` by a rolling update, as ``kubectl rollout restart``
        does: a new revision with the content `name` runs and the code on disk now (how edited
        code is shipped without a new version). An unversioned backend's replicas become
        ``gen-N`` of this generation; a versioned one's ``<version>+restart.N``. Refused
        (``RolloutError``, nothing written) while paused or deleting. Returns the goal."""
        return await rollouts.restart(self._desk, name, cause=cause)

    async def pause(self, name: str) -> Goal:
        """Record `name`'s later deploys as revisions without rolling them out (changes of
        scale and settings still apply). A rollout under way goes on. Returns the goal."""
        return await rollouts.steer(self._desk, name, "pause")

    async def resume(self, name: str) -> Goal:
        """Roll out what was deployed while `name` was paused (its newest revision), if
        anything, and stop pausing. Returns the goal."""
        return await rollouts.steer(self._desk, name, "resume")

    async def promote(self, name: str, *, via: Via = "python") -> Goal:
        """Skip the rest of `name`'s canary steps (``RolloutError`` if none is under way)."""
        return await rollouts.steer_canary(self._desk, name, "promote", via)

    async def abort(self, name: str, *, via: Via = "python") -> Goal:
        """Abort `name`'s canary: weight 0 now, its replicas drain, back to the stable one."""
        return await rollouts.steer_canary(self._desk, name, "abort", via)

    def _roll_back_soon(self, name: str, failed: int) -> None:
        """A backend's rollout of revision `failed` failed, with ``on_failure = "rollback"``."""
        self._desk.start_soon(rollouts.roll_back, self._desk, name, failed)
        self._apps.rolled_back(name, failed)

    # -- nodes --

    async def drain_node(self, node: str, *, deadline_s: float | None = None) -> NodeRow:
        """Move every replica off `node` (an id, a unique prefix, or a unique address), make
        before break within each backend's ``max_unavailable``, and place nothing new there
        until ``uncordon_node``; past `deadline_s`, what is left stops. Returns once durable."""
        return await self._nodes.drain(node, deadline_s)

    async def cordon_node(self, node: str) -> NodeRow:
        """Place nothing new on `node`; what runs there stays."""
        return await self._nodes.cordon(node)

    async def uncordon_node(self, node: str) -> NodeRow:
        """`node` takes new replicas again (a drain under way stops; nothing moves back)."""
        return await self._nodes.uncordon(node)

    async def nodes(self) -> list[NodeRow]:
        """The runtime's nodes, their state and replicas per backend."""
        return await self._nodes.rows()

    # -- backends --

    def _opened(self, nursery: trio.Nursery) -> None:
        """Run backends and rollbacks in `nursery` from now on (``open_controller``'s)."""
        self._desk.open(nursery)
        nursery.start_soon(self._nodes.run)

    def _restored(self, name: str, spec: Spec, kept: RevisionsRecord | None) -> Backend:
        """A backend made from what the store holds (by recovery, or a standby's view)."""
        return self._desk.restored(name, spec, kept)

    def _on_death(self, tag: str, reason: str, *, node: str | None = None) -> None:
        """`tag` died on its own, or went with its lost `node` (not a crash of its own)."""
        backend = self._backends.get(tag.rpartition("#")[0])
        if backend is not None:
            backend.notify_died(tag, reason, node=node)

    def _on_nodes_changed(self) -> None:
        self._nodes.nodes_changed()

    def _on_replica_load(
        self,
        tag: str,
        ongoing: int | None,
        served: int | None = None,
        code: CodeReport | None = None,
    ) -> None:
        backend = self._backends.get(tag.rpartition("#")[0])
        if backend is not None and not backend.forgotten:
            # The runtime passes on what the replica's code said: bounded here, as an
            # ingress's report is (10**400 is a bug in a replica, not a load).
            if ongoing is not None and not 0 <= ongoing <= MAX_LOAD_COUNT:
                ongoing = None
            backend.report_replica_load(tag, ongoing, served, code)

    def _on_pass(self) -> None:
        self._passes += 1
        self._changed.set()
        self._changed = trio.Event()

    def _close(self) -> None:
        """Fail everyone who waits on this controller: it will not answer them any more."""
        self._desk.close()
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
            return backend.reading.status()
        backends = self._backends
        return ControllerStatus(tuple(backends[n].reading.status() for n in sorted(backends)))

    def summary(self, name: str) -> BackendStatus:
        """`name`'s status without its replicas and events (``replicas`` and ``events`` empty,
        ``tally`` set): what a listing of many backends shows, at a cost that does not grow
        with the number of replicas."""
        backend = self._backends.get(name)
        if backend is None:
            raise UnknownBackendError(name)
        return backend.reading.status(summary=True)

    def numbers(self) -> Iterator[BackendNumbers]:
        """Every backend's counts (desired, ready, load), without building their statuses, one
        at a time (of the backends held when called): a caller may let the loop run between."""
        for backend in list(self._backends.values()):
            yield backend.reading.numbers()

    def backend_names(self) -> list[str]:
        """The names of every backend held (deleting ones too), sorted."""
        return sorted(self._backends)

    async def wait_until(self, predicate: Callable[[Controller], bool]) -> None:
        """Wait until `predicate(controller)` holds, checked after every pass of any backend's
        loop (for tests: wait for a controller-side condition without polling)."""
        while not predicate(self):
            self._desk.check_open()
            await self._changed.wait()

    @property
    def passes(self) -> int:
        """Passes its backends' loops have made: a cursor for ``wait_until`` (status may differ)."""
        return self._passes

    def report_load(self, report: LoadReport) -> bool:
        """Take a router's latest load for one backend (``LoadReport``): status and metrics show
        it, summed over every source that reported within ``LOAD_TTL_S``, once the backend's
        loop has taken it (its one writer; at its next turn). Never blocks; returns False if no
        such backend is held (the report is dropped)."""
        self._desk.check_open()
        backend = self._backends.get(report.backend)
        if backend is None or backend.forgotten:
            return False
        backend.report_load(report)
        return True

    def handle(self, name: str) -> Handle:
        """A handle to backend `name` for code beside this controller: ``await
        h.request("GET", "/x")``, ``await h.call("method", ...)``, routed as the ingress
        routes (see ``controller.worker.handle``)."""
        return handles.handle(name)

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
        A slow consumer skips to the newest snapshot, never seeing an older one after a newer;
        it holds no resources, so it can be abandoned at any point."""
        return SnapshotStream(self._hub, name)
