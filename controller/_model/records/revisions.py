"""Revisions: what a backend's replicas run, kept as data, so that a rollout can be undone.

A revision is the part of a deploy that replicas run (the class and its arguments, the version,
the user config, the resources), with a number that only grows, why it was made and how its
rollout went. Scale, autoscaling and the controller's own settings (rollout limits, timeouts,
health checks, route, deadline) are not part of it: changing them makes no revision, and an undo
keeps them as they are now, as ``kubectl rollout undo`` keeps a Deployment's replicas.

The controller writes a backend's revisions (``revisions/<name>``) in the same store batch as
the spec that makes one; the backend's loop notes how the rollout goes in memory and in its own
record (the rollout part of ``replicas/<name>``), which recovery lays over the stored history.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Literal, final

import attrs

from ..config.cause import Cause
from ..config.config import BackendConfig
from ..config.replica_config import ReplicaConfig
from ..values.code import CodeDigest
from ..values.json_values import JSON, canonical

#: How a revision's rollout went. ``pending``: recorded while the backend was paused, not rolled
#: out (yet); ``superseded``: another revision took its place before its rollout ended.
RevisionOutcome = Literal["pending", "in_progress", "complete", "failed", "superseded"]
#: The most a backend's history keeps of revisions' content (arguments and user configs), in
#: bytes of JSON, beyond the revisions it must keep: the record is written whole with each
#: revision, so a history of 1 MB user configs keeps four.
MAX_HISTORY_BYTES = 4 << 20


@attrs.frozen
class RevisionContent:
    """What replicas run: the part of a deploy a revision keeps."""

    replica_config: ReplicaConfig
    version: str | None
    user_config: JSON
    resources: dict[str, float]

    @property
    def digest(self) -> str:
        """A fingerprint of the content: two deploys that run the same replicas have the same."""
        rc = self.replica_config
        text = canonical(
            {
                "entrypoint": rc.entrypoint,
                "init_args": list(rc.init_args),
                "init_kwargs": rc.init_kwargs,
                "version": self.version,
                "user_config": self.user_config,
                "resources": dict(self.resources),
            }
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]


#: What a replica is started with: under an unchanged version, a change of these reaches only the
#: replicas started after it (the running ones keep what they were started with: a mixed fleet).
STARTED_WITH = ("entrypoint", "init_args", "init_kwargs", "resources")


def started_differently(before: RevisionContent, after: RevisionContent) -> tuple[str, ...]:
    """The fields of `STARTED_WITH` that `after` changes while keeping `before`'s version (an
    unversioned config's replicas get a new version at each deploy: none then)."""
    if after.version is None or before.version != after.version:
        return ()
    old, new = before.replica_config, after.replica_config
    # As the content's digest tells them apart (canonical JSON: 7 and 7.0 differ, as they do
    # to the replica that gets them), so that a change that makes a revision is named.
    changed = {
        "entrypoint": old.entrypoint != new.entrypoint,
        "init_args": canonical(list(old.init_args)) != canonical(list(new.init_args)),
        "init_kwargs": canonical(old.init_kwargs) != canonical(new.init_kwargs),
        "resources": canonical(dict(before.resources)) != canonical(dict(after.resources)),
    }
    return tuple(field for field in STARTED_WITH if changed[field])


def content_of(backend_config: BackendConfig, replica_config: ReplicaConfig) -> RevisionContent:
    return RevisionContent(
        replica_config,
        backend_config.version,
        backend_config.user_config,
        backend_config.resources,
    )


def with_content(backend_config: BackendConfig, content: RevisionContent) -> BackendConfig:
    """`backend_config` running `content`: its scale and settings, the revision's replicas."""
    return attrs.evolve(
        backend_config,
        version=content.version,
        user_config=content.user_config,
        resources=content.resources,
    )


@attrs.frozen
class Outcome:
    """How a revision's rollout went, as its rollout reports it to the desk (which marks it)."""

    revision: int
    outcome: RevisionOutcome
    good: bool = False
    """Whether it served at full count once (an undo may go back to it)."""
    error: str | None = None


@attrs.frozen
class Revision:
    """One revision of a backend, as ``ctl.revisions(name)`` lists it."""

    number: int
    """Grows by one with each revision of the backend; never reused."""
    content: RevisionContent
    """What its replicas run."""
    digest: str
    """The content's fingerprint (equal content, equal digest)."""
    created_at: float
    """When it was made, by the wall clock (seconds since the epoch)."""
    cause: Cause
    """Why it was made."""
    code: CodeDigest | None
    """The entrypoint module's source when it was made (None: not found on the controller's
    path, so not pinned)."""
    code_generation: int
    """The spec generation whose code an unversioned revision runs (its version is
    ``gen-N``)."""
    outcome: RevisionOutcome = "in_progress"
    """How its rollout went."""
    error: str | None = None
    """Why its rollout failed, if it did."""
    good: bool = False
    """Its rollout completed with every replica serving (and stayed healthy for
    ``min_ready_s``): a plain undo goes back to the newest such revision."""
    restores: int | None = None
    """Made by an undo or a rollback: the revision whose content it brings back."""
    automatic: bool = False
    """Made by an automatic rollback (``on_failure = "rollback"``)."""
    restarted: int | None = None
    """Its replicas come from a ``rollout restart`` of a config with a version: the restart's
    generation, which their version carries (``v1+restart.7``)."""
    restarts: int | None = None
    """Made by ``rollout restart``: the revision whose content it runs again, with the code on
    disk then."""
    canary_of: int | None = None
    """Rolled out as a canary (``BackendConfig.canary``) against this revision, the stable
    one: its replicas served the rest of the traffic until the canary was promoted or
    aborted."""
    canary_skipped: str | None = None
    """Why a backend with a canary block rolled this revision out without one (the first
    revision, or one whose replicas keep their version)."""
    same_version: tuple[str, ...] = ()
    """What it changed of how replicas start (``STARTED_WITH``) under the version of the
    revision before it: the replicas that ran then keep what they were started with, new ones
    get this; a new version replaces them."""
    code_changed: bool | None = None
    """Filled when listed: whether the code on disk differs from `code` now (None: cannot
    tell). Never stored."""

    @property
    def version(self) -> str:
        """The version its replicas have (``gen-N`` when its config names none)."""
        return replica_version(self.content.version, self.code_generation, self.restarted)


def replica_version(version: str | None, code_generation: int, restarted: int | None) -> str:
    """The version replicas of a config have: its own, marked by a restart if one made them;
    ``gen-N`` (N: the generation whose code they run) when it names none."""
    if version is None:
        return f"gen-{code_generation}"
    return version if restarted is None else f"{version}+restart.{restarted}"


def make_revision(
    number: int,
    content: RevisionContent,
    *,
    now: float,
    cause: Cause,
    code: CodeDigest | None,
    code_generation: int,
    outcome: RevisionOutcome = "in_progress",
    restores: int | None = None,
    automatic: bool = False,
    restarted: int | None = None,
    restarts: int | None = None,
    canary: tuple[int | None, str | None] = (None, None),
) -> Revision:
    return Revision(
        number,
        content,
        content.digest,
        # Whole seconds: enough for a history, and the stored text keeps one length.
        float(int(now)),
        cause,
        code,
        code_generation,
        outcome=outcome,
        restores=restores,
        automatic=automatic,
        restarted=restarted,
        restarts=restarts,
        canary_of=canary[0],
        canary_skipped=canary[1],
    )


def canary_base(
    book: RevisionBook, running: Revision | None, version: str, wanted: bool
) -> tuple[int | None, str | None]:
    """What a revision of replicas of `version` is rolled out against, when `wanted` (the
    config has a canary block) and `running` is what the backend ran: (the stable revision,
    None), or (None, why there is none). The stable revision is the one that completed, or,
    while a canary is still being judged, that canary's own stable revision."""
    if not wanted:
        return None, None
    if running is None:
        return None, "no revision has completed with every replica serving to compare it with"
    stable: Revision | None = running
    if running.canary_of is not None and running.outcome != "complete":
        stable = book.get(running.canary_of)
    elif running.outcome != "complete" and any(
        r.good and r.digest == running.digest for r in book.revisions
    ):
        # Still rolling out, of content that completed before (an undo, or the rollback of an
        # aborted canary whose replicas are still draining): its replicas are that content's.
        return _versus(running, version)
    if stable is None or stable.outcome != "complete" or not stable.good:
        return None, (
            f"revision {running.number}, which the backend ran, had not completed with every "
            "replica serving, so there was nothing to compare it with"
        )
    return _versus(stable, version)


def _versus(stable: Revision, version: str) -> tuple[int | None, str | None]:
    if stable.version == version:
        return None, (
            f"its replicas keep version {version!r} (a change of user_config alone is made in "
            "place): give it a new version to try it as a canary"
        )
    return stable.number, None


def trim(revisions: Sequence[Revision], limit: int, keep: Iterable[int]) -> list[Revision]:
    """`revisions` (oldest first) without those past the history limit: the newest `limit` + 1
    stay (the current one and `limit` before it), and every revision in `keep` (those live
    replicas run, the one an undo would go back to, the pending one). The whole history is one
    store record, written with every revision: beyond `MAX_HISTORY_BYTES` of content, the oldest
    that may go, go (a history of large user configs keeps fewer)."""
    kept = set(keep)
    newest = {r.number for r in revisions[-(limit + 1) :]}
    out = [r for r in revisions if r.number in newest or r.number in kept]
    sizes = [_size(r) for r in out]
    total = sum(sizes)
    for i, revision in enumerate(out):
        if total <= MAX_HISTORY_BYTES or i == len(out) - 1:
            break
        if revision.number not in kept:
            total -= sizes[i]
            sizes[i] = -1
    return [r for r, size in zip(out, sizes, strict=True) if size >= 0]


def _size(revision: Revision) -> int:
    """About what a revision takes in the store: its content as JSON."""
    rc = revision.content.replica_config
    return len(canonical([list(rc.init_args), rc.init_kwargs, revision.content.user_config]))


@final
class RevisionBook:
    """One backend's revisions in memory, oldest first. One writer, the controller's desk: it
    adds revisions (once the store holds them) and marks the outcomes the backend's rollout
    reports; everyone else reads."""

    def __init__(self, revisions: Sequence[Revision] = ()):
        self.revisions: list[Revision] = list(revisions)

    @property
    def latest(self) -> Revision | None:
        return self.revisions[-1] if self.revisions else None

    @property
    def next_number(self) -> int:
        latest = self.latest
        return 1 if latest is None else latest.number + 1

    def get(self, number: int | None) -> Revision | None:
        for revision in self.revisions:
            if revision.number == number:
                return revision
        return None

    def mark(self, outcome: Outcome) -> None:
        """Note how a revision's rollout went (nothing if the history no longer has it). The
        controller's desk is the one caller: rollouts report, the desk marks."""
        self.revisions = with_outcomes(self.revisions, [outcome])

    def last_good(self, *, unlike: str | None = None) -> Revision | None:
        """The newest revision whose rollout completed with every replica serving, and whose
        content is not `unlike` (the digest of what runs now)."""
        for revision in reversed(self.revisions):
            if revision.good and revision.digest != unlike:
                return revision
        return None

    def current(self) -> Revision | None:
        """The newest revision whose rollout completed (what the backend last finished)."""
        for revision in reversed(self.revisions):
            if revision.outcome == "complete":
                return revision
        return None


def with_outcomes(
    history: Sequence[Revision], outcomes: Iterable[Outcome], replaces: Iterable[int | None] = ()
) -> list[Revision]:
    """`history` with `outcomes` marked in the order they came (a revision no longer in it is
    skipped), and the revisions of `replaces` still superseded if their rollout is under way:
    a change that lands over a rollout it replaces ends it, whatever the rollout said since."""
    out = list(history)
    for outcome in outcomes:
        for i, revision in enumerate(out):
            if revision.number == outcome.revision:
                out[i] = attrs.evolve(
                    revision, outcome=outcome.outcome, good=outcome.good, error=outcome.error
                )
    return superseded(out, replaces)


def superseded(revisions: Sequence[Revision], numbers: Iterable[int | None]) -> list[Revision]:
    """`revisions` with those of `numbers` still under way (in progress or pending) marked
    superseded: another revision takes their place."""
    gone = set(numbers)
    return [
        attrs.evolve(r, outcome="superseded")
        if r.number in gone and r.outcome in ("in_progress", "pending")
        else r
        for r in revisions
    ]


def describe_cause(revision: Revision) -> str:
    """``undo to revision 2, cli: "bad release"`` and the like, for events and history."""
    cause = revision.cause
    parts = []
    if revision.automatic:
        parts.append(f"automatic rollback to revision {revision.restores}")
    elif revision.restores is not None:
        parts.append(f"undo to revision {revision.restores}")
    elif revision.restarts is not None:
        parts.append(f"restart of revision {revision.restarts}")
    parts.append(cause.via)
    if cause.manifest is not None:
        parts.append(f"from {cause.manifest}")
    text = ", ".join(parts)
    if cause.message is not None:
        text += f": {json.dumps(cause.message, ensure_ascii=False)}"
    return text
