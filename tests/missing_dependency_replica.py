"""A replica module that imports a package no one installed, as one written on another machine
would: its import fails with ModuleNotFoundError inside the user's own code."""

from __future__ import annotations

import no_such_dependency_of_a_replica  # type: ignore[import-not-found]  # missing: the point


class Replica:
    """Never built: its module does not import."""

    value = no_such_dependency_of_a_replica
