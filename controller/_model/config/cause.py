"""Why a change was made: who asked (a Python call, the API, the CLI, the console, the
controller itself), from which manifest, with what message; checked as a config is."""

from __future__ import annotations

import re
from typing import Literal

import attrs

from ..values.errors import ConfigError

#: Who asked: a Python call, the HTTP API, the CLI (through the API), or the controller itself
#: (an automatic rollback, a revision recorded at recovery).
Via = Literal["python", "api", "cli", "console", "controller"]
VIA: tuple[Via, ...] = ("python", "api", "cli", "console", "controller")

MAX_MESSAGE = 1000
MAX_MANIFEST = 4096
_PRINTABLE = re.compile(r"[^\x00-\x1f\x7f]*")
_HEX = re.compile(r"[0-9a-f]{1,128}")


def _via(value: object) -> Via:
    for choice in VIA:
        if value == choice and isinstance(value, str):
            return choice
    raise ConfigError(
        "cause.via", 'must be "python", "api", "cli", "console" or "controller"', value
    )


def _text(field: str, limit: int, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit or not _PRINTABLE.fullmatch(value):
        raise ConfigError(
            f"cause.{field}", f"must be text of at most {limit} characters, one line", value
        )
    return value


def _message(value: object) -> str | None:
    return _text("message", MAX_MESSAGE, value)


def _manifest(value: object) -> str | None:
    return _text("manifest", MAX_MANIFEST, value)


def _hex(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _HEX.fullmatch(value):
        raise ConfigError("cause.manifest_digest", "must be lowercase hex, at most 128", value)
    return value


@attrs.frozen
class Cause:
    """Why a revision was made: who asked, from which manifest, with what message."""

    via: Via = attrs.field(default="python", converter=_via)
    """A Python call, the HTTP API, the CLI, or the controller itself."""
    message: str | None = attrs.field(default=None, converter=_message)
    """What the person said of the change (``--message``)."""
    manifest: str | None = attrs.field(default=None, converter=_manifest)
    """The manifest file it was applied from, if any."""
    manifest_digest: str | None = attrs.field(default=None, converter=_hex)
    """The sha256 of that file's bytes, as sent."""
