"""The decision step: given what a backend should be and what its replicas are, what to do now.

A pure function: no I/O, no clock, no trio. The backend task applies events to its replicas, asks
``decide`` for a plan, checkpoints the plan's intent, then carries it out.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Protocol

import attrs

from ..records.replica_state import ReplicaState
from .census import Census, Counted


class ReplicaView(Counted, Protocol):
    """What the decision reads of one replica: what the census counts (state, version, config
    digest, served), and what picking some of them needs."""

    @property
    def tag(self) -> str: ...
    @property
    def healthy(self) -> bool:
        """False while its latest health check failed."""
        ...

    @property
    def seq(self) -> int:
        """Start order within the backend: larger started later."""
        ...

    @property
    def node(self) -> str | None:
        """The node it runs on, once its runtime has said."""
        ...


@attrs.frozen
class Target:
    """What the backend should converge to."""

    num_replicas: int
    version: str
    config_digest: str
    max_surge: int = 1
    """Replicas allowed above `num_replicas` during an update (a resolved count)."""
    max_unavailable: int = 0
    """Of `num_replicas`, how many may be unavailable during an update (a resolved count)."""
    deleting: bool = False
    starts_blocked: bool = False
    """The deploy failed: start nothing new, and replace no serving replica, until the next one."""
    halted: bool = False
    """The deploy failed in its rollout (not a spec found too large at recovery): its starts
    under way stop too."""
    starts_deferred: bool = False
    """Backing off after a failure: start nothing now (a timer wakes the backend later)."""
    evict: frozenset[str] = frozenset()
    """Nodes being drained: their replicas are replaced elsewhere first (make before break),
    then stopped, never leaving fewer than `num_replicas` - `max_unavailable` available."""
    evict_now: frozenset[str] = frozenset()
    """Nodes whose drain deadline has passed: their replicas stop now, whatever is available."""
    pack: bool = False
    """Placement packs: a scale-down empties the nodes with the fewest of the backend first
    (else it takes from the nodes with the most)."""


def resolve_limits(num_replicas: int, max_surge: float, max_unavailable: float) -> tuple[int, int]:
    """Counts from a config's limits: ints are counts, floats fractions (surge rounds up,
    unavailable down, as Kubernetes does). Never both 0, or an update could not proceed."""
    surge = max_surge if isinstance(max_surge, int) else math.ceil(max_surge * num_replicas)
    unavailable = (
        max_unavailable
        if isinstance(max_unavailable, int)
        else math.floor(max_unavailable * num_replicas)
    )
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


@attrs.frozen
class Plan:
    """What to do now. Stops are listed in the order they should go."""

    start: int = 0
    """How many new replicas of the target version to start."""
    start_stable: int = 0
    """During a canary release: how many replicas of the stable revision to start."""
    stop: tuple[str, ...] = ()
    reconfigure: tuple[str, ...] = ()
    """RUNNING replicas of the target version to hand the new user config now."""
    converged: bool = False
    """The backend is exactly what the target asks: nothing starting, stopping or outdated."""


def stop_order(replicas: Sequence[ReplicaView], version: str) -> list[ReplicaView]:
    """`replicas` sorted so that the first should be stopped first: those not started yet (or
    never ready before a restart), then unhealthy ones, then older versions, then the rest;
    within each, the most recently started first."""

    return sorted(replicas, key=lambda r: (_rank(r, version), -r.seq))


def _rank(r: ReplicaView, version: str) -> int:
    """``stop_order``'s rank of `r`: 0 first, 3 (ready, healthy, of `version`) last."""
    # A replica being adopted that had served may be serving still: not "unconfirmed".
    if r.state is ReplicaState.STARTING or (r.state is ReplicaState.RECOVERING and not r.served):
        return 0
    if not r.healthy:
        return 1
    return 2 if r.version != version else 3


def excess_order(
    replicas: Sequence[ReplicaView], version: str, count: int, *, pack: bool = False
) -> list[ReplicaView]:
    """The `count` of `replicas` a scale-down stops, in order: ``stop_order``'s ranks first,
    and among the healthy replicas of `version`, one at a time from the node with the most
    replicas left (spread, so the backend stays spread) or the fewest (pack, so whole nodes
    empty); a node not known yet counts as a node of its own."""
    ordered = stop_order(replicas, version)
    if count <= 0:
        return []
    chosen: list[ReplicaView] = []
    settled: list[ReplicaView] = []
    for r in ordered:
        (settled if _rank(r, version) == 3 else chosen).append(r)
    if count <= len(chosen):
        return chosen[:count]
    by_node: dict[str | None, list[ReplicaView]] = {}
    for r in settled:  # newest first within a node, as stop_order has them
        by_node.setdefault(r.node, []).append(r)
    left = count - len(chosen)
    while left > 0 and by_node:
        # Few nodes, and a scale-down's count is what it is: a scan per stop is cheap enough.
        pick = (min if pack else max)(by_node, key=lambda node: len(by_node[node]))
        group = by_node[pick]
        chosen.append(group.pop(0))
        if not group:
            del by_node[pick]
        left -= 1
    return chosen


def decide(target: Target, replicas: Collection[ReplicaView], census: Census | None = None) -> Plan:
    """The plan that moves `replicas` toward `target`. `census` counts them (``Census.of``
    if not given): when the counts are enough to decide, no replica is looked at."""
    settled = _settled(target, census if census is not None else Census.of(replicas))
    if settled is not None:
        return settled
    return _walked(target, replicas)


def _settled(target: Target, census: Census) -> Plan | None:
    """The plan, from the counts alone, for a backend with one version and one config: it
    starts what is missing, or nothing (what `_walked` gives there too). None when replicas
    must be picked: some to stop (too many, an older version, a delete, a halt), or to
    reconfigure."""
    if target.deleting or target.halted or target.evict or target.evict_now:
        return None  # (a drain is rare: its backends' replicas are walked meanwhile)
    stopping, running = ReplicaState.STOPPING, ReplicaState.RUNNING
    version, digest = target.version, target.config_digest
    n_stopping = current = settled = 0
    for (state, v, d, _), n in census.items():
        if v != version:
            return None  # an older version, here or on its way out: a rollout
        if state is stopping:
            n_stopping += n
            continue
        current += n
        if state is running:
            if d != digest:
                return None  # to reconfigure
            settled += n
    if current > target.num_replicas:
        return None  # too many: which to stop is picked by walking
    can_start = not (target.starts_blocked or target.starts_deferred)
    start = target.num_replicas - current if can_start else 0
    converged = n_stopping == 0 and start == 0 and settled == current == target.num_replicas
    return Plan(start=start, converged=converged)


def _walked(target: Target, replicas: Collection[ReplicaView]) -> Plan:
    """The plan, looking at every replica."""
    # Single passes and identity checks on the states (an Enum's hash is Python code; `in
    # frozenset` would call it).
    running, updating, stopping = ReplicaState.RUNNING, ReplicaState.UPDATING, ReplicaState.STOPPING
    recovering = ReplicaState.RECOVERING
    current: list[ReplicaView] = []
    old: list[ReplicaView] = []
    n_stopping = 0
    old_stopping = False  # an older version is still on its way out: the update goes on
    evict, evict_now = target.evict, target.evict_now
    evicted: list[ReplicaView] = []  # of the target version, on a node being drained
    forced: list[ReplicaView] = []  # on a node whose drain deadline has passed
    for r in replicas:
        if r.state is stopping:
            n_stopping += 1
            if r.version != target.version:
                old_stopping = True
        elif evict_now and r.node in evict_now:
            forced.append(r)
        elif r.version == target.version and not (evict and r.node in evict):
            current.append(r)
        else:
            old.append(r)
            if r.version == target.version:
                evicted.append(r)

    def available(r: ReplicaView) -> bool:
        # Serving, as far as the controller knows: a replica being adopted that had been ready
        # counts until its adoption says otherwise (it may be serving routers all along).
        state = r.state
        return r.healthy and (
            state is running or state is updating or (state is recovering and r.served)
        )

    if target.deleting:
        stops = stop_order(current + old + forced, target.version)
        return Plan(stop=tuple(r.tag for r in stops), converged=not replicas)

    n = target.num_replicas
    can_start = not (target.starts_blocked or target.starts_deferred)
    stop: list[str] = [r.tag for r in forced]
    if target.halted:
        # The deploy failed: its starts still under way stop too (and, after a restart, those
        # being adopted that never served), so that it stays where it halted: none comes up
        # later to displace a replica that serves.
        unconfirmed = [
            r
            for r in current
            if r.state is ReplicaState.STARTING or (r.state is recovering and not r.served)
        ]
        stop.extend(r.tag for r in unconfirmed)
        current = [r for r in current if r not in unconfirmed]
    excess = len(current) - n
    if excess > 0:
        going = excess_order(current, target.version, excess, pack=target.pack)
        stop.extend(r.tag for r in going)
        gone = set(map(id, going))
        current = [r for r in current if id(r) not in gone]

    available_new = 0  # RUNNING and healthy: what capacity can be counted on
    serving_new = 0  # RUNNING or UPDATING: the new version has shown it can start
    outdated: list[ReplicaView] = []
    n_updating = 0
    for r in current:
        if available(r):
            available_new += 1
        if r.state is running:
            serving_new += 1
            if r.config_digest != target.config_digest:
                outdated.append(r)
        elif r.state is updating:
            serving_new += 1
            n_updating += 1

    start = 0
    if not old and not old_stopping:
        # A new deployment, or plain scaling: every missing replica starts at once.
        if can_start:
            start = max(0, n - len(current))
    else:
        # A rolling update, throttled: at most max_surge above n in all (replicas still
        # stopping count: they hold resources until they are gone), and at least
        # n - max_unavailable available. The unavailability budget is spent only once the new
        # version has shown it can start (or when surge is 0 and nothing else could proceed),
        # and never after the deploy failed: a release that cannot start replaces no one.
        # Replicas on a drained node are replaced all at once, beside the update's surge.
        surge = max(target.max_surge, len(evicted))
        room = n + surge - (len(current) + len(old) + n_stopping)
        if can_start:
            start = max(0, min(n - len(current), room))
        available_old = [r for r in old if available(r)]
        idle_old = [r for r in old if not available(r)]
        # Old replicas that serve no one (not started, unconfirmed, unhealthy) go at once.
        stop.extend(r.tag for r in stop_order(idle_old, target.version))
        proven = (serving_new > 0 or target.max_surge == 0) and not target.starts_blocked
        floor = max(0, n - target.max_unavailable) if proven else n
        if evicted and len(evicted) == len(old) and can_start:
            # Only a drain: make before break. A drained node's replica goes once another
            # serves in its place; the budget is spent only while no replacement can start.
            floor = n
        removable = max(0, available_new + len(available_old) - floor)
        if target.halted:
            removable = 0  # a halted rollout stays as it is: no serving replica goes
        stop.extend(r.tag for r in stop_order(available_old, target.version)[:removable])

    # In-place reconfigures count against the same unavailability budget (at least one at a time,
    # so that they always proceed); oldest replicas first.
    budget = max(1, target.max_unavailable) - n_updating
    outdated.sort(key=lambda r: r.seq)
    reconfigure = tuple(r.tag for r in outdated[: max(0, budget)])

    converged = (
        n_stopping == 0
        and not old
        and not stop
        and start == 0
        and len(current) == n
        and all(r.state is running and r.config_digest == target.config_digest for r in current)
    )
    return Plan(start=start, stop=tuple(stop), reconfigure=reconfigure, converged=converged)
