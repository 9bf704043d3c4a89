"""Which scale-ups the runtime can hold: the controller's side of feasibility.

``_model.decisions.placement`` does the arithmetic; this module says what each backend holds and
asks for, and words the refusal. A deploy is refused only for what it adds: a spec that frees or
keeps resources is never refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import final

import attrs
import trio

from .._backend.history import plural
from .._backend.loop import Backend
from .._model.config.nodes import NodeRules, rules_text
from .._model.decisions.placement import SLOTS, Demand, need_of, place, total
from .._model.decisions.reconcile import resolve_limits
from .._model.decisions.spec import Spec
from .._model.values.errors import InfeasibleError
from .._ports.runtime import Runtime

#: How long room granted to a growing backend counts as held by it for the others' checks: long
#: enough for its loop to take it up (a pass), short enough not to matter once it has.
GRANT_HELD_S = 1.0


@final
class Reservations:
    """Scale-ups whose spec is being written, counted as held by every capacity check meanwhile,
    so that two concurrent deploys cannot both take the last room."""

    def __init__(
        self,
        runtime: Runtime,
        backends: Mapping[str, Backend],
        requested: Callable[[str], Spec | None],
        left_out: Callable[[], frozenset[str]] = frozenset,
    ):
        self._runtime = runtime
        self._left_out = left_out
        """The nodes cordoned or drained, which the runtime's capacity leaves out."""
        self._backends = backends
        self._requested = requested
        self._pending: dict[str, Demand] = {}
        self._granted: dict[str, tuple[int, float]] = {}
        """Per autoscaled backend: the room last granted it, and when."""

    async def reserve(self, specs: Mapping[str, Spec]) -> list[str]:
        """Check that the scale-ups among `specs` fit together beside everything else held or
        being reserved, and reserve them until ``release``. Raises InfeasibleError naming every
        backend that does not fit. Returns the names reserved."""
        if not any(self._extra(name, spec) for name, spec in specs.items()):
            return []  # nothing grows: never refuse what frees or keeps resources
        nodes = await self._runtime.capacity()
        # From here to the reservation, no checkpoint: what is held cannot change under us.
        wanted = []
        for name, spec in specs.items():
            extra = self._extra(name, spec)
            if extra:
                wanted.append(demand(name, self._requested(name), spec, extra))
        if nodes is not None:
            have = []
            for name, backend in self._backends.items():
                requested = self._requested(name)
                assert requested is not None  # every backend has been asked something
                count = held(backend, requested)
                # Under the rules it is deployed with: its replicas count against the new cap.
                rules = specs[name].rules if name in specs else backend.spec.rules
                have.append(attrs.evolve(held_demand(name, backend, count), rules=rules))
            problem = shortfalls(nodes, have + list(self._pending.values()), wanted)
            if problem is not None:
                out = sorted(self._left_out())
                if out:
                    problem += (
                        f" Not counted: {plural(len(out), 'node')} cordoned or drained "
                        f"({', '.join(n[:12] for n in out)}; `controller node uncordon`)."
                    )
                raise InfeasibleError(problem)
        for want in wanted:
            self._pending[want.name] = want
        return [want.name for want in wanted]

    async def room(self, name: str, wanted: int) -> int:
        """How many of `wanted` replicas of backend `name` (an autoscaled one growing) fit
        beside what every other backend holds or is reserving."""
        nodes = await self._runtime.capacity()
        backend = self._backends.get(name)
        if nodes is None or backend is None:
            return wanted
        now = trio.current_time()
        have = []
        for other, each in self._backends.items():
            requested = self._requested(other)
            if other != name and requested is not None:
                count = held(each, requested)
                # Room granted a moment ago that its backend has not taken up yet is held too,
                # so that two backends growing at once cannot both take the last of it.
                granted, at = self._granted.get(other, (0, -math.inf))
                if now - at < GRANT_HELD_S:
                    count = max(count, granted)
                have.append(held_demand(other, each, count))
        have += [d for d in self._pending.values() if d.name != name]
        # Its own replicas count against its per-node limit: the want is what comes on top.
        have.append(held_demand(name, backend, 0))
        want = held_demand(name, backend, wanted)
        fits = min(wanted, place(nodes, have, [want])[name])
        self._granted[name] = (fits, now)
        return fits

    def forget(self, name: str) -> None:
        """A deleted backend holds no room."""
        self._granted.pop(name, None)

    def release(self, names: Sequence[str]) -> None:
        """The backends now hold what was reserved for them (or the write failed)."""
        for name in names:
            del self._pending[name]

    def _extra(self, name: str, spec: Spec) -> int:
        return extra_replicas(self._backends.get(name), self._requested(name), spec)


def held_demand(name: str, backend: Backend, count: int) -> Demand:
    """`count` replicas of `backend` as its spec places them."""
    spec = backend.spec
    return Demand(name, spec.backend_config.resources, count, rules=spec.rules)


def held(backend: Backend, requested: Spec) -> int:
    """How many replicas' worth of resources `backend` holds or is about to, given the spec last
    asked of it. One that starts nothing until its next deploy (DEPLOY_FAILED) holds only the
    replicas it has: it must not crowd out the others; its next deploy is checked afresh."""
    idle = requested.deleting or (
        backend.reading.blocked and backend.spec.generation == requested.generation
    )
    if idle:
        target = 0
    elif requested.generation == backend.spec.generation:
        target = backend.reading.desired  # the autoscaler's count, for an autoscaled backend
    else:
        target = requested.backend_config.initial_replicas()
    return max(target, len(backend.replicas))


def extra_replicas(backend: Backend | None, requested: Spec | None, spec: Spec) -> int:
    """How many replicas' worth `spec` needs beyond what `backend` holds or is about to."""
    if spec.deleting:
        return 0
    if backend is None or requested is None:
        return _peak(None, spec)
    already = held(backend, requested)
    return max(0, max(_peak(requested, spec), len(backend.replicas)) - already)


def _peak(requested: Spec | None, spec: Spec) -> int:
    # A rolling replacement holds up to max_surge replicas above num_replicas at its peak.
    # An autoscaled backend is checked at the count it starts with; what it scales to later
    # is bounded by what the runtime can place.
    config = spec.backend_config
    count = config.initial_replicas()
    if requested is None or requested.version == spec.version:
        return count
    surge, _ = resolve_limits(count, config.max_surge, config.max_unavailable)
    return count + surge


def demand(name: str, requested: Spec | None, spec: Spec, extra: int) -> Demand:
    """`extra` replicas of `spec`, saying where the count comes from when it is not plain."""
    peak = _peak(requested, spec)
    why = ""
    if peak > spec.backend_config.num_replicas:
        surge = peak - spec.backend_config.num_replicas
        why = (
            f"num_replicas {spec.backend_config.num_replicas} and {surge} more while the new "
            "version rolls out (max_surge)"
        )
    return Demand(name, spec.backend_config.resources, extra, why, spec.rules)


def shortfalls(
    nodes: Sequence[Mapping[str, float]], held: Sequence[Demand], wanted: Sequence[Demand]
) -> str | None:
    """None if every wanted demand fits beside `held`; else why not, in words that name each
    backend short of room, what the runtime offers and what is held already."""
    placed = place(nodes, held, wanted)
    short = [d for d in wanted if placed[d.name] < d.count]
    if not short:
        return None
    reasons = []
    keys: set[str] = set()
    for d in short:
        needs = dict(d.resources)
        keys.update(needs)
        why = f" ({d.why})" if d.why else ""
        reasons.append(
            f"backend {d.name!r}: cannot place {plural(d.count, 'more replica')}{why} needing "
            f"{needs} and a replica slot each; only {placed[d.name]} fit"
            + _rule_to_blame(nodes, held, wanted, d, placed[d.name])
        )
    shown = sorted(keys) + ([SLOTS] if any(SLOTS in node for node in nodes) else [])
    in_use = _only(
        total([{k: v * d.count for k, v in need_of(d.resources).items()} for d in held]), shown
    )
    return (
        f"{'; '.join(reasons)}. The runtime offers {_describe_nodes(nodes, shown)}; this "
        f"controller's replicas already hold {in_use}. Lower num_replicas or resources, or add "
        f"capacity ({SLOTS} is how many replicas a node may hold, whatever they ask for)."
    )


def _rule_to_blame(
    nodes: Sequence[Mapping[str, float]],
    held: Sequence[Demand],
    wanted: Sequence[Demand],
    short: Demand,
    placed: int,
) -> str:
    """Which of `short`'s node rules refuses the count, if the same count without them fits
    more ("" if they are not to blame)."""
    if short.rules == NodeRules():
        return ""

    def free(d: Demand) -> Demand:
        return attrs.evolve(d, rules=NodeRules()) if d.name == short.name else d

    unruled = place(nodes, [free(d) for d in held], [free(d) for d in wanted])[short.name]
    if unruled <= placed:
        return ""
    admitting = sum(1 for node in nodes if short.rules.admits_capacity(node))
    return (
        f": {rules_text(short.rules)} allows no more ({admitting} of {len(nodes)} nodes "
        f"admit the backend), where {unruled} would fit without it"
    )


def _only(resources: Mapping[str, float], keys: Sequence[str]) -> dict[str, float]:
    return {key: resources.get(key, 0.0) for key in keys}


def _describe_nodes(nodes: Sequence[Mapping[str, float]], keys: Sequence[str]) -> str:
    # Only the resources asked for: a node's full inventory would bury the answer.
    shown = [_only(node, keys) for node in nodes]
    if len(shown) == 1:
        return f"{shown[0]} in all"
    listing = ", ".join(str(n) for n in shown)
    return f"{len(shown)} nodes ({listing}; {_only(total(shown), keys)} in all)"
