"""Applications: backends deployed, undone, restarted and deleted as one.

A manifest groups backends that call each other::

    [applications.shop]
    entry = "frontend"           # the member the ingress routes to (it keeps its route_prefix)
    backends = ["ranker"]        # the members it calls; the entry is a member too

An application has revisions of its own: each one names the revision every member asked for
when it was made, so that an undo puts every member back as it was, in one store batch. Its
record is ``applications/<name>``, written in the same batch as the members' specs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from ..values.errors import ConfigError
from ..values.fields import unknown_field
from .canary import CanaryConfig
from .cause import Cause
from .config import check_backend_name

#: How many revisions an application keeps (each is a few numbers a member: cheap).
MAX_APP_REVISIONS = 20
APPLICATIONS_PREFIX = "applications/"
_FIELDS = ("backends", "canary", "entry")


def application_key(name: str) -> str:
    return APPLICATIONS_PREFIX + name


@attrs.frozen
class AppDecl:
    """One application as a manifest declares it."""

    name: str
    entry: str
    members: tuple[str, ...]
    """The entry first, then the others in the order given."""
    canary: CanaryConfig | None = None
    """The canary block of every member that sets none of its own: their canaries start in
    one batch, on the same steps, and end with one verdict."""


@attrs.frozen
class AppRevision:
    """What every member asked for when the application's revision was made."""

    number: int
    members: dict[str, int]
    """Each member's backend revision."""
    cause: Cause = attrs.field(factory=Cause)
    created_at: float = 0.0
    undone_to: int | None = None
    """The application revision an undo went back to (None: not an undo)."""
    restart: bool = False
    """Made by a restart of every member (the same content, the code on disk)."""


@attrs.frozen
class ApplicationRecord:
    """An application: its members and its revisions, oldest first."""

    name: str
    entry: str
    members: list[str]
    revisions: list[AppRevision]
    schema: int = 1

    @property
    def latest(self) -> AppRevision | None:
        return self.revisions[-1] if self.revisions else None

    def get(self, number: int) -> AppRevision | None:
        for revision in self.revisions:
            if revision.number == number:
                return revision
        return None

    def with_revision(
        self,
        entry: str,
        members: Sequence[str],
        asked: Mapping[str, int],
        cause: Cause,
        now: float,
        undone_to: int | None = None,
        *,
        restart: bool = False,
    ) -> ApplicationRecord:
        """This record with `entry` and `members`, and a new revision if what they ask differs
        from the latest (or the membership changed); else itself."""
        latest = self.latest
        if (
            latest is not None
            and latest.members == dict(asked)
            and entry == self.entry
            and list(members) == self.members
        ):
            return self
        number = 1 if latest is None else latest.number + 1
        revision = AppRevision(number, dict(asked), cause, now, undone_to, restart)
        kept = [*self.revisions, revision][-MAX_APP_REVISIONS:]
        return ApplicationRecord(self.name, entry, list(members), kept)


def parse_applications(
    data: object, backends: Mapping[str, object]
) -> tuple[tuple[AppDecl, ...], list[str]]:
    """The ``applications`` table of a manifest, checked against its `backends`: every fault
    found, each naming the application and the field."""
    if not isinstance(data, Mapping):
        return (), ["applications: must be a table of application name to its fields"]
    problems: list[str] = []
    decls: list[AppDecl] = []
    owner: dict[str, str] = {}
    for name, fields in data.items():
        label = f"application {name!r}"
        try:
            check_backend_name(name)
        except ConfigError as exc:
            problems.append(f"{label}: {exc.rule.replace('a backend name', 'its name')}")
            continue
        if name in backends:
            problems.append(
                f"{label}: a backend of this manifest has the name; an application and a "
                "backend may not share one (the CLI takes either by name)"
            )
        if not isinstance(fields, Mapping):
            problems.append(f"{label}: must be a table with 'entry' (and 'backends')")
            continue
        found = _members(label, fields, backends)
        problems.extend(found[1])
        if found[0] is None:
            continue
        for member in found[0]:
            if member in owner:
                problems.append(
                    f"{label}: backends: {member!r} is a member of application "
                    f"{owner[member]!r} too; a backend belongs to one application"
                )
            owner[member] = name
        canary = None
        if fields.get("canary") is not None:
            try:
                canary = CanaryConfig.from_dict(fields["canary"])
            except ConfigError as exc:
                field = exc.field.partition(".")[2] or exc.field
                problems.append(f"{label}: {field}: {exc.rule}")
                continue
        decls.append(AppDecl(name, found[0][0], found[0], canary))
    return tuple(decls), problems


def _members(
    label: str, fields: Mapping[object, object], backends: Mapping[str, object]
) -> tuple[tuple[str, ...] | None, list[str]]:
    problems = [
        f"{label}: {key}: {unknown_field(key, _FIELDS)}" for key in fields if key not in _FIELDS
    ]
    entry = fields.get("entry")
    if entry is None:
        problems.append(f"{label}: entry: is required (the backend requests enter by)")
    elif not isinstance(entry, str) or entry not in backends:
        problems.append(
            f"{label}: entry: must name a backend of this manifest's [backends] (got {entry!r})"
        )
    others = fields.get("backends", [])
    if not isinstance(others, list) or not all(isinstance(m, str) for m in others):
        problems.append(f"{label}: backends: must be a list of backend names")
        others = []
    for member in others:
        if member not in backends:
            problems.append(
                f"{label}: backends: {member!r} is not a backend of this manifest's [backends]"
            )
    if len(set(others)) != len(others):
        problems.append(f"{label}: backends: names a backend twice")
    if problems or not isinstance(entry, str):
        return None, problems
    return (entry, *(m for m in others if m != entry)), []


@attrs.frozen
class MemberStatus:
    """One member of an application, as its status shows it."""

    name: str
    entry: bool
    state: str
    """Its backend's state (``HEALTHY``, ``UPDATING``, ...; ``MISSING`` if it is gone)."""
    message: str
    revision: int | None
    """The backend revision it asks for now."""
    recorded: int | None
    """The one the application's latest revision recorded (differs after a change of the
    member alone: a deploy or undo of the backend itself)."""


@attrs.frozen
class ApplicationStatus:
    """An application as a unit: healthy when every member is."""

    name: str
    entry: str
    revision: int | None
    """Its latest revision."""
    state: str
    """``HEALTHY`` when every member is, else the state of the first member that is not."""
    members: tuple[MemberStatus, ...]
