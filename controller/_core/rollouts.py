"""The rollout commands of a controller: its revisions, undo, pause and resume, and the
automatic rollback of a failed rollout.

They change specs the way every deploy does: under the name's lock, through the spec desk's
``commit`` (the spec and its revisions in one store batch), waiting until the backend's loop has
the new spec. What each writes is decided by the pure functions of ``steering``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import attrs
import trio

from .._backend.goal import Goal
from .._clock import wall_now
from .._model.config.cause import Cause
from .._model.decisions.pass_plan import rollback_target
from .._model.decisions.spec import Spec
from .._model.decisions.steering import (
    SpecChange,
    pause_change,
    restart_change,
    resume_change,
    undo_change,
)
from .._model.records.revisions import Revision, RevisionBook
from .._model.values.code import CodeDigest
from .._model.values.errors import (
    CodeChangedError,
    ConfigError,
    ControllerClosedError,
    ControllerError,
    RolloutError,
    UnknownBackendError,
)
from .._sources import code_digest
from .desk import SpecDesk

logger = logging.getLogger("controller")

#: The longest wait between tries of an automatic rollback the store refused.
ROLL_BACK_RETRY_MAX_S = 5.0


def revisions(desk: SpecDesk, name: str, *, check_code: bool) -> tuple[Revision, ...]:
    if name not in desk.backends:
        raise UnknownBackendError(name)
    kept = tuple(desk.book(name).revisions)
    return with_code_checked(kept, desk.code_path) if check_code else kept


def with_code_checked(
    revisions: Sequence[Revision], code_path: Sequence[str]
) -> tuple[Revision, ...]:
    """`revisions` with ``code_changed`` read from the disk now (each entrypoint once). Reads
    files and touches no controller state: it may run in a thread."""
    now: dict[str, CodeDigest | None] = {}
    out = []
    for revision in revisions:
        entrypoint = revision.content.replica_config.entrypoint
        if entrypoint not in now:
            now[entrypoint] = code_digest(entrypoint, code_path)
        out.append(attrs.evolve(revision, code_changed=code_changed(revision, now[entrypoint])))
    return tuple(out)


async def undo(
    desk: SpecDesk, name: str, to_revision: int | None, *, force: bool, cause: Cause | None
) -> Goal:
    if to_revision is not None and (
        isinstance(to_revision, bool) or not isinstance(to_revision, int) or to_revision < 1
    ):
        raise ConfigError("to_revision", "must be None or a revision's number (>= 1)", to_revision)
    async with desk.hold([name]):
        old, book = steerable(desk, name, "undo")
        running = book.get(old.revision)
        if to_revision is None:
            target = book.last_good(unlike=None if running is None else running.digest)
            if target is None:
                raise RolloutError(
                    "NoGoodRevision",
                    f"backend {name!r}: no earlier revision of other content completed with "
                    "every replica serving (a restart keeps the content it restarts); name "
                    "one with to_revision (see its revisions)",
                )
        else:
            target = kept_revision(name, book, to_revision)
        if running is not None and target.digest == running.digest:
            return desk.goal(name)  # what runs already: nothing to do
        if not force:
            refuse_changed_code(desk, name, target)
        change = undo_change_for(desk, name, old, book, target, cause or Cause())
        handovers = await desk.commit({name: change})
        goal = desk.goal(name)
    await desk.handed_over(handovers)
    return goal


async def restart(desk: SpecDesk, name: str, *, cause: Cause | None) -> Goal:
    """Replace every replica of `name` with one of the same content running the code on disk
    now: a new revision, rolled out under the backend's surge and unavailability limits."""
    async with desk.hold([name]):
        old, book = steerable(desk, name, "restart")
        running = book.get(old.revision)
        if running is None:  # only a spec read from a store before revisions, until recovery
            raise RolloutError("NoRevision", f"backend {name!r} has no revision to restart yet")
        change = restart_change_for(desk, name, old, running, book, cause or Cause())
        handovers = await desk.commit({name: change})
        goal = desk.goal(name)
    await desk.handed_over(handovers)
    return goal


async def steer(desk: SpecDesk, name: str, what: str) -> Goal:
    """Pause or resume `name`; either is a no-op if it is so already."""
    async with desk.hold([name]):
        old, book = steerable(desk, name, what)
        change = None
        if what == "pause" and not old.paused:
            change = pause_change(name, old)
        elif what == "resume" and old.paused:
            live = desk.live_revisions(name)
            change = resume_change(name, old, book, held=desk.held(name), live=live)
        handovers = await desk.commit({} if change is None else {name: change})
        goal = desk.goal(name)
    await desk.handed_over(handovers)
    return goal


async def roll_back(desk: SpecDesk, name: str, failed: int) -> None:
    """Undo revision `failed` to the last good one, unless a later change came first. A store
    that fails is tried again (the failure itself is stored, so a restart goes on from it)."""
    delay = 0.1
    while True:
        try:
            async with desk.hold([name]):
                backend, old = desk.backends.get(name), desk.spec(name)
                if backend is None or old is None or old.deleting or old.revision != failed:
                    return  # superseded, deleted or forgotten meanwhile
                book = desk.book(name)
                target = rollback_target(book, failed)
                if isinstance(target, str):
                    return
                kept = book.get(failed)
                why = "its canary was aborted" if kept and kept.canary_of else "on_failure=rollback"
                cause = Cause("controller", f"revision {failed} failed ({why})")
                change = undo_change_for(desk, name, old, book, target, cause, automatic=True)
                handovers = await desk.commit({name: change})
                backend.journal.event(
                    "RollingBack",
                    f"revision {failed} failed; rolling back to revision {target.number} as "
                    f"revision {change.record.revision}",
                )
            await desk.handed_over(handovers)
            return
        except ControllerClosedError:
            return
        except ControllerError as exc:
            if not exc.retryable:
                logger.error("backend %s: no rollback of revision %d: %s", name, failed, exc)
                return
            logger.error("backend %s: rollback not written (%s); retry in %gs", name, exc, delay)
            await trio.sleep(delay)
            delay = min(delay * 2, ROLL_BACK_RETRY_MAX_S)


async def steer_canary(desk: SpecDesk, name: str, what: str, via: str) -> Goal:
    """Promote or abort `name`'s canary release; its loop does it (the canary is its state)."""
    desk.check_open()
    backend = desk.backends.get(name)
    if backend is None or backend.forgotten:
        raise UnknownBackendError(name)
    if backend.reading.canary.phase != "judging":
        raise RolloutError(
            "NoCanary",
            f"backend {name!r} has no canary release being judged, so there is nothing to "
            f"{what} (`controller rollout status {name}` says where its rollout is)",
        )
    await backend.steer_canary(what, via).wait()
    return desk.goal(name)


def code_changed(revision: Revision, now: CodeDigest | None) -> bool | None:
    """Whether the code on disk differs from what `revision` recorded (None: cannot tell)."""
    if revision.code is None:
        return None
    return now is None or now.digest != revision.code.digest


def steerable(desk: SpecDesk, name: str, what: str) -> tuple[Spec, RevisionBook]:
    old = desk.spec(name)
    if old is None:
        raise UnknownBackendError(name)
    if old.deleting:
        raise RolloutError("Deleting", f"backend {name!r} is being deleted: no {what}")
    if what == "undo" and old.paused:
        raise RolloutError(
            "Paused",
            f"backend {name!r} is paused: resume it first, or deploy the revision's config",
        )
    backend = desk.backends.get(name)
    if what == "restart" and backend is not None and backend.reading.canary.phase == "judging":
        raise RolloutError(
            "Canary",
            f"backend {name!r} is in a canary release: promote or abort it first "
            f"(`controller rollout promote {name}` or `controller rollout abort {name}`)",
        )
    if what == "restart" and old.paused:
        # As `kubectl rollout restart` of a paused Deployment: a restart is a rollout.
        raise RolloutError(
            "Paused", f"backend {name!r} is paused: resume it first (`controller rollout resume`)"
        )
    return old, desk.book(name)


def kept_revision(name: str, book: RevisionBook, number: int) -> Revision:
    revision = book.get(number)
    if revision is None:
        kept = ", ".join(str(r.number) for r in book.revisions) or "none"
        raise RolloutError(
            "UnknownRevision", f"backend {name!r} keeps no revision {number} (kept: {kept})"
        )
    return revision


def refuse_changed_code(desk: SpecDesk, name: str, target: Revision) -> None:
    entrypoint = target.content.replica_config.entrypoint
    if code_changed(target, desk.code_of(entrypoint)):
        recorded = target.code
        assert recorded is not None
        raise CodeChangedError(
            f"backend {name!r}: revision {target.number} ran {recorded.module} with source "
            f"digest {recorded.digest[:12]}, and the code on disk is not that any more (an undo "
            "would run today's code under the old revision's config); undo with force "
            "(`controller rollout undo --force`, or force=True) to do it anyway"
        )


def restart_change_for(
    desk: SpecDesk, name: str, old: Spec, running: Revision, book: RevisionBook, cause: Cause
) -> SpecChange:
    return restart_change(
        name,
        old,
        running,
        book,
        cause=cause,
        code_of=desk.code_of,
        now=wall_now(),
        held=desk.held(name),
        live=desk.live_revisions(name),
    )


def undo_change_for(
    desk: SpecDesk,
    name: str,
    old: Spec,
    book: RevisionBook,
    target: Revision,
    cause: Cause,
    *,
    automatic: bool = False,
) -> SpecChange:
    return undo_change(
        name,
        old,
        book,
        target,
        cause=cause,
        code_of=desk.code_of,
        now=wall_now(),
        held=desk.held(name),
        live=desk.live_revisions(name),
        automatic=automatic,
    )
