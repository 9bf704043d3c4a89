"""Code pinning: what an entrypoint's source was when a revision was recorded (its digest is
read by ``controller._sources``, which finds the module without importing it)."""

from __future__ import annotations

import attrs


@attrs.frozen
class CodeDigest:
    """What an entrypoint's code was when a revision was recorded."""

    module: str
    """The entrypoint's module name, e.g. ``"pkg.sub.module"``."""
    digest: str
    """Hex SHA-256 over the files' relative paths and contents (64 characters)."""
    files: int
    """How many files went into `digest`."""
