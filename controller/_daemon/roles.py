"""The daemon's roles in turn: stand by (serve the store's view, send changes to the leader) until
the lease is this daemon's, then lead (recover, apply the config once, act) until it is lost."""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from .._api.metrics import Metrics
from .._api.serving import Serving
from .._backend.history import plural
from .._core.controller import Controller
from .._core.open import _only_error, open_controller
from .._leadership.fencing import FencedRuntime, FencedStore
from .._leadership.keeper import Leadership
from .._leadership.standby import store_view
from .._model.config.cause import Cause
from .._model.config.manifest import Manifest
from .._model.decisions.lease import Lease
from .._model.values.errors import (
    CheckpointError,
    ConfigError,
    ControllerError,
    ManifestError,
    StartupError,
    StoreError,
)
from .._model.views.status import ControllerStatus
from .._ports.runtime import Runtime
from .._ports.store import LeaseStore, Store
from .reload import CodeWatch

logger = logging.getLogger("controller.daemon")


STARTUP_ERRORS = (StoreError, CheckpointError, ConfigError, OSError, ImportError)


def leader_status(serving: Serving) -> ControllerStatus:
    # Only the leader exports its backends: a standby's view would count them twice.
    if serving.leading and serving.ctl is not None:
        return serving.ctl.status()
    return ControllerStatus(())


@attrs.define(eq=False)
class Roles:
    """Stand by, lead, stand by again: the daemon's roles in turn, for as long as it runs."""

    manifest: Manifest | None
    config: Path | None
    """Where `manifest` was read from."""
    code_path: list[str]
    """Where the workers import from: revisions pin the code found there."""
    forget_replicas: bool
    store: LeaseStore
    runtime: Runtime
    leadership: Leadership
    serving: Serving
    metrics: Metrics
    reload: bool = False
    """Restart a backend when its code changes on disk (``--reload``, for development)."""
    node_ingresses: Any = None
    """The ingress on each node of a Ray cluster (``controller.ray._node_ingresses``), kept
    while this daemon leads."""
    _applied: bool = False
    _view_of: dict[str, str] | None = None
    _next_view_at: float = 0.0
    _up: bool = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Started once this daemon serves something: as leader, its controller open; as a
        standby, its first view of the store built."""
        status: trio.TaskStatus[None] | None = task_status

        def up() -> None:
            nonlocal status
            if status is not None:
                status.started()
                status = None
                self._up = True

        try:
            # A store that cannot be read fails the start in one line, as a leader's recovery
            # would, rather than a campaign that retries for ever.
            await self.store.read_lease()
            while True:
                self._view_of = None

                async def stand_by() -> None:
                    first = status is not None
                    await self._refresh_view(strict=first)
                    if first and self.manifest is not None:
                        # The store holds what runs, as the leader made it: a file applied at
                        # a later takeover would undo every change made since.
                        self._applied = True
                        logger.warning(
                            "%s not applied: this daemon starts as a standby, and the store "
                            "holds what runs (`controller apply -f` sends it to the leader)",
                            self.config,
                        )
                    up()

                lease = await self.leadership.campaign(on_read=stand_by)
                await self._lead(lease, up)
                # Lost: a moment before claiming again, so that a lease lost over and over (a
                # store put back from a backup, under replicas commanded since) is no busy loop.
                await trio.sleep(self.leadership.timing.renew_s)
        except BaseException as exc:
            found = _only_error(exc) if isinstance(exc, BaseExceptionGroup) else exc
            if status is not None and isinstance(found, STARTUP_ERRORS):
                # Found before recovery touched anything: the start fails in one line.
                raise StartupError(f"{startup_reason(found)}; no replica was touched") from None
            raise

    async def _refresh_view(self, *, strict: bool) -> None:
        """A standby's view, rebuilt when the store changed since the last. `strict` (at the
        start): a store that cannot be read fails the start."""
        try:
            data = await self.store.read_all()
        except StoreError as exc:
            if strict:
                raise
            logger.debug("standby: reading the store: %s", exc)
            return
        if data == self._view_of or (not strict and trio.current_time() < self._next_view_at):
            return
        began = trio.current_time()
        try:
            view = await store_view(data, self.code_path)
        except CheckpointError as exc:
            if strict:
                raise
            logger.error("standby: the store cannot be read (%s); serving the last view", exc)
            return
        self._view_of = data
        self.serving.switch(view, leading=False)
        # While the leader changes thousands of backends, a view that takes seconds to build
        # would be rebuilt without end: a standby spends at most a third of its time on it, and
        # leaves the rest of the machine to the leader.
        self._next_view_at = trio.current_time() + 2 * (trio.current_time() - began)

    async def _lead(self, lease: Lease, up: Callable[[], None]) -> None:
        leadership = self.leadership
        with leadership.leading_scope():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(leadership.keep)
                if not self.forget_replicas:
                    await refuse_a_lost_store(self.store, self.runtime)
                store = FencedStore(self.store, lease.epoch, leadership.fenced)
                runtime = FencedRuntime(self.runtime, lease.epoch, leadership.fenced)
                async with open_controller(
                    runtime=self.metrics.wrap_runtime(runtime),
                    store=self.metrics.wrap_store(store),
                    observer=self.metrics,
                    code_path=self.code_path,
                ) as ctl:
                    self.serving.switch(ctl, leading=True)
                    if self._up:
                        # A takeover (at the start, the line that says the daemon listens
                        # says it leads).
                        logger.info("leading as epoch %d: %s", lease.epoch, leadership.how)
                    try:
                        if self.manifest is not None and not self._applied:
                            # Only by a daemon that leads from its start (as one daemon
                            # always has), once.
                            self._applied = True
                            await apply_at_start(ctl, self.manifest, self.config)
                        up()
                        async with trio.open_nursery() as leading:
                            if self.node_ingresses is not None:
                                leading.start_soon(self.node_ingresses.run, ctl)
                            if self.reload:
                                await CodeWatch(ctl).run()  # returns only once ctl closes
                            await trio.sleep_forever()
                    finally:
                        self.serving.stop_leading()


async def refuse_a_lost_store(store: Store, runtime: Runtime) -> None:
    """An empty store beside live replicas was lost (deleted, emptied, or another one): the
    recovery would take every replica for an orphan and stop it, an outage. Refuse instead."""
    if await store.read_all():
        return
    live = await runtime.list_replicas()
    if live:
        raise StartupError(
            f"the store names no backend, but {plural(len(live), 'replica')} of an earlier "
            "daemon still run: was the store deleted or emptied? Put it back; or, to start "
            "over, `controller run --forget-replicas` stops them; no replica was touched"
        )


def startup_reason(exc: BaseException) -> str:
    if isinstance(exc, ImportError):
        return (
            f"{exc}: the ray runtime and store need Ray "
            "(`pip install 'trio-replica-controller[ray]'`)"
        )
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)


async def apply_at_start(ctl: Controller, manifest: Manifest, source: Path | None) -> None:
    cause = Cause(via="cli")
    if source is not None:
        # The file as read at start (a path past the cause's rules is left out, not refused:
        # the start goes on without it).
        with contextlib.suppress(ConfigError, OSError):
            digest = hashlib.sha256(await trio.Path(source).read_bytes()).hexdigest()
            cause = Cause(via="cli", manifest=str(source), manifest_digest=digest)
    try:
        applied = await ctl.apply_manifest(manifest, cause=cause)
    except ConfigError as exc:
        # Checked alone before the start, the file breaks a rule once merged with the values
        # the store holds (changed since by `scale`, an undo, the API): the start stops, as
        # for a file that is bad alone (exit 2), and the replicas run on as they are.
        raise ManifestError(
            str(source), [f"{exc} (nothing was applied; the replicas run on as they were)"]
        ) from None
    except ControllerError as exc:
        logger.error("applying %s: %s", source, exc)
    else:
        logger.info("applied %s: %s", source, ", ".join(applied.goals))


def role_of(leadership: Leadership) -> str:
    lease = leadership.seen
    if leadership.leading and lease is not None:
        return f"leading as epoch {lease.epoch} ({leadership.how})"
    if lease is None or lease.released:
        return "standing by"
    return f"standing by (epoch {lease.epoch} leads, at {lease.address})"
