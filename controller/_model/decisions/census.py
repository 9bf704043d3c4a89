"""A backend's replicas counted by what the decision reads of them, kept as they change.

``decide`` looks at every replica only when it has to pick some (a scale-down, a rollout, a
delete); for the events of a settled backend (a replica died, one became ready, a health check)
the counts say all it needs, so a pass costs the same with 100 replicas as with 10,000. A
``ReplicaSet`` keeps its census as its replicas change; ``Census.of`` counts a list (for the
decision's own tests, and for callers that hold no census).

Pure: no trio, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol, final

from ..records.replica_state import ReplicaState

#: What the decision and the autoscaler's counts read of a replica.
Key = tuple[ReplicaState, str, str, bool]
"""(state, version, config digest, served)"""


class Counted(Protocol):
    """What the census reads of a replica."""

    @property
    def state(self) -> ReplicaState: ...
    @property
    def version(self) -> str: ...
    @property
    def config_digest(self) -> str: ...
    @property
    def served(self) -> bool:
        """It has been ready (RUNNING) at some point: a replica being adopted after a restart
        that had, may be serving routers still."""
        ...


def key_of(replica: Counted) -> Key:
    return (replica.state, replica.version, replica.config_digest, replica.served)


@final
class Census:
    """How many replicas have each `Key`. Kinds with none are dropped, so that walking the
    counts costs the number of kinds present (a handful), never the number of replicas."""

    def __init__(self) -> None:
        self._counts: dict[Key, int] = {}
        self.total = 0

    @classmethod
    def of(cls, replicas: Iterable[Counted]) -> Census:
        census = cls()
        for replica in replicas:
            census.add(key_of(replica))
        return census

    def add(self, key: Key) -> None:
        self._counts[key] = self._counts.get(key, 0) + 1
        self.total += 1

    def remove(self, key: Key) -> None:
        left = self._counts[key] - 1
        if left:
            self._counts[key] = left
        else:
            del self._counts[key]
        self.total -= 1

    def move(self, old: Key, new: Key) -> None:
        if old != new:
            self.remove(old)
            self.add(new)

    def items(self) -> Iterator[tuple[Key, int]]:
        return iter(self._counts.items())

    def count(self, state: ReplicaState) -> int:
        return sum(n for (s, _, _, _), n in self._counts.items() if s is state)

    def not_ready(self, version: str) -> int:
        """Replicas of `version` asked for and not serving yet: starting, or being adopted
        without having served (the autoscaler counts them as fully loaded)."""
        starting, recovering = ReplicaState.STARTING, ReplicaState.RECOVERING
        return sum(
            n
            for (s, v, _, served), n in self._counts.items()
            if v == version and (s is starting or (s is recovering and not served))
        )
