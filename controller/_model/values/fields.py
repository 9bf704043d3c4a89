"""What the configs share as attrs classes: each field's rule as JSON Schema (for the API's
document), a config built from a mapping with unknown and missing keys named, and a config's
fields as JSON data."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import attrs

from .errors import ConfigError

_C = TypeVar("_C")


def schema(**rule: Any) -> dict[str, Any]:
    """A field's rule as JSON Schema, for the API's document."""
    return {"schema": rule}


def field_schemas(cls: type[Any]) -> dict[str, dict[str, Any]]:
    """The JSON Schema of each field of `cls` (BackendConfig or ReplicaConfig)."""
    return {f.name: f.metadata["schema"] for f in attrs.fields(cls)}


def unknown_field(key: object, known: Iterable[str]) -> str:
    """The rule an unknown field breaks: the known field it most looks like (a typo, as
    ``did you mean `num_replicas`?``), or, if none, every known field."""
    names = sorted(known)
    near = difflib.get_close_matches(str(key), names, n=1, cutoff=0.75)
    if near:
        return f"unknown field; did you mean `{near[0]}`?"
    return f"unknown field; known fields are {', '.join(names)}"


def from_mapping(cls: type[_C], data: object, prefix: str | None = None) -> _C:
    """`cls` built from a mapping (a config file, a request body, a block of a config: its
    errors' fields start with `prefix`, by default the class's name); unknown keys are
    errors."""
    prefix = cls.__name__ if prefix is None else prefix
    if not isinstance(data, Mapping):
        raise ConfigError(prefix, "must be a mapping of field names to values", data)
    fields = attrs.fields_dict(cls)  # type: ignore[arg-type]  # an attrs class, by contract
    for key in data:
        if key not in fields:
            raise ConfigError(
                f"{prefix}.{key}",
                unknown_field(key, fields),
                show_value=False,
            )
    for name, field in fields.items():
        if field.default is attrs.NOTHING and name not in data:
            raise ConfigError(f"{prefix}.{name}", "is required", show_value=False)
    return cls(**data)  # keys were checked against the fields above


def fields_of(config: Any) -> dict[str, Any]:
    """A config's fields by name, its blocks (autoscaling, canary, the request policies) as
    plain mappings (or None)."""
    # By names read once a class, not attrs.asdict: a listing of 1,000 backends asks this
    # 2,000 times, and asdict's generic walk was a sixth of it.
    out = {name: getattr(config, name) for name in _field_names(type(config))}
    for name, value in out.items():
        if attrs.has(type(value)):
            out[name] = attrs.asdict(value, value_serializer=_json_lists)
    return out


def block_to_dict(block: Any) -> dict[str, Any]:
    """A config block (a canary's) as JSON data."""
    return attrs.asdict(block, value_serializer=_json_lists)


def _json_lists(instance: object, field: object, value: Any) -> Any:
    """A block's tuples (a canary's steps) as JSON's lists."""
    return list(value) if isinstance(value, tuple) else value


_FIELD_NAMES: dict[type[Any], tuple[str, ...]] = {}


def _field_names(cls: type[Any]) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in attrs.fields(cls))
    return names
