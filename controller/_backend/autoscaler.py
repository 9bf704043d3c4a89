"""One backend's autoscaler and capacity gate: the thin parts that keep what the pure
``_model.decisions.autoscale.evaluate`` and ``_model.decisions.gate`` decide.

Each pass of an autoscaled backend (a load event, its timer, a replica becoming ready) decides
both (``decide_scale``); nothing here loops over replicas or polls. The state goes to the store
with the backend's replica record: a change of target as intent (the starts and stops it causes
wait for it), a change of the windows with the next write.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import final

from .._clock import wall_offset
from .._model.config.autoscaling import AutoscalingConfig
from .._model.config.config import BackendConfig
from .._model.decisions.autoscale import (
    Entry,
    ScaleDecision,
    ScaleState,
    initial_state,
    restored,
)
from .._model.decisions.gate import Gate, answered
from .._model.records.records import AutoscaleRecord
from .._model.views.status import AutoscalerStatus
from . import events as ev
from .history import plural

logger = logging.getLogger("controller")


@final
class Autoscaler:
    """Holds the state and the last decision of one backend's autoscaler (when it wants the
    next pass is the pass's to decide: ``Scaled.wake_at``)."""

    def __init__(
        self,
        name: str,
        *,
        changed: Callable[[], None],
        touched: Callable[[], None],
        event: Callable[[str, str], None],
        decided: Callable[[ScaleDecision], None],
    ):
        self._name = name
        self._changed = changed
        self._touched = touched
        self._event = event
        self._decided = decided
        self._config: AutoscalingConfig | None = None
        self.state: ScaleState | None = None
        self.last: ScaleDecision | None = None
        self.last_change: ScaleDecision | None = None
        self._untold: tuple[AutoscalingConfig, ScaleState, ScaleDecision | None] | None = None

    @property
    def target(self) -> int | None:
        """The count it set; None for a backend that is not autoscaled."""
        return None if self.state is None else self.state.target

    def configure(self, config: BackendConfig, now: float) -> None:
        """A new spec: start at its `num_replicas` (within bounds) if autoscaling begins now;
        keep the target if it goes on (new bounds apply at the next evaluation)."""
        self._config = config.autoscaling
        if self._config is None:
            if self.state is not None:
                self._changed()  # the store forgets it too
            self.state, self.last, self.last_change = None, None, None
            return
        if self.state is None:
            self.state = initial_state(self._config, config.num_replicas, now)
            self._changed()

    @property
    def config(self) -> AutoscalingConfig | None:
        return self._config

    def took(self, state: ScaleState, decision: ScaleDecision) -> None:
        """What the pass decided (``_model.decisions.autoscale.evaluate``): told by ``tell``."""
        if self._config is None or self.state is None:
            return
        self._untold = (self._config, self.state, self.last)
        self.state, self.last = state, decision

    def tell(self) -> None:
        """Tell of the last evaluation, if not yet: the pass does so after its rollout verdict,
        so that the events keep the order they had when the verdict came first."""
        if self._untold is None or self.state is None or self.last is None:
            return
        (config, before, last), self._untold = self._untold, None
        decision = self.last
        if decision.changed:
            self.last_change = decision
            self._changed()
            self._decided(decision)
            self._event("Autoscale", describe(decision, config))
            logger.info("backend %s: autoscaler: %s", self._name, describe(decision, config))
        else:
            if _values(before) != _values(self.state):
                self._touched()  # the windows changed: stored with the next write
            if last is None or last.reason != decision.reason:
                logger.debug("backend %s: autoscaler: %s", self._name, describe(decision, config))

    def status(self, capped_at: int | None = None) -> AutoscalerStatus | None:
        if self._config is None or self.state is None:
            return None
        return AutoscalerStatus(
            self._config, self.state.target, self.last, self.last_change, capped_at
        )

    # -- the store --

    def record(self) -> AutoscaleRecord | None:
        """The state as stored: trio times turned into wall-clock milliseconds."""
        if self.state is None:
            return None
        state = self.state
        offset = wall_offset()

        def ms(entries: tuple[Entry, ...]) -> list[tuple[int, int]]:
            return [(round((t + offset) * 1000), v) for t, v in entries]

        busy = None if state.busy_at is None else round((state.busy_at + offset) * 1000)
        return AutoscaleRecord(
            state.target, ms(state.ups), ms(state.downs), ms(state.changes), busy
        )

    def restore(self, record: AutoscaleRecord | None, config: BackendConfig, now: float) -> None:
        """Before the loop runs: continue from what a previous controller stored (its target,
        and no scale-down within the first window), or start afresh if it stored nothing."""
        self._config = config.autoscaling
        if self._config is None or record is None:
            self.state = None
            self.configure(config, now)
            return
        offset = wall_offset()

        def trio_times(entries: list[tuple[int, int]]) -> tuple[Entry, ...]:
            return tuple((at / 1000 - offset, v) for at, v in entries)

        busy = None if record.busy_ms is None else record.busy_ms / 1000 - offset
        state = ScaleState(
            record.target,
            trio_times(record.ups),
            trio_times(record.downs),
            trio_times(record.changes),
            busy,
        )
        self.state = restored(state, now)


def describe(decision: ScaleDecision, config: AutoscalingConfig) -> str:
    """``2 -> 5 replicas (ScaleUp): load 9 for 2 per replica, 0 not ready, recommended 5``."""
    load = "no signal" if decision.ongoing is None else f"load {decision.ongoing:g}"
    target = plural(decision.target, "replica")
    return (
        f"{decision.previous} -> {target} ({decision.reason}): {load} for "
        f"{config.target_ongoing_requests:g} per replica, {decision.not_ready} not ready, "
        f"recommended {decision.recommended}"
    )


def _values(state: ScaleState) -> tuple[object, ...]:
    # What a write is worth: the windows' counts and all but their newest times (which move
    # with every evaluation), and the changes. A restart seeds the window with its target anyway.
    return (
        state.ups[:-1],
        [v for _, v in state.ups],
        state.downs[:-1],
        [v for _, v in state.downs],
        state.changes,
    )


@final
class Room:
    """How far an autoscaled backend may grow on the runtime: the autoscaler's count is only
    worked toward as far as it fits beside every other backend, as a deploy's would be. The gate
    is decided by the pass (``_model.decisions.gate``); here it is kept, and the runtime asked,
    in a task, with the answer as an event."""

    def __init__(
        self,
        check: Callable[[int], Awaitable[int]],
        start: Callable[..., None],
        send: Callable[[ev.Event], None],
    ):
        self._check = check
        self._start = start
        self._send = send
        self.gate = Gate()

    def took(self, gate: Gate, ask: int | None) -> None:
        """What the pass decided: the gate after it, and a count to ask the runtime about."""
        self.gate = gate
        if ask is not None:
            self._start(self._ask, ask)

    def checked(self, event: ev.RoomChecked) -> None:
        self.gate = answered(self.gate, event.wanted, event.room)

    async def _ask(self, wanted: int) -> None:
        try:
            room = await self._check(wanted)
        except Exception as exc:  # the runtime could not say: grow no further this time
            logger.warning("capacity check failed (%s); not scaling up for now", exc)
            room = 0
        self._send(ev.RoomChecked(wanted, room))
