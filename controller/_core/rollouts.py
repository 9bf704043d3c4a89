"""The rollout commands of a controller: its revisions, undo, pause and resume, and the
automatic rollback of a failed rollout.

Kept apart from ``controller`` for length, they change specs the way every deploy does: under
the name's lock, through the controller's ``_commit`` (the spec and its revisions in one store
batch), waiting until the backend's loop has the new spec. What each writes is decided by the
pure functions of ``steering``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
import trio

from .._backend.goal import Goal
from .._backend.replica import Spec
from .._backend.rollout import rollback_target
from .._model.code import CodeDigest, code_digest
from .._model.errors import (
    CodeChangedError,
    ConfigError,
    ControllerClosedError,
    ControllerError,
    RolloutError,
    UnknownBackendError,
)
from .._model.revisions import Cause, Revision, RevisionBook
from .steering import SpecChange, pause_change, resume_change, undo_change

if TYPE_CHECKING:
    from .controller import Controller

logger = logging.getLogger("controller")

#: The longest wait between tries of an automatic rollback the store refused.
ROLL_BACK_RETRY_MAX_S = 5.0


def revisions(ctl: Controller, name: str, *, check_code: bool) -> tuple[Revision, ...]:
    if name not in ctl._backends:
        raise UnknownBackendError(name)
    kept = tuple(ctl._books[name].revisions)
    return with_code_checked(kept, ctl.code_path) if check_code else kept


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
    ctl: Controller, name: str, to_revision: int | None, *, force: bool, cause: Cause | None
) -> Goal:
    if to_revision is not None and (
        isinstance(to_revision, bool) or not isinstance(to_revision, int) or to_revision < 1
    ):
        raise ConfigError("to_revision", "must be None or a revision's number (>= 1)", to_revision)
    ctl._check_open()
    async with ctl._locks.hold([name]):
        old, book = _steerable(ctl, name, "undo")
        running = book.get(old.revision)
        if to_revision is None:
            target = book.last_good(unlike=None if running is None else running.digest)
            if target is None:
                raise RolloutError(
                    "NoGoodRevision",
                    f"backend {name!r}: no earlier revision completed with every replica "
                    "serving; name one with to_revision (see its revisions)",
                )
        else:
            target = _kept(name, book, to_revision)
        if running is not None and target.digest == running.digest:
            return ctl._requested[name][1]  # what runs already: nothing to do
        if not force:
            _check_code(ctl, name, target)
        change = _undo_change(ctl, name, old, book, target, cause or Cause())
        handovers = await ctl._commit({name: change})
        goal = ctl._requested[name][1]
    await ctl._handed_over(handovers)
    return goal


async def steer(ctl: Controller, name: str, what: str) -> Goal:
    """Pause or resume `name`; either is a no-op if it is so already."""
    ctl._check_open()
    async with ctl._locks.hold([name]):
        old, book = _steerable(ctl, name, what)
        change = None
        if what == "pause" and not old.paused:
            change = pause_change(name, old)
        elif what == "resume" and old.paused:
            live = ctl._live_revisions(name)
            change = resume_change(name, old, book, held=ctl._held(name), live=live)
        handovers = await ctl._commit({} if change is None else {name: change})
        goal = ctl._requested[name][1]
    await ctl._handed_over(handovers)
    return goal


async def roll_back(ctl: Controller, name: str, failed: int) -> None:
    """Undo revision `failed` to the last good one, unless a later change came first. A store
    that fails is tried again (the failure itself is stored, so a restart goes on from it)."""
    delay = 0.1
    while True:
        try:
            async with ctl._locks.hold([name]):
                backend, old = ctl._backends.get(name), ctl._requested_spec(name)
                if backend is None or old is None or old.deleting or old.revision != failed:
                    return  # superseded, deleted or forgotten meanwhile
                book = ctl._books[name]
                target = rollback_target(book, failed)
                if isinstance(target, str):
                    return
                cause = Cause("controller", f"revision {failed} failed (on_failure=rollback)")
                change = _undo_change(ctl, name, old, book, target, cause, automatic=True)
                handovers = await ctl._commit({name: change})
                backend.journal.event(
                    "RollingBack",
                    f"revision {failed} failed; rolling back to revision {target.number} as "
                    f"revision {change.record.revision}",
                )
            await ctl._handed_over(handovers)
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


def code_changed(revision: Revision, now: CodeDigest | None) -> bool | None:
    """Whether the code on disk differs from what `revision` recorded (None: cannot tell)."""
    if revision.code is None:
        return None
    return now is None or now.digest != revision.code.digest


def _steerable(ctl: Controller, name: str, what: str) -> tuple[Spec, RevisionBook]:
    if name not in ctl._backends:
        raise UnknownBackendError(name)
    old = ctl._requested[name][0]
    if old.deleting:
        raise RolloutError("Deleting", f"backend {name!r} is being deleted: no {what}")
    if what == "undo" and old.paused:
        raise RolloutError(
            "Paused",
            f"backend {name!r} is paused: resume it first, or deploy the revision's config",
        )
    return old, ctl._books[name]


def _kept(name: str, book: RevisionBook, number: int) -> Revision:
    revision = book.get(number)
    if revision is None:
        kept = ", ".join(str(r.number) for r in book.revisions) or "none"
        raise RolloutError(
            "UnknownRevision", f"backend {name!r} keeps no revision {number} (kept: {kept})"
        )
    return revision


def _check_code(ctl: Controller, name: str, target: Revision) -> None:
    entrypoint = target.content.replica_config.entrypoint
    if code_changed(target, ctl._code_of(entrypoint)):
        recorded = target.code
        assert recorded is not None
        raise CodeChangedError(
            f"backend {name!r}: revision {target.number} ran {recorded.module} with source "
            f"digest {recorded.digest[:12]}, and the code on disk is not that any more (an undo "
            "would run today's code under the old revision's config); undo with force to do it "
            "anyway"
        )


def _undo_change(
    ctl: Controller,
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
        code_of=ctl._code_of,
        now=time.time(),
        held=ctl._held(name),
        live=ctl._live_revisions(name),
        automatic=automatic,
    )
