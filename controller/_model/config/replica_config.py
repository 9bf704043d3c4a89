"""How to build one replica: which class, constructed with which arguments (validated)."""

from __future__ import annotations

import re
from collections.abc import Mapping

import attrs

from ..values.errors import ConfigError
from ..values.fields import from_mapping, schema
from ..values.json_values import JSON, JSON_RULE, check_json

# Patterns in ASCII, spelled out, as the API's document (JSON Schema) says them too.
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = rf"{_IDENTIFIER}(?:\.{_IDENTIFIER})*"
ENTRYPOINT_PATTERN = rf"{_DOTTED}:{_DOTTED}"
_ENTRYPOINT = re.compile(ENTRYPOINT_PATTERN)
_KEYWORD = re.compile(_IDENTIFIER)


def _entrypoint(value: object) -> str:
    if not isinstance(value, str) or not _ENTRYPOINT.fullmatch(value):
        raise ConfigError(
            "ReplicaConfig.entrypoint", 'must look like "package.module:Class"', value
        )
    return value


def _init_args(value: object) -> tuple[JSON, ...]:
    if not isinstance(value, (list, tuple)):
        raise ConfigError("ReplicaConfig.init_args", "must be a list of JSON values", value)
    return tuple(check_json(f"ReplicaConfig.init_args[{i}]", v) for i, v in enumerate(value))


def _init_kwargs(value: object) -> dict[str, JSON]:
    if not isinstance(value, Mapping):
        raise ConfigError("ReplicaConfig.init_kwargs", "must be a mapping of str to JSON", value)
    out: dict[str, JSON] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not _KEYWORD.fullmatch(key):
            raise ConfigError(
                "ReplicaConfig.init_kwargs", "keys must be ASCII Python identifiers", key
            )
        out[key] = check_json(f"ReplicaConfig.init_kwargs[{key!r}]", item)
    return out


@attrs.frozen
class ReplicaConfig:
    """How to build one replica: which class, constructed with which arguments."""

    entrypoint: str = attrs.field(
        converter=_entrypoint, metadata=schema(type="string", pattern=f"^{ENTRYPOINT_PATTERN}$")
    )
    """The replica class, as ``"package.module:Class"``."""

    init_args: tuple[JSON, ...] = attrs.field(
        default=(),
        kw_only=True,
        converter=_init_args,
        metadata=schema(type="array", items={"description": JSON_RULE}),
    )
    """Positional arguments for the class (JSON values)."""

    init_kwargs: dict[str, JSON] = attrs.field(
        factory=dict,
        kw_only=True,
        converter=_init_kwargs,
        metadata=schema(
            type="object",
            propertyNames={"pattern": f"^{_IDENTIFIER}$"},
            additionalProperties={"description": JSON_RULE},
        ),
    )
    """Keyword arguments for the class (JSON values)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ReplicaConfig:
        """Build from a mapping (a config file, a request body); unknown keys are errors."""
        return from_mapping(cls, data)
