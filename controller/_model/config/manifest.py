"""Backends declared as data: a TOML (or JSON) file (read by ``controller._sources``), or the
body of an apply request.

Each backend is one table of ``BackendConfig`` and ``ReplicaConfig`` fields side by side::

    [backends.echo]
    entrypoint = "echo_replica:Echo"
    init_kwargs = { work_ms = 5 }
    num_replicas = 2
    version = "v1"
    user_config = { greeting = "hello" }

Everything is checked before anything is applied, and every fault is reported at once, each with
its source, backend and field.
"""

from __future__ import annotations

import difflib
from collections.abc import Generator, Mapping
from typing import Any

import attrs

from ..values.errors import ConfigError, ManifestError
from ..values.fields import fields_of, unknown_field
from ..values.json_values import JSON
from .applications import AppDecl, parse_applications
from .autoscaling import problems_of
from .config import BackendConfig, check_backend_name
from .policies import POLICY_BLOCKS, policy_problems
from .replica_config import ReplicaConfig

_BACKEND_FIELDS = frozenset(attrs.fields_dict(BackendConfig))
_REPLICA_FIELDS = frozenset(attrs.fields_dict(ReplicaConfig))
_KNOWN_FIELDS = _BACKEND_FIELDS | _REPLICA_FIELDS
#: The largest manifest file: what the API takes in one request body.
MAX_MANIFEST_BYTES = 1 << 20


@attrs.frozen
class BackendDecl:
    """One declared backend."""

    name: str
    backend_config: BackendConfig
    replica_config: ReplicaConfig
    given: frozenset[str] = attrs.field(default=frozenset(), eq=False)
    """The fields its file or request set (the others are at their defaults): what an apply
    merges (see ``last_applied``). Not part of its equality: two files that declare the same
    configs declare the same backend."""

    def to_dict(self) -> dict[str, JSON]:
        """The flat form a file or a request body uses."""
        return {**config_to_dict(self.backend_config), **config_to_dict(self.replica_config)}


@attrs.frozen
class Manifest:
    """Declared backends, by name, and the applications that group some of them."""

    backends: tuple[BackendDecl, ...]
    applications: tuple[AppDecl, ...] = ()

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.backends]

    def with_application_canaries(self) -> Manifest:
        """Each application's canary block given to its members that set none of their own
        (``ConfigError`` if one breaks a member's rules)."""
        canary = {m: a for a in self.applications if a.canary is not None for m in a.members}
        # The entry's verdict is the application's: its requests cross every member.
        if not canary:
            return self
        backends = []
        for decl in self.backends:
            app = canary.get(decl.name)
            if app is not None and "canary" not in decl.given:
                block = app.canary
                if block is not None and decl.name != app.entry:
                    block = attrs.evolve(block, follows=app.entry)
                try:
                    config = attrs.evolve(decl.backend_config, canary=block)
                except ConfigError as exc:
                    raise ConfigError(
                        f"applications.{app.name}.canary", f"for backend {decl.name!r}: {exc}"
                    ) from None
                decl = attrs.evolve(decl, backend_config=config, given=decl.given | {"canary"})
            backends.append(decl)
        return attrs.evolve(self, backends=tuple(backends))


def config_to_dict(config: BackendConfig | ReplicaConfig) -> dict[str, JSON]:
    """A config as JSON data, every field included (defaults too: they are part of the spec)."""
    out: dict[str, JSON] = {}
    for name, value in fields_of(config).items():
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


def parse_manifest(data: object, source: str, *, check_routes: bool = True) -> Manifest:
    """Check a manifest given as data: ``{"backends": {name: {field: value}}}``, and
    ``"applications"`` grouping some of them (``applications.AppDecl``). Without
    `check_routes`, two backends with one route are left for the controller to refuse as a
    conflict (``RouteConflictError``), as the API does: each backend is valid alone."""
    steps = manifest_steps(data, source, check_routes=check_routes)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            manifest: Manifest = done.value
            return manifest


#: How many backends `manifest_steps` checks between two steps.
BACKENDS_A_STEP = 64


def manifest_steps(
    data: object, source: str, *, check_routes: bool = True
) -> Generator[None, None, Manifest]:
    """`parse_manifest` in steps: it yields after every `BACKENDS_A_STEP` backends, so that a
    loop can take its turns between them (thousands take ~0.1 ms each), and returns the
    manifest."""
    if not isinstance(data, Mapping):
        raise ManifestError(source, ["must be a table with a 'backends' table in it"])
    problems: list[str] = []
    for key in data:
        if key not in ("backends", "applications"):
            near = difflib.get_close_matches(str(key), ["backends", "applications"], n=1)
            hint = (
                f"did you mean '{near[0]}'?"
                if near
                else "the keys are 'backends' and 'applications'"
            )
            problems.append(f"{key}: unknown top-level key; {hint}")
    backends = data.get("backends", {})
    if not isinstance(backends, Mapping):
        problems.append("backends: must be a table of backend name to its fields")
        backends = {}
    decls = []
    routes: dict[str, str] = {}
    for name, fields in backends.items():
        decl, found = parse_backend(name, fields)
        problems.extend(found)
        if decl is None:
            continue
        decls.append(decl)
        if len(decls) % BACKENDS_A_STEP == 0:
            yield
        route = decl.backend_config.route_prefix
        if check_routes and route is not None and route in routes:
            problems.append(
                f"backend {name!r}: route_prefix: {route!r} is backend {routes[route]!r}'s "
                "route too; each route leads to one backend"
            )
        elif route is not None:
            routes[route] = decl.name
    applications: tuple[AppDecl, ...] = ()
    if "applications" in data:
        applications, found = parse_applications(data["applications"], backends)
        problems.extend(found)
    if problems:
        raise ManifestError(source, problems)
    return Manifest(tuple(decls), applications)


def parse_backend(name: object, fields: object) -> tuple[BackendDecl | None, list[str]]:
    """One backend's fields, checked one by one, so that every fault is found at once; then
    together, for the rules that tie fields to each other."""
    problems: list[str] = []
    label = f"backend {name!r}"
    try:
        check_backend_name(name)
    except ConfigError as exc:
        problems.append(f"{label}: {_rule(exc)}")
    if not isinstance(fields, Mapping):
        return None, [*problems, f"{label}: must be a table of fields"]
    for key in fields:
        if key not in _BACKEND_FIELDS and key not in _REPLICA_FIELDS:
            problems.append(f"{label}: {key}: {unknown_field(key, _KNOWN_FIELDS)}")
    if "entrypoint" not in fields:
        problems.append(f"{label}: entrypoint: is required")
    for key, value in fields.items():
        if key == "autoscaling" and isinstance(value, Mapping):
            for fault in problems_of(value):
                problems.append(f"{label}: {_field(fault)}: {_rule(fault)}")
            continue
        if key in POLICY_BLOCKS and isinstance(value, Mapping):
            for fault in policy_problems(key, value):
                problems.append(f"{label}: {_field(fault)}: {_rule(fault)}")
            continue
        try:
            if key in _BACKEND_FIELDS:
                BackendConfig.from_dict({key: value})
            elif key == "entrypoint":
                ReplicaConfig.from_dict({key: value})
            elif key in _REPLICA_FIELDS:
                ReplicaConfig.from_dict({"entrypoint": "m:C", key: value})
        except ConfigError as exc:
            problems.append(f"{label}: {_field(exc)}: {_rule(exc)}")
    if problems:
        return None, problems
    backend: dict[str, Any] = {k: v for k, v in fields.items() if k in _BACKEND_FIELDS}
    replica: dict[str, Any] = {k: v for k, v in fields.items() if k in _REPLICA_FIELDS}
    try:
        decl = BackendDecl(
            str(name),
            BackendConfig.from_dict(backend),
            ReplicaConfig.from_dict(replica),
            frozenset(map(str, fields)),
        )
    except ConfigError as exc:
        return None, [f"{label}: {_field(exc)}: {_rule(exc)}"]
    return decl, []


def _field(exc: ConfigError) -> str:
    # "BackendConfig.num_replicas" -> "num_replicas": the file names fields without the class.
    return exc.field.partition(".")[2] or exc.field


def _rule(exc: ConfigError) -> str:
    return str(exc).partition(": ")[2]
