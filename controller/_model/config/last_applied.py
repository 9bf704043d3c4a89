"""What a manifest last applied to a backend, and how a new apply merges with it.

As ``kubectl apply`` does with its last-applied configuration, the controller keeps, per backend,
the fields the manifest set (as JSON text in the spec's record) and merges three ways:

- a field whose value in the file is what the file said last time keeps its live value, so
  what ``scale``, the console, ``rollout undo`` or a ``PUT`` changed since stays;
- a field the file changes (or names for the first time) takes the file's value;
- a field the file named last time and names no more goes back to its default.

A backend the manifest never applied (new, deployed otherwise, or being deleted) takes the
file's configs whole, as before. Whole values are compared: a table such as ``autoscaling``
or ``user_config`` is one field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from ..values.json_values import JSON
from .config import BackendConfig
from .manifest import BackendDecl, config_to_dict
from .replica_config import ReplicaConfig

Configs = tuple[BackendConfig, ReplicaConfig]

_BACKEND_DEFAULTS = config_to_dict(BackendConfig())
_REPLICA_DEFAULTS = config_to_dict(ReplicaConfig("module:Class"))


@attrs.frozen
class BackendDiff:
    """What an apply would do to one backend (``apply --dry-run``)."""

    name: str
    action: Literal["created", "changed", "unchanged", "deleted"]
    fields: Mapping[str, tuple[JSON, JSON]] = attrs.field(factory=dict)
    """Each field that would change: (now, then); for a new backend, those not at defaults."""
    same_version: tuple[str, ...] = ()
    """Of those, what changes how replicas start under the version they run
    (``Revision.same_version``)."""


def diff_of(name: str, live: Configs | None, after: Configs) -> BackendDiff:
    """The diff of a backend from its `live` configs (None: none yet) to `after`."""
    fields = changed_fields(live, after)
    if live is None:
        return BackendDiff(name, "created", fields)
    return BackendDiff(name, "changed" if fields else "unchanged", fields)


def applied_text(decl: BackendDecl) -> str:
    """The fields `decl`'s file set, with the values the configs hold (checked and converted:
    ``1`` and ``1.0`` are one value), as canonical JSON text."""
    return _dumps({name: value for name, value in decl.to_dict().items() if name in decl.given})


def merged(decl: BackendDecl, last: str | None, live: Configs | None) -> Configs:
    """The configs an apply of `decl` asks for, over the `live` configs (None: no backend) and
    the fields the manifest `last` applied (None: never). ``ConfigError`` if the merge breaks a
    rule that ties fields together (named as the config's own check names it)."""
    if live is None or last is None:
        return decl.backend_config, decl.replica_config
    before: dict[str, Any] = json.loads(last)
    given = json.loads(applied_text(decl))
    fields = {**config_to_dict(live[0]), **config_to_dict(live[1])}
    for name, value in given.items():
        # As JSON text: 1 (one replica) and 1.0 (all of them) differ, as do true and 1.
        if name not in before or _dumps(before[name]) != _dumps(value):
            fields[name] = value
    for name in before.keys() - given.keys():
        fields[name] = {**_BACKEND_DEFAULTS, **_REPLICA_DEFAULTS}[name]
    return (
        BackendConfig.from_dict({k: v for k, v in fields.items() if k in _BACKEND_DEFAULTS}),
        ReplicaConfig.from_dict({k: v for k, v in fields.items() if k in _REPLICA_DEFAULTS}),
    )


def changed_fields(before: Configs | None, after: Configs) -> dict[str, tuple[JSON, JSON]]:
    """Each field whose value differs, as (before, after); every field of a new backend (with
    None before) that is not at its default."""
    old: Mapping[str, JSON] = (
        {**config_to_dict(before[0]), **config_to_dict(before[1])}
        if before is not None
        else {**_BACKEND_DEFAULTS, **_REPLICA_DEFAULTS, "entrypoint": None}
    )
    new = {**config_to_dict(after[0]), **config_to_dict(after[1])}
    return {
        name: (None if before is None else _plain(old[name]), _plain(value))
        for name, value in new.items()
        if _dumps(old.get(name)) != _dumps(value)
    }


def _plain(value: Any) -> JSON:
    """`value` as JSON data (a mapping proxy or tuple inside a config becomes a dict or list)."""
    result: JSON = json.loads(_dumps(value))
    return result


def _dumps(value: Any) -> str:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), allow_nan=False, default=_json_default
    )


def _json_default(value: object) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple | frozenset):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON")
