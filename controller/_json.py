"""JSON values: the type, a validator that names the offending path, and a stable digest."""

from __future__ import annotations

import hashlib
import json
import math
from typing import TypeAlias

from ._errors import ConfigError

JSON: TypeAlias = bool | int | float | str | list["JSON"] | dict[str, "JSON"] | None


def check_json(field: str, value: object) -> JSON:
    """Return `value` if it is plain JSON; otherwise raise ConfigError naming the path inside it."""
    _check(field, value)
    return value  # type: ignore[return-value]  # checked structurally just above


def _check(path: str, value: object) -> None:
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(path, "must be JSON: NaN and infinities are not", value)
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check(f"{path}[{i}]", item)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(
                    path, f"must be JSON: object keys are strings, not {key!r}", value
                )
            _check(f"{path}[{key!r}]", item)
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
