"""A manifest applied by a controller: each backend it declares merged with what a manifest
applied to it last and with its live configs, as ``kubectl apply`` merges (``last_applied``),
under the name's lock on the spec desk; or what that would change, field by field."""

from __future__ import annotations

import functools

import attrs

from .._backend.turns import take_turns
from .._model.config.cause import Cause
from .._model.config.config import BackendConfig
from .._model.config.last_applied import BackendDiff, applied_text, diff_of, merged
from .._model.config.manifest import BackendDecl, Manifest
from .._model.config.replica_config import ReplicaConfig
from .._model.decisions.spec import Spec, check_declared
from .._model.decisions.steering import asked
from .._model.records.revisions import content_of, started_differently
from .._model.values.errors import ConfigError
from .desk import Also, Applied, SpecDesk


async def apply(
    desk: SpecDesk,
    manifest: Manifest,
    *,
    prune: bool,
    cause: Cause | None,
    also: Also | None = None,
) -> Applied:
    """The backends `manifest` declares, all of them or none (the caller holds its apply
    lock); `also` writes its applications' records in the same batch."""
    # Merged under each name's lock (the desk calls `_merge` with the spec it holds).
    wanted = {d.name: functools.partial(_merge, desk, d) for d in manifest.backends}
    applied = {}
    for decl in manifest.backends:
        applied[decl.name] = applied_text(decl)
        await take_turns(len(applied))
    return await desk.change_specs(wanted, prune=prune, cause=cause, applied=applied, also=also)


async def preview(desk: SpecDesk, manifest: Manifest, *, prune: bool) -> list[BackendDiff]:
    """What `apply` would change now; nothing is written."""
    diffs = []
    for decl in manifest.backends:
        spec = desk.spec(decl.name)
        live = _live(desk, decl.name, spec)
        after = _merge(desk, decl, spec)
        diff = diff_of(decl.name, live, after)
        if live is not None:
            same = started_differently(content_of(*live), content_of(*after))
            diff = attrs.evolve(diff, same_version=same)
        diffs.append(diff)
        await take_turns(len(diffs))
    if prune:
        named = set(manifest.names)
        for name in sorted(desk.backends):
            spec = desk.spec(name)
            if name not in named and spec is not None and not spec.deleting:
                diffs.append(BackendDiff(name, "deleted"))
    return diffs


def _merge(
    desk: SpecDesk, decl: BackendDecl, spec: Spec | None
) -> tuple[BackendConfig, ReplicaConfig]:
    try:
        configs = merged(decl, None if spec is None else spec.applied, _live(desk, decl.name, spec))
    except ConfigError as exc:
        # The file alone was valid: a value it keeps from the live config breaks a rule.
        raise ConfigError(
            f"backend {decl.name!r}: {exc.field}",
            f"{exc.rule}; with the live values of the fields the file does not change",
            exc.value,
        ) from None
    check_declared(decl.name, *configs)
    return configs


def _live(
    desk: SpecDesk, name: str, spec: Spec | None
) -> tuple[BackendConfig, ReplicaConfig] | None:
    """The configs last asked of `name`, unless it has none or is being deleted."""
    return None if spec is None or spec.deleting else asked(spec, desk.book(name))
