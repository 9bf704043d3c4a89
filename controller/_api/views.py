"""The daemon's JSON views of status and snapshots (for the API, the CLI and the watch)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import attrs
import trio

from .._clock import wall_now
from .._core.desk import Applied
from .._model.config.cause import Cause
from .._model.config.last_applied import BackendDiff
from .._model.config.manifest import BackendDecl, config_to_dict
from .._model.decisions.autoscale import ScaleDecision
from .._model.decisions.canary_steps import CanaryStatus, RevisionNumbers
from .._model.records.revisions import Revision
from .._model.views.status import AutoscalerStatus, BackendSnapshot, BackendStatus, RolloutStatus


def iso(wall_time: float | None) -> str | None:
    """Seconds since the epoch as ISO 8601, UTC, to the millisecond."""
    if wall_time is None:
        return None
    # Rounded to whole milliseconds, as the store keeps them: the same event reads the same
    # before and after a restart.
    ms = round(wall_time * 1000)
    moment = datetime.fromtimestamp(ms // 1000, UTC).replace(microsecond=ms % 1000 * 1000)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- JSON views --


def status_json(status: BackendStatus, *, summary: bool = False) -> dict[str, Any]:
    """A backend's status; a `summary` leaves out its replicas and events (a listing of many
    backends needs their counts, which stay)."""
    version = status.version
    counts: dict[str, int] = {}
    counts_by_version: dict[str, dict[str, int]] = {}
    for (replica_version, state), n in status.counts_by_version.items():
        counts[state.value] = counts.get(state.value, 0) + n
        counts_by_version.setdefault(replica_version, {})[state.value] = n
    now = wall_now()
    out: dict[str, Any] = {
        "name": status.name,
        "state": status.state.value,
        "reason": status.reason,
        "message": status.message,
        "generation": status.generation,
        "observed_generation": status.observed_generation,
        "deleting": status.deleting,
        "goal_done": status.goal_done,
        "last_error": status.last_error,
        "last_traceback": status.last_traceback,
        "desired": status.desired_replicas,
        "version": version,
        # Those that serve: a replica failing its health checks is out of routing, and of these.
        "ready": status.ready,
        "ready_of_version": status.serving.get(version, 0),
        "config": BackendDecl(status.name, status.backend_config, status.replica_config).to_dict(),
        "counts": counts,
        "counts_by_version": counts_by_version,
        "load": {
            "in_flight": status.load.in_flight,
            "queued": status.load.queued,
            "replicas": dict(status.load.replicas),
            "sources": status.load.sources,
            "self_reported": status.load.self_reported,
            "served": dict(status.load.served),
            "models": {tag: m.to_json() for tag, m in sorted(status.load.models.items())},
            "batches": {
                tag: [b.to_json() for b in batches]
                for tag, batches in sorted(status.load.batches.items())
            },
        },
        "autoscaler": _autoscaler_json(status.autoscaler, now),
        "rollout": rollout_json(status.rollout),
    }
    if not summary:
        out["replicas"] = [
            {
                "tag": r.tag,
                "state": r.state.value,
                "version": r.version,
                "address": r.address,
                "healthy": r.healthy,
                "pid": r.pid,
                "node": r.node,
                "created_at": iso(r.created_at),
                "age_s": None if r.created_at is None else round(max(0.0, now - r.created_at), 3),
            }
            for r in status.replicas
        ]
        out["events"] = [
            {"time": iso(e.wall_time), "kind": e.kind, "message": e.message} for e in status.events
        ]
        out["failed_starts"] = [
            {
                "replica": f.tag,
                "version": f.version,
                "time": iso(f.wall_time),
                "error": f.error,
                "error_type": f.error_type,
                "message": f.message,
                "traceback": f.traceback,
            }
            for f in status.failed_starts
        ]
    return out


def rollout_json(rollout: RolloutStatus | None) -> dict[str, Any] | None:
    if rollout is None:
        return None
    return {
        "revision": rollout.revision,
        "current_revision": rollout.current_revision,
        "outcome": rollout.outcome,
        "paused": rollout.paused,
        "pending_revision": rollout.pending_revision,
        "error": rollout.error,
        "restores": rollout.restores,
        "automatic": rollout.automatic,
        "canary": canary_json(rollout.canary),
    }


def canary_json(canary: CanaryStatus | None) -> dict[str, Any] | None:
    if canary is None:
        return None

    def numbers(n: RevisionNumbers) -> dict[str, Any]:
        return {
            "version": n.version,
            "requests": n.requests,
            "errors": n.errors,
            "error_rate": round(n.error_rate, 6),
            "p99_s": None if n.p99_s is None else round(n.p99_s, 6),
        }

    return {
        "revision": canary.revision,
        "stable_revision": canary.stable_revision,
        "phase": canary.phase,
        "step": canary.step,
        "steps": canary.steps,
        "weight": canary.weight,
        "pause_s": canary.pause_s,
        "elapsed_s": None if canary.elapsed_s is None else round(canary.elapsed_s, 3),
        "step_started": iso(canary.step_started),
        "canary": numbers(canary.canary),
        "stable": numbers(canary.stable),
        "verdict": canary.verdict,
        "gates": canary.gates,
    }


def cause_json(cause: Cause) -> dict[str, Any]:
    """Why a revision was made (a backend's, an application's)."""
    return {
        "via": cause.via,
        "message": cause.message,
        "manifest": cause.manifest,
        "manifest_digest": cause.manifest_digest,
    }


def revision_json(revision: Revision, *, current: bool) -> dict[str, Any]:
    """One revision, as ``GET /api/v1/backends/{name}/revisions`` lists it; `current`: it is
    the one the backend rolls out, or runs (its status's ``rollout.revision``)."""
    content = revision.content
    cause = revision.cause
    code = revision.code
    return {
        "number": revision.number,
        "version": revision.version,
        "digest": revision.digest,
        "created_at": iso(revision.created_at),
        "cause": cause_json(cause),
        "code": (
            None
            if code is None
            else {"module": code.module, "digest": code.digest, "files": code.files}
        ),
        "code_changed": revision.code_changed,
        "same_version": list(revision.same_version),
        "outcome": revision.outcome,
        "error": revision.error,
        "good": revision.good,
        "restores": revision.restores,
        "restarts": revision.restarts,
        "automatic": revision.automatic,
        "canary_of": revision.canary_of,
        "canary_skipped": revision.canary_skipped,
        "current": current,
        # What its replicas run, in the fields a deploy names them by: what an undo brings back.
        "config": {
            **config_to_dict(content.replica_config),
            "version": content.version,
            "user_config": content.user_config,
            "resources": dict(content.resources),
        },
    }


def _autoscaler_json(scaler: AutoscalerStatus | None, now: float) -> dict[str, Any] | None:
    if scaler is None:
        return None
    config = scaler.config
    return {
        "min_replicas": config.min_replicas,
        "max_replicas": config.max_replicas,
        "target_ongoing_requests": config.target_ongoing_requests,
        "target": scaler.target,
        "capped_at": scaler.capped_at,
        "last": _decision_json(scaler.last, now),
        "last_change": _decision_json(scaler.last_change, now),
    }


def _decision_json(decision: ScaleDecision | None, now: float) -> dict[str, Any] | None:
    if decision is None:
        return None
    return {
        # Decisions are timed on the trio clock: put on the wall clock for people.
        "time": iso(now - (trio.current_time() - decision.at)),
        "ongoing": decision.ongoing,
        "not_ready": decision.not_ready,
        "previous": decision.previous,
        "recommended": decision.recommended,
        "target": decision.target,
        "reason": decision.reason,
    }


def snapshot_json(snapshot: BackendSnapshot) -> dict[str, Any]:
    return {
        "name": snapshot.name,
        "snapshot_id": snapshot.snapshot_id,
        "exists": snapshot.exists,
        "deleting": snapshot.deleting,
        "config": (
            None if snapshot.backend_config is None else config_to_dict(snapshot.backend_config)
        ),
        "replicas": [
            {"tag": r.tag, "version": r.version, "address": r.address} for r in snapshot.replicas
        ],
        "traffic": None if snapshot.traffic is None else attrs.asdict(snapshot.traffic),
        "version": snapshot.version,
        "held": {tag: held.header().decode() for tag, held in sorted(snapshot.held.items())},
    }


def diff_json(diffs: Sequence[BackendDiff]) -> dict[str, Any]:
    """What ``apply/diff`` answers: each backend's action, and each field it would change."""
    return {
        "backends": [
            {
                "name": d.name,
                "action": d.action,
                "fields": {f: {"now": now, "then": then} for f, (now, then) in d.fields.items()},
                "same_version": list(d.same_version),
            }
            for d in diffs
        ]
    }


def applied_json(applied: Applied, code_changed: dict[str, bool | None]) -> dict[str, Any]:
    """What an apply answers: each backend of the manifest, its generation, whether the apply
    changed it and whether its code on disk did, and the backends it deleted."""
    return {
        "applied": [
            {
                "name": name,
                "generation": goal.generation,
                "changed": name in applied.changed,
                "code_changed": code_changed.get(name),
                "same_version": list(applied.same_version.get(name, ())),
            }
            for name, goal in applied.goals.items()
        ],
        "deleted": [
            {"name": name, "generation": goal.generation} for name, goal in applied.deleted.items()
        ],
    }
