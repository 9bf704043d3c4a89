"""A backend as others see it: its status and message for people, its snapshot for watchers,
the words of its decisions. Pure functions of what the loop holds."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import final

import attrs

from .._model.config.canary import canary_count
from .._model.decisions.canary_steps import CanaryStatus
from .._model.decisions.census import Census
from .._model.decisions.failures import FailureBook
from .._model.decisions.spec import Spec
from .._model.records.multiplexing import Held
from .._model.records.replica_state import ReplicaState
from .._model.records.revisions import Revision, RevisionBook
from .._model.views.serving import ServingReplicas
from .._model.views.status import (
    AutoscalerStatus,
    BackendLoad,
    BackendReason,
    BackendSnapshot,
    BackendState,
    BackendStatus,
    ReplicaStatus,
    RolloutStatus,
    TrafficSplit,
)
from .goal import Goal
from .history import Journal, plural
from .replica import Replica


@final
@attrs.frozen
class Tally:
    """A backend's replicas counted for its status: by version and state, and how many are
    unhealthy. Read off the census kept as replicas change, so a summary walks none."""

    by_version: Mapping[tuple[str, ReplicaState], int]
    unhealthy: int
    serving: Mapping[str, int]
    """By version, those listed to watchers: running or updating, and healthy."""

    @classmethod
    def of(cls, census: Census, unhealthy: int, serving: Mapping[str, int]) -> Tally:
        by_version: dict[tuple[str, ReplicaState], int] = {}
        for (state, version, _, _), n in census.items():
            by_version[version, state] = by_version.get((version, state), 0) + n
        return cls(by_version, unhealthy, dict(serving))

    @property
    def total(self) -> int:
        return sum(self.by_version.values())


def status_of(
    name: str,
    spec: Spec,
    replicas: Iterable[Replica] | None,
    tally: Tally,
    failures: FailureBook,
    *,
    goal: Goal,
    observed_generation: int,
    converged: bool,
    change: tuple[BackendState, BackendReason],
    journal: Journal,
    load: BackendLoad,
    desired: int | None = None,
    autoscaler: AutoscalerStatus | None = None,
    scaling: tuple[BackendState, BackendReason] | None = None,
    revisions: RevisionBook | None = None,
    canary: CanaryStatus | None = None,
) -> BackendStatus:
    """The frozen status of a backend (``ctl.status(name)``); `desired`: the autoscaler's
    count, if it is autoscaled; `journal` tells its latest error, failed starts and events.
    Without `replicas`, a summary: no replicas, failed starts or events, its counts from the
    `tally` alone."""
    views = tuple(
        ReplicaStatus(r.tag, r.state, r.version, r.address, r.healthy, r.pid, r.node, r.created_at)
        for r in replicas or ()
    )
    state, reason = state_of(
        spec,
        tally.unhealthy == 0,
        failures,
        goal_done=goal.done,
        converged=converged,
        change=change,
        scaling=scaling,
    )
    steps = canary is not None and canary.phase in ("starting", "judging", "held")
    besides = canary.stable.version if canary is not None and steps else None
    message = describe(spec, tally, failures, converged=converged, desired=desired, besides=besides)
    if canary is not None and steps:
        # The replicas of the stable revision are not "older": they serve the rest.
        if state in (BackendState.UPDATING, BackendState.UPSCALING, BackendState.DOWNSCALING):
            # A scale under way scales both revisions: the canary's steps are the news.
            state, reason = BackendState.UPDATING, "Canary"
        # What it runs meanwhile: the stable revision at full strength, and the canary's.
        base = spec.backend_config.num_replicas if desired is None else desired
        count = canary_count(base, canary.weight)
        desired = base + count
        running = {v: n for (v, state_of_them), n in tally.by_version.items() if
                   state_of_them is ReplicaState.RUNNING}  # fmt: skip
        stable = canary.stable.version
        # The counts by version say "older" of the stable revision's: said here instead.
        rest = message.split("; ", 1)[1] if "; " in message else ""
        message = (
            f"canary at {canary.weight:g}% (step {canary.step}/{canary.steps}, {canary.phase}): "
            f"{running.get(spec.version, 0)}/{count} of version {spec.version} beside "
            f"{running.get(stable, 0)}/{base} of version {stable} (stable, revision "
            f"{canary.stable_revision})" + (f"; {rest}" if rest else "")
        )
    return BackendStatus(
        name=name,
        state=state,
        reason=reason,
        message=message,
        generation=spec.generation,
        observed_generation=observed_generation,
        backend_config=spec.backend_config,
        replica_config=spec.replica_config,
        deleting=spec.deleting,
        goal_done=goal.done,
        last_error=journal.last_error,
        replicas=views,
        events=() if replicas is None else tuple(journal.log.events),
        last_traceback=journal.last_traceback,
        failed_starts=() if replicas is None else tuple(journal.failed_starts),
        load=load,
        version=spec.version,
        desired=desired,
        autoscaler=autoscaler,
        rollout=None if revisions is None else rollout_of(spec, revisions, canary),
        tally=tally.by_version if replicas is None else None,
        serving=tally.serving,
    )


def rollout_of(
    spec: Spec, revisions: RevisionBook, canary: CanaryStatus | None = None
) -> RolloutStatus:
    kept = revisions.get(spec.revision)
    current = revisions.current()
    return RolloutStatus(
        revision=spec.revision,
        current_revision=None if current is None else current.number,
        outcome=None if kept is None else kept.outcome,
        paused=spec.paused,
        pending_revision=spec.pending,
        error=None if kept is None else kept.error,
        restores=None if kept is None else kept.restores,
        automatic=kept is not None and kept.automatic,
        canary=canary,
    )


def snapshot_of(
    name: str,
    snapshot_id: int,
    spec: Spec,
    serving: ServingReplicas,
    forgotten: bool,
    traffic: TrafficSplit | None = None,
    held: Mapping[str, Held] | None = None,
) -> BackendSnapshot:
    """What watchers see: the replicas that serve (``ReplicaSet.serving``: a replica has a view
    from its first RUNNING on; of those, the ones stopping and the ones whose latest health
    check failed do not serve). `serving` is immutable: the snapshot holds it as it is, no
    replica copied."""
    deleted = spec.deleting and forgotten
    return BackendSnapshot(
        name,
        snapshot_id,
        None if deleted else spec.backend_config,
        None if deleted else spec.replica_config,
        serving,
        deleting=spec.deleting,
        traffic=None if deleted else traffic,
        version="" if deleted else spec.version,
        held={} if deleted or not held else _of_serving(held, serving),
    )


def _of_serving(held: Mapping[str, Held], serving: ServingReplicas) -> dict[str, Held]:
    tags = {r.tag for r in serving}
    return {tag: said for tag, said in held.items() if tag in tags}


def state_of(
    spec: Spec,
    all_healthy: bool,
    failures: FailureBook,
    *,
    goal_done: bool,
    converged: bool,
    change: tuple[BackendState, BackendReason],
    scaling: tuple[BackendState, BackendReason] | None = None,
) -> tuple[BackendState, BackendReason]:
    """What the backend is doing, in one word, and why. `scaling`: the autoscaler changed its
    count, and the replicas have not caught up yet (a change under way, as a deploy's is)."""
    if spec.deleting:
        return BackendState.DELETING, "Deleting"
    if failures.blocked is not None:
        return BackendState.DEPLOY_FAILED, failures.blocked
    if scaling is not None and goal_done and not converged:
        goal_done, change = False, scaling
    if not goal_done:
        if failures.proven and failures.error is not None:
            # The new version has shown it can start; its replicas keep failing anyway.
            return BackendState.UNHEALTHY, "ReplicaFailures"
        return change
    if converged and all_healthy:
        return BackendState.HEALTHY, "Converged"
    return BackendState.UNHEALTHY, "ReplicaFailures"


def describe(
    spec: Spec,
    tally: Tally,
    failures: FailureBook,
    *,
    converged: bool,
    desired: int | None = None,
    besides: str | None = None,
) -> str:
    """``"2/5 replicas of version b running; 1 starting; 1 failed to start: ValueError: ..."``.
    `besides`: a version that is not older (a canary's stable revision), left out.

    The failure shown is the last of the current generation only: a new deploy's first message
    does not show what went wrong with the one before it.
    """
    if spec.deleting:
        return f"deleting; {plural(tally.total, 'replica')} left"
    version = spec.version
    if desired is None:
        desired = spec.backend_config.num_replicas
    running = older = 0
    others: dict[str, int] = {}
    for (replica_version, state), n in tally.by_version.items():
        if replica_version == besides:
            continue
        if replica_version != version and state is not ReplicaState.STOPPING:
            older += n
        elif state is ReplicaState.RUNNING:
            running += n
        else:
            key = state.value.lower()
            others[key] = others.get(key, 0) + n
    noun = "replica" if desired == 1 else "replicas"
    parts = [f"{running}/{desired} {noun} of version {version} running"]
    parts += [f"{n} {state}" for state, n in sorted(others.items())]
    if older:
        parts.append(f"{older} of {'an older version' if older == 1 else 'older versions'}")
    if tally.unhealthy:
        parts.append(f"{tally.unhealthy} unhealthy")
    if failures.failed_starts:
        parts.append(f"{failures.failed_starts} failed to start: {failures.start_error}")
    if failures.error not in (None, failures.start_error) and not converged:
        parts.append(f"last failure: {failures.error}")
    if failures.blocked == "ReconfigureFailed":
        parts.append("the new user config failed; replicas keep the one before it")
    elif failures.blocked is not None and "until the next deploy" not in parts[-1]:
        parts.append("no new starts until the next deploy")
    if spec.paused:
        parts.append(
            "paused" if spec.pending is None else f"paused, revision {spec.pending} pending"
        )
    return "; ".join(parts)


def classify(
    old: Spec, new: Spec, revision: Revision | None = None
) -> tuple[BackendState, BackendReason]:
    """What kind of change a new spec is, for the status while it is under way (`revision`:
    the new spec's)."""
    if new.deleting:
        return BackendState.DELETING, "Deleting"
    if revision is not None and new.revision != old.revision and revision.restores is not None:
        return BackendState.UPDATING, "RollingBack" if revision.automatic else "Undo"
    if old.deleting or new.version != old.version:
        return BackendState.UPDATING, "NewVersion"
    if new.config_digest != old.config_digest:
        return BackendState.UPDATING, "NewUserConfig"
    if new.backend_config.num_replicas < old.backend_config.num_replicas:
        return BackendState.DOWNSCALING, "ScaleDown"
    return BackendState.UPSCALING, "ScaleUp"


def describe_change(old: Spec, new: Spec) -> str:
    """The event a new spec makes: ``generation 3: 4 replicas of version v2 (was 2 of v1)``."""
    if new.deleting:
        return f"generation {new.generation}: delete{' (forced)' if new.force else ''}"
    revision = "" if new.revision == old.revision else f", revision {new.revision}"
    paused = ""
    if new.paused != old.paused and not new.paused:
        paused = ", resumed"
    elif new.pending != old.pending and new.pending is not None:
        paused = f", revision {new.pending} recorded while paused"
    return (
        f"generation {new.generation}: {plural(new.backend_config.num_replicas, 'replica')} of "
        f"version {new.version}{revision}{paused} (was {old.backend_config.num_replicas} of "
        f"{old.version})"
    )


def describe_new(spec: Spec) -> str:
    """The event a backend's first spec makes."""
    return (
        f"generation {spec.generation}: "
        f"{plural(spec.backend_config.num_replicas, 'replica')} of version {spec.version}"
        f"{'' if spec.revision is None else f', revision {spec.revision}'}"
    )


def describe_pause(spec: Spec) -> str:
    """The event of a pause, or of a resume that rolls nothing out."""
    if spec.paused:
        return f"revision {spec.revision}: later deploys are recorded, not rolled out"
    return f"revision {spec.revision}: deploys roll out again"
