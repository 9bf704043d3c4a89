"""The replica plan of a canary release: the stable revision kept at full strength beside the
canary's replicas for its weight. Pure: it splits the replicas by version and asks
``reconcile.decide`` of each part.

The canary's part is plain scaling to its count. The rest is a rolling update toward the stable
revision: replicas of any third version (a canary superseded by this one) go as the stable
revision's replace them, under the surge and unavailability limits. A failed canary blocks and
halts only its own part: the stable revision goes on replacing what dies.
"""

from __future__ import annotations

from collections.abc import Collection

import attrs

from .reconcile import Plan, ReplicaView, Target, decide


@attrs.frozen
class CanarySplit:
    """What the plan keeps during a canary."""

    stable_version: str
    stable_digest: str
    """The stable revision's user config digest (what its replicas hold)."""
    count: int
    """Replicas of the canary: its weight's share, at least one (0 once aborted)."""


def decide_split(target: Target, split: CanarySplit, replicas: Collection[ReplicaView]) -> Plan:
    """The plan for `target` (the canary's revision, `num_replicas` the backend's count) with
    `split`: `start` counts the canary's starts, `start_stable` the stable revision's."""
    ours = [r for r in replicas if r.version == target.version]
    rest = [r for r in replicas if r.version != target.version]
    canary = decide(attrs.evolve(target, num_replicas=split.count), ours)
    stable_target = attrs.evolve(
        target,
        version=split.stable_version,
        config_digest=split.stable_digest,
        starts_blocked=False,
        halted=False,
    )
    stable = decide(stable_target, rest)
    return Plan(
        start=canary.start,
        start_stable=stable.start,
        stop=canary.stop + stable.stop,
        # The stable part hands no config: its replicas keep the stable revision's.
        reconfigure=canary.reconfigure,
        converged=canary.converged and stable.converged,
    )
