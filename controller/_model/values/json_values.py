"""JSON values: the type, a validator that names the offending path, and a stable digest."""

from __future__ import annotations

import hashlib
import json
import math
from typing import TypeAlias

from .errors import ConfigError

JSON: TypeAlias = bool | int | float | str | list["JSON"] | dict[str, "JSON"] | None

#: How deep lists and objects may nest in a config: far beyond any real config, and far within
#: what Python's recursion (here and in json) allows.
MAX_JSON_DEPTH = 64
# Beyond what JSON Schema can say (and so not checked by the document's tools): the server
# refuses both with a 422 naming the rule.
JSON_RULE = (
    f"any JSON value, with lists and objects nested at most {MAX_JSON_DEPTH} deep and numbers "
    "that a double holds (1e400 is not)"
)


def check_json(field: str, value: object) -> JSON:
    """Return `value` if it is plain JSON; otherwise raise ConfigError naming the path inside it."""
    try:
        _check(field, value, 0)
    except _TooDeep:
        # Named by its field alone: the path down to the culprit would be 64 steps long.
        rule = f"must nest lists and objects at most {MAX_JSON_DEPTH} deep"
        raise ConfigError(field, rule, show_value=False) from None
    return value  # type: ignore[return-value]  # checked structurally just above


class _TooDeep(Exception):
    pass


def _check(path: str, value: object, depth: int) -> None:
    if value is None or isinstance(value, (bool, int, str)):
        return
    if depth >= MAX_JSON_DEPTH and isinstance(value, (list, tuple, dict)):
        raise _TooDeep
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(path, "must be JSON: NaN and infinities are not", value)
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check(f"{path}[{i}]", item, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(
                    path, f"must be JSON: object keys are strings, not {key!r}", value
                )
            _check(f"{path}[{key!r}]", item, depth + 1)
        return
    raise ConfigError(
        path,
        f"must be JSON (dict with str keys, list, str, int, float, bool or None), "
        f"not {type(value).__name__}",
        value,
    )


def canonical(value: JSON) -> str:
    """One text per value, whatever the key order, so equal configs compare and hash equal."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def digest(value: JSON) -> str:
    """A short stable fingerprint of a JSON value (used to tell user configs apart)."""
    return hashlib.sha256(canonical(value).encode()).hexdigest()[:16]
