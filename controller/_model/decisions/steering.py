"""What each change of a backend's spec writes: the spec record, and its revisions when they
change. Pure functions of the spec before, the revisions kept and the request; the controller
checks and commits (one store batch for both keys).

- A deploy whose replicas would run something new makes a revision (while paused, one that is
  only recorded: the pending one); a deploy of the same content changes the spec only.
- An undo deploys an earlier revision's content as a new revision (numbers only grow), with
  the scale and settings of now.
- A pause and a resume change the spec only; a resume rolls out the pending revision.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs

from ..config.cause import Cause
from ..config.config import BackendConfig
from ..config.replica_config import ReplicaConfig
from ..records.records import RevisionsRecord, SpecRecord
from ..records.revisions import (
    Revision,
    RevisionBook,
    RevisionContent,
    RevisionOutcome,
    canary_base,
    content_of,
    make_revision,
    replica_version,
    started_differently,
    superseded,
    trim,
    with_content,
)
from ..values.code import CodeDigest
from ..values.json_values import JSON, digest
from .spec import Spec, deploy_record, same_replicas


@attrs.frozen
class SpecChange:
    """One backend's spec record to write, and its revisions, if they change."""

    record: SpecRecord
    revisions: list[Revision] | None = None
    """The history to write, made from the book when the change was made: the outcomes the
    backend's rollout reports meanwhile are held by the desk and marked in it before it is
    written (``with_outcomes``)."""
    replaces: tuple[int | None, ...] = ()
    """The revisions the change supersedes (if their rollout is under way when it lands)."""

    @property
    def same_version(self) -> tuple[str, ...]:
        """What the revision it makes changes of how replicas start under the running one's
        version (``Revision.same_version``); none if it makes none."""
        made = self.revisions[-1] if self.revisions else None
        if made is None or made.number != self.record.revision:
            return ()
        return made.same_version


#: How the controller reads the code of an entrypoint now (None: not found).
CodeOf = Callable[[str], CodeDigest | None]


def asked(old: Spec, book: RevisionBook) -> tuple[BackendConfig, ReplicaConfig]:
    """The configs last asked of a backend: its spec's, but for the replicas of the revision
    recorded while paused, if there is one."""
    pending = book.get(old.pending)
    if pending is None:
        return old.backend_config, old.replica_config
    content = pending.content
    return with_content(old.backend_config, content), content.replica_config


def deploy_change(
    name: str,
    old: Spec | None,
    book: RevisionBook,
    configs: tuple[BackendConfig, ReplicaConfig],
    *,
    cause: Cause,
    code_of: CodeOf,
    now: float,
    held: tuple[str, JSON] | None,
    live: Iterable[int | None],
) -> SpecChange:
    """A deploy of `configs` over `old` (None: a new backend)."""
    backend_config, replica_config = configs
    content = content_of(backend_config, replica_config)
    revisions = list(book.revisions)
    generation = 1 if old is None else old.generation + 1
    running = None if old is None or old.deleting else book.get(old.revision)

    def new(
        outcome: RevisionOutcome,
        code_generation: int,
        restarted: int | None,
        canary: tuple[int | None, str | None] = (None, None),
    ) -> Revision:
        return make_revision(
            book.next_number,
            content,
            now=now,
            cause=cause,
            code=code_of(replica_config.entrypoint),
            code_generation=code_generation,
            outcome=outcome,
            restarted=restarted,
            canary=canary,
        )

    if old is not None and running is not None and old.paused:
        # Recorded, not rolled out: the replicas keep the running revision's content; the
        # scale and settings of the deploy apply at once, as in Kubernetes.
        pending = old.pending
        kept = book.get(pending)
        if content.digest == running.digest:
            pending = None  # back to what runs: nothing left to roll out
        elif kept is None or kept.digest != content.digest:
            # Its replicas, once resumed, are this generation's code (`gen-N`).
            # Replicas its content leaves as they are keep their restart, as at a resume.
            restarted = (
                old.restarted if same_replicas(old, backend_config, replica_config) else None
            )
            revisions.append(new("pending", generation, restarted))
            pending = revisions[-1].number
        if pending != old.pending:
            revisions = superseded(revisions, [old.pending])
        record = deploy_record(
            name,
            old,
            with_content(backend_config, running.content),
            running.content.replica_config,
            held=held,
            revision=old.revision,
            paused=True,
            pending=pending,
        )
        replaced = (old.pending,) if pending != old.pending else ()
        return _change(record, revisions, backend_config, live, book, replaced)
    if old is not None and running is not None and running.digest == content.digest:
        # The same replicas: a change of scale or settings, no revision.
        record = deploy_record(
            name, old, backend_config, replica_config, held=held, revision=old.revision
        )
        # A smaller history limit takes effect at once; otherwise the history is not written.
        trimmed = _change(record, revisions, backend_config, live, book)
        return trimmed if trimmed.revisions != revisions else SpecChange(record)
    live = tuple(live)
    record = deploy_record(
        name,
        old,
        backend_config,
        replica_config,
        held=held,
        live_held=_held_by_live(book, live, content),
        revision=book.next_number,
    )
    generation = _code_generation(record)
    version = replica_version(backend_config.version, generation, record.restarted)
    canary = canary_base(book, running, version, backend_config.canary is not None)
    revision = new("in_progress", generation, record.restarted, canary)
    if running is not None:
        revision = attrs.evolve(
            revision, same_version=started_differently(running.content, content)
        )
    replaced = () if old is None else (old.revision,)
    revisions = [*superseded(revisions, replaced), revision]
    return _change(record, revisions, backend_config, live, book, replaced)


def _held_by_live(
    book: RevisionBook, live: Iterable[int | None], content: RevisionContent
) -> tuple[str, JSON] | None:
    """The user config that live replicas of `content`'s version hold, if they would take
    `content`'s in place (started the same way, another user config): the newest such
    revision's. The spec before may be of another version, one whose rollout failed before a
    replica of it ran: the change is in place all the same, and a refusal halts it."""
    if content.version is None:
        return None  # an unversioned config's replicas get a new version at each deploy
    wanted = digest(content.user_config)
    for number in sorted((n for n in live if n is not None), reverse=True):
        revision = book.get(number)
        if revision is None:
            continue
        ran, held = revision.content, digest(revision.content.user_config)
        same = ran.version == content.version and not started_differently(ran, content)
        if same and held != wanted:
            return held, ran.user_config
    return None


def undo_change(
    name: str,
    old: Spec,
    book: RevisionBook,
    target: Revision,
    *,
    cause: Cause,
    code_of: CodeOf,
    now: float,
    held: tuple[str, JSON] | None,
    live: Iterable[int | None],
    automatic: bool = False,
) -> SpecChange:
    """Back to `target`'s content as a new revision, with the scale and settings of now."""
    content = target.content
    # Only an automatic rollback comes while paused (a person's undo is refused then): the
    # pause, and what it holds pending, stay.
    record = _running(
        name, old, target, book.next_number, held, paused=old.paused, pending=old.pending
    )
    revision = _made_for(record, content, book, cause, code_of, now)
    revision = attrs.evolve(revision, restores=target.number, automatic=automatic)
    return _replacing_running(old, book, record, revision, live)


def restart_change(
    name: str,
    old: Spec,
    running: Revision,
    book: RevisionBook,
    *,
    cause: Cause,
    code_of: CodeOf,
    now: float,
    held: tuple[str, JSON] | None,
    live: Iterable[int | None],
) -> SpecChange:
    """`running`'s content again as a new revision, pinned to the code on disk now, with
    replicas of a new version (``gen-N`` of this generation, or ``<version>+restart.N``), so
    that the rolling update replaces every one, as ``kubectl rollout restart`` does."""
    content = running.content
    generation = old.generation + 1
    # The running revision as this generation's: its code, and a restart a version carries.
    restarted = None if content.version is None else generation
    again = attrs.evolve(running, code_generation=generation, restarted=restarted)
    record = _running(name, old, again, book.next_number, held)
    revision = _made_for(record, content, book, cause, code_of, now)
    # Edited code is a release like any other: a backend with a canary block tries it so.
    wanted = record.backend_config.canary is not None
    canary_of, skipped = canary_base(book, running, revision.version, wanted)
    revision = attrs.evolve(
        revision, restarts=running.number, canary_of=canary_of, canary_skipped=skipped
    )
    return _replacing_running(old, book, record, revision, live)


def pause_change(name: str, old: Spec) -> SpecChange:
    """Paused: the same generation (what is asked of the replicas does not change, so the goal
    of a rollout under way goes on)."""
    return SpecChange(attrs.evolve(old.to_record(name), paused=True))


def resume_change(
    name: str,
    old: Spec,
    book: RevisionBook,
    *,
    held: tuple[str, JSON] | None,
    live: Iterable[int | None],
) -> SpecChange:
    """Unpaused; the pending revision, if any, is rolled out now (a new generation; with none
    pending, the same one)."""
    pending = book.get(old.pending)
    if pending is None:
        return SpecChange(attrs.evolve(old.to_record(name), paused=False, pending=None))
    record = _running(name, old, pending, pending.number, held)
    wanted = record.backend_config.canary is not None
    canary_of, skipped = canary_base(book, book.get(old.revision), pending.version, wanted)
    revisions = superseded(book.revisions, [old.revision])
    revisions = [
        attrs.evolve(r, outcome="in_progress", canary_of=canary_of, canary_skipped=skipped)
        if r.number == pending.number
        else r
        for r in revisions
    ]
    return _change(record, revisions, record.backend_config, live, book, (old.revision,))


def _running(
    name: str,
    old: Spec,
    revision: Revision,
    number: int,
    held: tuple[str, JSON] | None,
    *,
    paused: bool = False,
    pending: int | None = None,
) -> SpecRecord:
    """`old`'s spec (its scale and settings) running `revision`'s content, as revision
    `number`. An unversioned revision keeps its ``gen-N``: replicas still running it are
    kept."""
    content = revision.content
    return deploy_record(
        name,
        old,
        with_content(old.backend_config, content),
        content.replica_config,
        held=held,
        code_generation=revision.code_generation,
        revision=number,
        paused=paused,
        pending=pending,
        restarted=revision.restarted,
    )


def _made_for(
    record: SpecRecord,
    content: RevisionContent,
    book: RevisionBook,
    cause: Cause,
    code_of: CodeOf,
    now: float,
) -> Revision:
    """The revision `record` rolls out, of `content`, pinned to the code on disk now."""
    return make_revision(
        book.next_number,
        content,
        now=now,
        cause=cause,
        code=code_of(content.replica_config.entrypoint),
        code_generation=_code_generation(record),
        restarted=record.restarted,
    )


def _replacing_running(
    old: Spec,
    book: RevisionBook,
    record: SpecRecord,
    revision: Revision,
    live: Iterable[int | None],
) -> SpecChange:
    """`record` with `revision` in place of the one `old` runs (or rolled out)."""
    revisions = [*superseded(book.revisions, [old.revision]), revision]
    return _change(record, revisions, record.backend_config, live, book, (old.revision,))


def _code_generation(record: SpecRecord) -> int:
    return record.code_generation or record.generation


def _change(
    record: SpecRecord,
    revisions: list[Revision],
    config: BackendConfig,
    live: Iterable[int | None],
    book: RevisionBook,
    replaces: tuple[int | None, ...] = (),
) -> SpecChange:
    """The change, with the history trimmed to the config's limit: never a revision a live
    replica runs, the one the spec runs or holds pending, or the one an undo would go to."""
    after = RevisionBook(revisions)
    running = after.get(record.revision)
    good = after.last_good(unlike=None if running is None else running.digest)
    # A canary's stable revision is kept while it is judged: an abort goes back to it.
    stable = None if running is None else running.canary_of
    keep = {record.revision, record.pending, None if good is None else good.number, stable, *live}
    kept = (n for n in keep if n is not None)
    trimmed = trim(revisions, config.revision_history_limit, kept)
    return SpecChange(record, trimmed, replaces)


def restored(
    spec: Spec, kept: RevisionsRecord | None, code_of: CodeOf, now: float
) -> tuple[Spec, RevisionBook]:
    """A stored spec and its revisions, as recovery holds them. A store from before revisions
    (or one whose history lost the spec's) gets one for what runs, written with the next
    change; a pending revision that is not kept is dropped."""
    book = RevisionBook(() if kept is None else kept.revisions)
    if book.get(spec.revision) is None:
        replica_config = spec.replica_config
        # The number the spec names, if it still can be (numbers only grow), else the next.
        number = book.next_number
        if spec.revision is not None and spec.revision > number:
            number = spec.revision
        revision = make_revision(
            number,
            content_of(spec.backend_config, replica_config),
            now=now,
            cause=Cause("controller", "recorded at recovery: the store kept no revision of it"),
            code=code_of(replica_config.entrypoint),
            code_generation=spec.code_generation,
        )
        book.revisions.append(revision)
        spec = attrs.evolve(spec, revision=revision.number)
    if book.get(spec.pending) is None:
        spec = attrs.evolve(spec, pending=None)
    return spec, book
