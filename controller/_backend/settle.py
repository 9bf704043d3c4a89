"""When a backend's goal resolves: once what led to it is stored, and once every replica whose
start failed is gone (and every start under way has ended).

A goal that resolved before its events and outcome were durable could be reported to a user
whose next step (reading the store, a restart, a crash) then missed them; and one that failed
while the worker of its failed start was still being killed let the user's program exit with
that worker alive (an embedded controller closing on ``GoalFailed``). Resolutions are held here
until neither holds, then handed to the intent writer (``Intent.after_stored``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import final

from .._model.records.replica_state import ReplicaState
from .goal import Goal
from .intent import Intent
from .replica import Replica


@final
class GoalSettler:
    def __init__(self, intent: Intent, unfinished: Callable[[], bool]) -> None:
        self._intent = intent
        # Whether a replica is starting, or being stopped before it ever served: a failure
        # waits for those too (each ends serving, or stopped).
        self._unfinished = unfinished
        # The goal on its way to resolve, how, and whether it went on to the intent writer.
        self._settling: tuple[Goal, Callable[[Goal], None]] | None = None
        self._handed = False

    def resolve(self, goal: Goal, how: Callable[[Goal], None]) -> None:
        """Resolve `goal` by `how` (complete or fail it) in due course; the first way asked
        wins, as a goal resolves once."""
        if self.resolving(goal):
            return
        self._settling, self._handed = (goal, how), False
        self._release()

    def resolving(self, goal: Goal) -> bool:
        """Whether `goal` is resolved or on its way to be."""
        return goal.done or (self._settling is not None and self._settling[0] is goal)

    def supersede(self, goal: Goal) -> None:
        """A later spec takes over from `goal`. One on its way to resolve resolves now, as it
        was to (a failure that brings a rollback is the news, not the rollback's taking over);
        any other is superseded."""
        if self._settling is not None and self._settling[0] is goal:
            self._settling[1](goal)
        goal.supersede()

    def gone(self) -> None:
        """A replica stopped, or its start ended: a resolution held for it may go on."""
        self._release()

    def _release(self) -> None:
        if self._settling is None or self._handed or self._unfinished():
            return
        self._handed = True
        goal, how = self._settling
        self._intent.after_stored(lambda: how(goal))


def unfinished(replica: Replica) -> bool:
    """Starting, or being stopped before it ever served (its start failed or was cut short):
    a process that a failed goal must not leave behind."""
    return replica.state is ReplicaState.STARTING or (
        replica.state is ReplicaState.STOPPING and not replica.served
    )
