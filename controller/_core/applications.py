"""Applications: their records, and what acts on every member at once.

The records are written here and nowhere else, each in the same store batch as the members'
specs it names (``SpecDesk.commit``'s `also`), under one lock for every change of applications
(they are rare, and each reads and writes records of several names). Undo, restart and delete
of an application are one change of all its members: one batch, one new application revision.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import final

import trio

from .._backend.goal import Goal
from .._clock import wall_now
from .._model.config.applications import (
    AppDecl,
    ApplicationRecord,
    ApplicationStatus,
    AppRevision,
    MemberStatus,
    application_key,
)
from .._model.config.cause import Cause, Via
from .._model.config.manifest import Manifest
from .._model.decisions.spec import Spec, delete_record
from .._model.decisions.steering import SpecChange
from .._model.records.checkpoint import dump
from .._model.values.errors import (
    ConfigError,
    ControllerError,
    RolloutError,
    UnknownApplicationError,
)
from . import manifests, rollouts
from .desk import Also, Applied, Configs, SpecDesk

logger = logging.getLogger("controller")


@final
class Applications:
    """Every application's record (written only by these methods), over the spec desk."""

    def __init__(self, desk: SpecDesk):
        self._desk = desk
        self._records: dict[str, ApplicationRecord] = {}
        self._lock = trio.Lock()

    def restore(self, records: Mapping[str, ApplicationRecord]) -> None:
        """What the store held at the controller's start."""
        self._records = dict(records)

    # -- reading --

    def names(self) -> list[str]:
        return sorted(self._records)

    def record(self, name: str) -> ApplicationRecord:
        record = self._records.get(name)
        if record is None:
            raise UnknownApplicationError(name)
        return record

    def owner(self, backend: str) -> str | None:
        """The application `backend` is a member of, if any."""
        for name, record in self._records.items():
            if backend in record.members:
                return name
        return None

    def revisions(self, name: str) -> tuple[AppRevision, ...]:
        """`name`'s revisions, oldest first."""
        return tuple(self.record(name).revisions)

    def status(self, name: str) -> ApplicationStatus:
        record = self.record(name)
        latest = record.latest
        members = []
        for member in record.members:
            recorded = None if latest is None else latest.members.get(member)
            backend, spec = self._desk.backends.get(member), self._desk.spec(member)
            if backend is None or spec is None:
                gone = "no such backend (deleted on its own)"
                members.append(
                    MemberStatus(member, member == record.entry, "MISSING", gone, None, recorded)
                )
                continue
            status = backend.reading.status(summary=True)
            members.append(
                MemberStatus(
                    member,
                    member == record.entry,
                    status.state.value,
                    status.message,
                    _asked(spec),
                    recorded,
                )
            )
        state = next((m.state for m in members if m.state != "HEALTHY"), "HEALTHY")
        number = None if latest is None else latest.number
        return ApplicationStatus(name, record.entry, number, state, tuple(members))

    # -- writing --

    async def apply(self, manifest: Manifest, *, prune: bool, cause: Cause | None) -> Applied:
        """`manifest`'s backends (``manifests.apply``) and its applications, in one batch; with
        `prune`, the applications it does not declare are deleted with their members."""
        manifest = manifest.with_application_canaries()
        async with self._lock:
            self.check(manifest, prune)
            planned: dict[str, ApplicationRecord | None] = {}
            also = self._also(manifest.applications, prune, cause, planned)
            applied = await manifests.apply(
                self._desk, manifest, prune=prune, cause=cause, also=also
            )
            self._adopt(planned)
            return applied

    async def apply_backends(
        self, backends: Mapping[str, Configs], *, prune: bool, cause: Cause | None
    ) -> Applied:
        """``Controller.apply``: backends without applications (`prune` deletes them all)."""
        async with self._lock:
            for name in backends:
                if name in self._records and not prune:
                    raise ConfigError(
                        f"backends[{name!r}]",
                        "is an application's name; a backend may not share it",
                        show_value=False,
                    )
            planned: dict[str, ApplicationRecord | None] = {}
            also = self._also((), prune, cause, planned)
            applied = await self._desk.change_specs(
                dict(backends), prune=prune, cause=cause, also=also
            )
            self._adopt(planned)
            return applied

    async def undo(
        self,
        name: str,
        to_revision: int | None = None,
        *,
        force: bool = False,
        cause: Cause | None = None,
    ) -> dict[str, Goal]:
        """Put every member back as the application's revision `to_revision` recorded it (by
        default the newest before its latest whose content differs from what runs: a restart's
        revision runs the same), in one batch; a new application revision records the undo.
        Refused, with nothing written, as a member's own undo would be (paused, deleting, the
        code changed without `force`, its revision no longer kept)."""
        if to_revision is not None and (
            isinstance(to_revision, bool) or not isinstance(to_revision, int) or to_revision < 1
        ):
            raise ConfigError(
                "to_revision", "must be None or a revision's number (>= 1)", to_revision
            )
        async with self._lock:
            record = self.record(name)
            async with self._desk.hold(record.members):
                target = self._undo_target(record, to_revision)
                changes: dict[str, SpecChange] = {}
                for member in record.members:
                    number = target.members.get(member)
                    if number is None:
                        continue  # joined after that revision: left as it is
                    old, book = rollouts.steerable(self._desk, member, "undo")
                    wanted = rollouts.kept_revision(member, book, number)
                    running = book.get(old.revision)
                    if running is not None and running.digest == wanted.digest:
                        continue
                    if not force:
                        rollouts.refuse_changed_code(self._desk, member, wanted)
                    changes[member] = rollouts.undo_change_for(
                        self._desk, member, old, book, wanted, cause or Cause()
                    )
                goals = await self._commit(record, changes, cause, undone_to=target.number)
            await self._desk.handed_over(goals[1])
            return goals[0]

    async def restart(self, name: str, *, cause: Cause | None = None) -> dict[str, Goal]:
        """Restart every member (each a rolling update of its own), in one batch."""
        async with self._lock:
            record = self.record(name)
            async with self._desk.hold(record.members):
                changes = {}
                for member in record.members:
                    old, book = rollouts.steerable(self._desk, member, "restart")
                    running = book.get(old.revision)
                    if running is None:
                        raise RolloutError(
                            "NoRevision", f"backend {member!r} has no revision to restart yet"
                        )
                    changes[member] = rollouts.restart_change_for(
                        self._desk, member, old, running, book, cause or Cause()
                    )
                goals = await self._commit(record, changes, cause, restart=True)
            await self._desk.handed_over(goals[1])
            return goals[0]

    async def delete(self, name: str, *, force: bool = False) -> dict[str, Goal]:
        """Delete every member and the application's record, in one batch."""
        async with self._lock:
            record = self.record(name)
            async with self._desk.hold(record.members):
                changes = {}
                for member in record.members:
                    old = self._desk.spec(member)
                    if old is not None and (not old.deleting or (force and not old.force)):
                        changes[member] = SpecChange(delete_record(member, old, force=force))
                key = application_key(name)
                handovers = await self._desk.commit(changes, lambda specs: {key: None})
                del self._records[name]
                logger.info("application %s: deleted with its members", name)
                goals = {m: self._desk.goal(m) for m in record.members if self._desk.spec(m)}
            await self._desk.handed_over(handovers)
            return goals

    async def steer_canary(self, name: str, what: str, via: Via) -> dict[str, Goal]:
        """Promote or abort the canary of every member that is in one."""
        record = self.record(name)
        judging = [
            member
            for member in record.members
            if (backend := self._desk.backends.get(member))
            and backend.reading.canary.phase == "judging"
        ]
        goals = {}
        for member in judging:
            backend = self._desk.backends.get(member)
            if backend is not None and backend.reading.canary.phase == "judging":
                goals[member] = await rollouts.steer_canary(self._desk, member, what, via)
            else:  # followed the first member's verdict meanwhile
                goals[member] = self._desk.goal(member)
        if not goals:
            raise RolloutError(
                "NoCanary",
                f"application {name!r} has no member in a canary release, so there is nothing "
                f"to {what}",
            )
        return goals

    def rolled_back(self, backend: str, failed: int) -> None:
        """A member's rollout of revision `failed` failed: if it was a canary, the application's
        other canaries are aborted too (one release, one verdict)."""
        book = self._desk.book(backend) if backend in self._desk.backends else None
        kept = None if book is None else book.get(failed)
        if kept is not None and kept.canary_of is not None:
            self._follow(backend, "abort")

    def promoted(self, backend: str) -> None:
        """A member's canary was promoted (its steps passed, or a person said so): so are the
        application's other canaries, so that no request meets a new entry and an old callee
        for longer than the promotion takes to reach them."""
        self._follow(backend, "promote")

    def _follow(self, backend: str, what: str) -> None:
        name = self.owner(backend)
        if name is None:
            return
        for member in self._records[name].members:
            other = self._desk.backends.get(member)
            if member != backend and other is not None and other.reading.canary.phase == "judging":
                logger.warning(
                    "application %s: %s %s's canary, as %s's was", name, what, member, backend
                )
                done = "promoted" if what == "promote" else "aborted"
                via = f"its application {name}, as the canary of {backend} was {done}"
                self._desk.start_soon(_steer_quietly, self._desk, member, what, via)

    # -- inside --

    def check(self, manifest: Manifest, prune: bool) -> None:
        """Refuse, before anything is written, what would give two things one name or a backend
        two applications."""
        declared = {d.name for d in manifest.applications}
        named = set(manifest.names)
        for decl in manifest.applications:
            spec = self._desk.spec(decl.name)
            if spec is not None and decl.name not in named:
                raise ConfigError(
                    f"applications.{decl.name}",
                    "a backend has this name; an application and a backend may not share one",
                    show_value=False,
                )
        if prune:
            return  # every application the manifest does not declare goes
        members = {m: d.name for d in manifest.applications for m in d.members}
        for name, record in self._records.items():
            if name in declared:
                continue
            if name in named:
                raise ConfigError(
                    f"backends.{name}",
                    "is an application's name; a backend may not share it",
                    show_value=False,
                )
            for member in record.members:
                if member in members:
                    raise ConfigError(
                        f"applications.{members[member]}.backends",
                        f"{member!r} is a member of application {name!r}; a backend belongs "
                        f"to one application (apply {name!r} without it first)",
                        show_value=False,
                    )

    def _also(
        self,
        decls: Sequence[AppDecl],
        prune: bool,
        cause: Cause | None,
        planned: dict[str, ApplicationRecord | None],
    ) -> Also | None:
        if not decls and not (prune and self._records):
            return None

        def also(specs: Mapping[str, Spec]) -> dict[str, str | None]:
            now = wall_now()
            for decl in decls:
                asked = {m: self._asked_now(m, specs) for m in decl.members}
                old = self._records.get(decl.name) or ApplicationRecord(
                    decl.name, decl.entry, [], []
                )
                new = old.with_revision(decl.entry, decl.members, asked, cause or Cause(), now)
                if new is not old:
                    planned[decl.name] = new
            if prune:
                kept = {d.name for d in decls}
                planned.update((n, None) for n in self._records if n not in kept)
            return {application_key(n): None if r is None else dump(r) for n, r in planned.items()}

        return also

    async def _commit(
        self,
        record: ApplicationRecord,
        changes: Mapping[str, SpecChange],
        cause: Cause | None,
        undone_to: int | None = None,
        *,
        restart: bool = False,
    ) -> tuple[dict[str, Goal], list[trio.Event]]:
        planned: dict[str, ApplicationRecord | None] = {}

        def also(specs: Mapping[str, Spec]) -> dict[str, str | None]:
            asked = {m: self._asked_now(m, specs) for m in record.members if self._desk.spec(m)}
            new = record.with_revision(
                record.entry,
                record.members,
                asked,
                cause or Cause(),
                wall_now(),
                undone_to,
                restart=restart,
            )
            if new is record:
                return {}
            planned[record.name] = new
            return {application_key(record.name): dump(new)}

        handovers = await self._desk.commit(changes, also)
        self._adopt(planned)
        return {m: self._desk.goal(m) for m in record.members if self._desk.spec(m)}, handovers

    def _undo_target(self, record: ApplicationRecord, number: int | None) -> AppRevision:
        if number is not None:
            target = record.get(number)
            if target is None:
                kept = ", ".join(str(r.number) for r in record.revisions) or "none"
                raise RolloutError(
                    "UnknownRevision",
                    f"application {record.name!r} keeps no revision {number} (kept: {kept})",
                )
            return target
        for candidate in reversed(record.revisions[:-1]):
            if any(self._differs(m, n) for m, n in candidate.members.items()):
                return candidate
        raise RolloutError(
            "NoGoodRevision",
            f"application {record.name!r} keeps no earlier revision whose content differs from "
            "what its members run; name one with to_revision (see its revisions)",
        )

    def restorable(self, revision: AppRevision) -> bool:
        """Whether every member still keeps the backend revision `revision` names."""
        return all(
            m in self._desk.backends and self._desk.book(m).get(n) is not None
            for m, n in revision.members.items()
        )

    def _differs(self, member: str, number: int) -> bool:
        """Whether `member`'s revision `number` runs other content than the member runs now
        (a revision it no longer keeps counts as other)."""
        spec = self._desk.spec(member)
        if spec is None:
            return False
        book = self._desk.book(member)
        wanted, running = book.get(number), book.get(spec.revision)
        return wanted is None or running is None or wanted.digest != running.digest

    def _adopt(self, planned: Mapping[str, ApplicationRecord | None]) -> None:
        """Records the store now holds."""
        for name, record in planned.items():
            if record is None:
                self._records.pop(name, None)
            else:
                self._records[name] = record
                logger.info(
                    "application %s: revision %d",
                    name,
                    0 if record.latest is None else record.latest.number,
                )

    def _asked_now(self, member: str, specs: Mapping[str, Spec]) -> int:
        spec = specs.get(member) or self._desk.spec(member)
        return 0 if spec is None else _asked(spec) or 0


def _asked(spec: Spec) -> int | None:
    """The revision a spec asks for: while paused, the one its resume rolls out."""
    return spec.pending if spec.pending is not None else spec.revision


async def _steer_quietly(desk: SpecDesk, member: str, what: str, via: str) -> None:
    try:
        await rollouts.steer_canary(desk, member, what, via)
    except ControllerError as exc:  # judged meanwhile, or deleted: nothing left to steer
        logger.info("backend %s: no canary to %s (%s)", member, what, exc)
