"""Checkpoints: the controller's intent as JSON through cattrs, with a schema version. Never pickle.

Four keys per backend, each with one writer, so that writes can never interleave badly:

- ``spec/<name>``: what the user asked for (written by deploy and delete, before they return).
- ``replicas/<name>``: which replica tags the controller means to run or stop (written only by
  the backend's writer task; the runtime is asked for nothing until the write has landed). A
  large backend's replicas are kept in pages: the first in this record, the others in
  ``replicas/<name>/<page>``, which it lists, written in the same batches (so a change costs
  a page, not every replica).
- ``revisions/<name>``: the backend's revisions (written by deploys, undos, pauses and resumes,
  in the same batch as the spec; how each rollout went is noted in the replica record).
- ``events/<name>``: the backend's recent events, for people (written by the same task, in the
  same batch as the replica record; nothing waits on it).

And one per application: ``applications/<name>``, its members and revisions (``applications``),
written by the controller's applications in the same batch as the members' specs it names.

Schema 2 added the events, each replica's creation time and a spec's rollback config; schema 3
each serving replica's address and a failed deploy; schema 4 a spec's code generation and the
backend config's routing fields; schema 5 an autoscaler's state; schema 6 revisions (a fourth key
per backend, ``revisions/<name>``, written by deploys with the spec), the revision of each replica
and the pause of a spec; schema 7 the pages of replicas; schema 8 what a manifest last applied;
schema 9 a restart's generation (spec and revision). Data of schemas 1 to 8 is still read.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Generator, Iterable
from json.encoder import encode_basestring_ascii as _quote
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn, override

from ..config.applications import APPLICATIONS_PREFIX, ApplicationRecord
from ..config.config import BackendConfig
from ..config.replica_config import ReplicaConfig
from ..values.errors import CheckpointError, ControllerError
from ..values.fields import fields_of
from .records import (
    EVENTS_PREFIX,
    MAX_REVISION,
    READABLE_SCHEMAS,
    REPLICAS_PREFIX,
    REVISIONS_PREFIX,
    SCHEMA_VERSION,
    SPEC_PREFIX,
    AutoscaleRecord,
    EventRecord,
    EventsRecord,
    FailureRecord,
    ReplicaPageRecord,
    ReplicaRecord,
    ReplicasRecord,
    RevisionsRecord,
    RolloutRecord,
    SpecRecord,
    page_key,
    replicas_key,
    revisions_key,
    spec_key,
)
from .revisions import Revision, RevisionContent, content_of


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)
    # JSON's true is not 1, nor 1.5 a count: cattrs' own int hook would take both.
    conv.register_structure_hook(int, lambda data, _t: _strict(data, int))
    conv.register_structure_hook(bool, lambda data, _t: _strict(data, bool))
    # A record per replica is kept in memory (cached) and in every write of its backend: the
    # fields at their defaults are left out, so most entries carry only what sets them apart.
    conv.register_unstructure_hook(
        ReplicaRecord, make_dict_unstructure_fn(ReplicaRecord, conv, _cattrs_omit_if_default=True)
    )
    # The configs validate themselves (naming each field), so they go through their own
    # constructors rather than cattrs' generic structuring of JSON unions.
    conv.register_structure_hook(BackendConfig, lambda data, _t: BackendConfig.from_dict(data))
    conv.register_structure_hook(ReplicaConfig, lambda data, _t: ReplicaConfig.from_dict(data))
    conv.register_unstructure_hook(BackendConfig, fields_of)
    conv.register_unstructure_hook(ReplicaConfig, _replica_config)
    conv.register_unstructure_hook(RevisionContent, _content)
    conv.register_structure_hook(RevisionContent, lambda data, _t: _content_from(data))
    conv.register_unstructure_hook(
        Revision, make_dict_unstructure_fn(Revision, conv, code_changed=override(omit=True))
    )
    return conv


def _strict(data: object, kind: type[_T]) -> _T:
    # The exact type: bool is an int subclass, and cattrs would make 1 of "1" or 1.5.
    if type(data) is not kind:
        raise ValueError(f"{data!r} is not {'true or false' if kind is bool else 'a whole number'}")
    return data


def _replica_config(config: ReplicaConfig) -> dict[str, Any]:
    return {
        "entrypoint": config.entrypoint,
        "init_args": list(config.init_args),
        "init_kwargs": config.init_kwargs,
    }


def _content(content: RevisionContent) -> dict[str, Any]:
    return {
        "replica_config": _replica_config(content.replica_config),
        "version": content.version,
        "user_config": content.user_config,
        "resources": content.resources,
    }


def _content_from(data: Any) -> RevisionContent:
    """A revision's content, checked by the configs' own rules (each names its field)."""
    if not isinstance(data, dict) or set(data) != {
        "replica_config",
        "version",
        "user_config",
        "resources",
    }:
        raise ValueError("a revision's content has replica_config, version, user_config, resources")
    backend = BackendConfig(
        version=data["version"], user_config=data["user_config"], resources=data["resources"]
    )
    return content_of(backend, ReplicaConfig.from_dict(data["replica_config"]))


_converter = _make_converter()

_T = TypeVar("_T")
_R = TypeVar(
    "_R",
    SpecRecord,
    ReplicasRecord,
    ReplicaPageRecord,
    EventsRecord,
    RevisionsRecord,
    ApplicationRecord,
)


def dump(
    record: SpecRecord
    | ReplicasRecord
    | ReplicaPageRecord
    | EventsRecord
    | RevisionsRecord
    | ApplicationRecord,
) -> str:
    """The record as compact JSON text."""
    return json.dumps(_converter.unstructure(record), separators=(",", ":"), allow_nan=False)


def dump_replica(record: ReplicaRecord) -> str:
    """One replica's entry of a ReplicasRecord, as JSON text: exactly what ``dump`` makes of it
    (its fields in order, those at their default left out), written out by hand.

    The backend caches this per replica and joins the pieces with ``join_replicas``, so that a
    checkpoint of 1,000 replicas does not re-encode the 999 that did not change. An entry is
    still made at each start, each start's end and each stop, 300,000 for a scale-up and down
    of 100,000: through cattrs and ``json.dumps`` one took 3.7 us, written out 0.8 us
    (tests/core/test_checkpoint_pages.py holds the two to the same text).
    """
    text = (
        f'{{"tag":{_quote(record.tag)},"version":{_quote(record.version)},'
        f'"config_digest":{_quote(record.config_digest)}'
    )
    if record.stopping:
        text += ',"stopping":true'
    if record.created_ms is not None:
        text += f',"created_ms":{int(record.created_ms)}'
    if not record.served:
        text += ',"served":false'
    if record.address is not None:
        text += f',"address":{_quote(record.address)}'
    if record.revision is not None:
        text += f',"revision":{int(record.revision)}'
    if record.stopping_ms is not None:
        text += f',"stopping_ms":{int(record.stopping_ms)}'
    return text + "}"


def join_replicas(
    name: str,
    entries: str,
    failed: FailureRecord | None = None,
    autoscale: AutoscaleRecord | None = None,
    rollout: RolloutRecord | None = None,
    pages: list[int] | None = None,
) -> str:
    """What ``dump(ReplicasRecord(name, ...))`` makes, from entries made by ``dump_replica``
    (comma-separated in `entries`)."""
    failure, scale, roll = (
        json.dumps(_converter.unstructure(part), separators=(",", ":"))
        for part in (failed, autoscale, rollout)
    )
    listed = ",".join(str(page) for page in pages or ())
    return (
        f'{{"name":{json.dumps(name)},"replicas":[{entries}],"failed":{failure},'
        f'"autoscale":{scale},"rollout":{roll},"pages":[{listed}],"schema":{SCHEMA_VERSION}}}'
    )


def dump_event(record: EventRecord) -> str:
    """One event of an EventsRecord, as JSON text: a backend keeps each event's text, so that
    storing its log (on every checkpoint that adds an event) encodes the new events only."""
    return json.dumps(_converter.unstructure(record), separators=(",", ":"), allow_nan=False)


def join_events(name: str, entries: Iterable[str]) -> str:
    """What ``dump(EventsRecord(name, ...))`` makes, from entries made by ``dump_event``."""
    return f'{{"name":{json.dumps(name)},"events":[{",".join(entries)}],"schema":{SCHEMA_VERSION}}}'


def join_page(name: str, page: int, entries: str) -> str:
    """What ``dump(ReplicaPageRecord(name, page, ...))`` makes, from comma-separated entries."""
    return (
        f'{{"name":{json.dumps(name)},"page":{page},"replicas":[{entries}],'
        f'"schema":{SCHEMA_VERSION}}}'
    )


def load(key: str, text: str, cls: type[_R]) -> _R:
    """Parse one stored record; anything unreadable raises CheckpointError naming the key."""
    try:
        data: Any = json.loads(text)
    except ValueError as exc:
        raise CheckpointError(
            f"store key {key!r} is not valid JSON ({exc}); {_UNTOUCHED}"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("schema"), int):
        raise CheckpointError(f"store key {key!r} has no schema version; {_UNTOUCHED}")
    schema = data["schema"]
    if schema > SCHEMA_VERSION:
        raise CheckpointError(
            f"store key {key!r} was written with checkpoint schema {schema}, newer than this "
            f"controller reads ({SCHEMA_VERSION}); run a newer controller. {_UNTOUCHED}"
        )
    if schema not in READABLE_SCHEMAS:
        raise CheckpointError(f"store key {key!r} has unknown schema {schema}; {_UNTOUCHED}")
    try:
        record = _converter.structure(data, cls)
    except (cattrs.BaseValidationError, ControllerError, TypeError, ValueError) as exc:
        raise CheckpointError(
            f"store key {key!r} is corrupt: {_describe(exc)}; {_UNTOUCHED}"
        ) from None
    # Read in an older shape, held in today's: written back as today's the next time.
    return attrs.evolve(record, schema=SCHEMA_VERSION)


def _describe(exc: BaseException) -> str:
    """The innermost causes of a structuring failure; our own errors already name their field."""
    if isinstance(exc, cattrs.BaseValidationError):
        return "; ".join(_describe(inner) for inner in exc.exceptions)
    if isinstance(exc, ControllerError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


_UNTOUCHED = "the stored data was left untouched"


@attrs.frozen
class Checkpoint:
    """Everything read from a store at start-up, parsed and checked."""

    specs: dict[str, SpecRecord]
    replicas: dict[str, ReplicasRecord]
    events: dict[str, EventsRecord] = attrs.field(factory=dict)
    revisions: dict[str, RevisionsRecord] = attrs.field(factory=dict)
    applications: dict[str, ApplicationRecord] = attrs.field(factory=dict)


#: How many keys `parse_in_steps` parses between two of its steps.
KEYS_A_STEP = 128


def parse_all(items: dict[str, str]) -> Checkpoint:
    """Parse a whole store; raises CheckpointError before the controller acts on any of it."""
    steps = parse_in_steps(items)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            checkpoint: Checkpoint = done.value
            return checkpoint


def parse_in_steps(items: dict[str, str]) -> Generator[None, None, Checkpoint]:
    """``parse_all`` a step at a time: it yields after every `KEYS_A_STEP` keys, and returns
    the checkpoint. A caller on an event loop lets its other tasks run at each step (parsing
    a store of thousands of backends takes seconds)."""
    specs: dict[str, SpecRecord] = {}
    replicas: dict[str, ReplicasRecord] = {}
    pages: dict[str, dict[int, ReplicaPageRecord]] = {}
    events: dict[str, EventsRecord] = {}
    revisions: dict[str, RevisionsRecord] = {}
    applications: dict[str, ApplicationRecord] = {}
    for done, (key, text) in enumerate(items.items(), 1):
        if done % KEYS_A_STEP == 0:
            yield
        if key.startswith(SPEC_PREFIX):
            spec = load(key, text, SpecRecord)
            _check_name(key, SPEC_PREFIX, spec.name)
            _check_rollback(key, spec)
            for number in (spec.revision, spec.pending):
                if number is not None and not 1 <= number <= MAX_REVISION:
                    raise CheckpointError(
                        f"store key {key!r} is corrupt: revision {number} is not a revision's "
                        f"number; {_UNTOUCHED}"
                    )
            specs[spec.name] = spec
        elif key.startswith(REPLICAS_PREFIX) and "/" in key[len(REPLICAS_PREFIX) :]:
            page = load(key, text, ReplicaPageRecord)
            if key != page_key(page.name, page.page):
                raise CheckpointError(
                    f"store key {key!r} holds page {page.page} of {page.name!r}; {_UNTOUCHED}"
                )
            pages.setdefault(page.name, {})[page.page] = page
        elif key.startswith(REPLICAS_PREFIX):
            record = load(key, text, ReplicasRecord)
            _check_name(key, REPLICAS_PREFIX, record.name)
            replicas[record.name] = record
        elif key.startswith(EVENTS_PREFIX):
            history = load(key, text, EventsRecord)
            _check_name(key, EVENTS_PREFIX, history.name)
            events[history.name] = history
        elif key.startswith(REVISIONS_PREFIX):
            kept = load(key, text, RevisionsRecord)
            _check_name(key, REVISIONS_PREFIX, kept.name)
            _check_numbers(key, kept)
            revisions[kept.name] = kept
        elif key.startswith(APPLICATIONS_PREFIX):
            application = load(key, text, ApplicationRecord)
            _check_name(key, APPLICATIONS_PREFIX, application.name)
            applications[application.name] = application
        # Other keys belong to other users of a shared store (the daemon's own settings, say).
    for prefix, records in (
        (REPLICAS_PREFIX, replicas.keys() | pages.keys()),
        (REVISIONS_PREFIX, revisions.keys()),
        (EVENTS_PREFIX, events.keys()),
    ):
        for name in sorted(records - specs.keys()):
            # A spec is written before (or with) its backend's other records, and deleted with
            # them in one batch: without it, the controller cannot tell what those replicas
            # are for, and must not take them for strays to kill.
            raise CheckpointError(
                f"store key {prefix + name!r} has no spec: {spec_key(name)!r} is missing; "
                f"{_UNTOUCHED}"
            )
    for name, spec in specs.items():
        kept_of = revisions.get(name)
        numbers = set() if kept_of is None else {r.number for r in kept_of.revisions}
        for number in (spec.revision, spec.pending):
            # Written in one batch with the spec, and never trimmed while the spec names it:
            # a history without the spec's revision was not written by a controller. (No
            # history at all is a store from before revisions: recovery makes one.)
            if kept_of is not None and number is not None and number not in numbers:
                raise CheckpointError(
                    f"store key {revisions_key(name)!r} is corrupt: it lacks revision {number}, "
                    f"which {spec_key(name)!r} names; {_UNTOUCHED}"
                )
    for name, held in sorted(pages.items()):
        listed = replicas[name].pages if name in replicas else []
        for number in sorted(set(held) - set(listed)):
            # Each batch writes a record with the pages it lists, and deletes the others: a
            # page no record lists means the record lost track of replicas that may be live.
            raise CheckpointError(
                f"store key {page_key(name, number)!r} is a page of replicas that "
                f"{replicas_key(name)!r} does not list; {_UNTOUCHED}"
            )
    owner: dict[str, str] = {}
    for name, record in sorted(replicas.items()):
        if record.pages:
            record = replicas[name] = _with_pages(record, pages.get(name, {}))
        for replica in record.replicas:
            other = owner.get(replica.tag)
            if other is not None:  # a replica is one backend's, listed once
                where = "with its pages" if other == name else f"and {replicas_key(other)!r}"
                raise CheckpointError(
                    f"store key {replicas_key(name)!r} {where} list replica {replica.tag!r} "
                    f"twice; {_UNTOUCHED}"
                )
            owner[replica.tag] = name
    return Checkpoint(
        specs=specs,
        replicas=replicas,
        events=events,
        revisions=revisions,
        applications=applications,
    )


def _with_pages(record: ReplicasRecord, held: dict[int, ReplicaPageRecord]) -> ReplicasRecord:
    """`record` with the replicas of the pages it lists after its own."""
    key = replicas_key(record.name)
    if len(set(record.pages)) != len(record.pages):
        raise CheckpointError(f"store key {key!r} lists a page twice; {_UNTOUCHED}")
    replicas = list(record.replicas)
    for page in record.pages:
        if page not in held:
            raise CheckpointError(
                f"store key {key!r} lists {page_key(record.name, page)!r}, which the store "
                f"does not hold; {_UNTOUCHED}"
            )
        if not held[page].replicas:  # a page is deleted in the batch that empties it
            raise CheckpointError(
                f"store key {page_key(record.name, page)!r} is an empty page; {_UNTOUCHED}"
            )
        replicas += held[page].replicas
    return attrs.evolve(record, replicas=replicas)


def _check_rollback(key: str, spec: SpecRecord) -> None:
    if spec.rollback_config is None:
        return
    try:
        json.loads(spec.rollback_config)
    except ValueError as exc:
        raise CheckpointError(
            f"store key {key!r} is corrupt: rollback_config is not JSON ({exc}); {_UNTOUCHED}"
        ) from None


def _check_numbers(key: str, kept: RevisionsRecord) -> None:
    """Revision numbers only grow: a history whose numbers do not (out of order, repeated,
    below 1 or past the largest) was not written by a controller."""
    numbers = [r.number for r in kept.revisions]
    if any(type(n) is not int or not 1 <= n <= MAX_REVISION for n in numbers) or any(
        a >= b for a, b in itertools.pairwise(numbers)
    ):
        raise CheckpointError(
            f"store key {key!r} is corrupt: revision numbers must grow from 1 (got "
            f"{numbers[:10]}); {_UNTOUCHED}"
        )


def _check_name(key: str, prefix: str, name: str) -> None:
    if key != prefix + name:
        raise CheckpointError(f"store key {key!r} holds the record of {name!r}; {_UNTOUCHED}")
