"""One backend's autoscaler: the thin part around the pure ``_model.decisions.autoscale.evaluate``.

The backend's loop calls ``evaluate`` on each pass of an autoscaled backend (a load event, its
timer, a replica becoming ready): nothing here loops over replicas or polls. The state goes to the
store with the backend's replica record: a change of target as intent (the starts and stops it
causes wait for it), a change of the windows with the next write.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import final

from .._clock import wall_offset
from .._model.config.autoscaling import AutoscalingConfig
from .._model.config.config import BackendConfig
from .._model.decisions.autoscale import (
    Entry,
    Inputs,
    ScaleDecision,
    ScaleState,
    evaluate,
    initial_state,
    restored,
)
from .._model.records.records import AutoscaleRecord
from .._model.views.status import AutoscalerStatus
from . import events as ev
from .history import plural

logger = logging.getLogger("controller")


@final
class Autoscaler:
    """Holds the state, the last decision and the next wake-up of one backend's autoscaler."""

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
        self.next_at = math.inf
        """When the windows, the rate limits or the zero delay may change the outcome."""
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
            self.state, self.last, self.last_change, self.next_at = None, None, None, math.inf
            return
        if self.state is None:
            self.state = initial_state(self._config, config.num_replicas, now)
            self._changed()

    def evaluate(self, load: int | None, not_ready: Callable[[], int], now: float) -> bool:
        """Decide with the load now (ongoing requests; None: no signal); True if the target
        changed. `not_ready` counts the replicas not serving yet: asked only when the load
        points down, where they count (it walks the replicas)."""
        config, before = self._config, self.state
        if config is None or before is None:
            return False
        ongoing = None if load is None else float(load)
        fewer = ongoing is not None and ongoing / config.target_ongoing_requests < before.target
        inputs = Inputs(ongoing, not_ready() if fewer else 0)
        self.state, decision, wake = evaluate(config, before, inputs, now)
        self.next_at = math.inf if wake is None else wake
        self._untold = (config, before, self.last)
        self.last = decision
        return decision.changed

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


#: How often a backend held below its autoscaler's count by capacity asks the runtime again.
RECHECK_ROOM_S = 1.0


@final
class Room:
    """How far an autoscaled backend may grow on the runtime: the autoscaler's count is only
    worked toward as far as it fits beside every other backend, as a deploy's would be (a load
    spike must not start more workers than the machine holds). Asked of the runtime before a
    scale-up past what was last found to fit, in a task, with the answer as an event."""

    def __init__(
        self,
        check: Callable[[int], Awaitable[int]],
        start: Callable[..., None],
        send: Callable[[ev.Event], None],
    ):
        self._check = check
        self._start = start
        self._send = send
        self.fits: int | None = None
        """The most replicas that fit, by the last answer (None: not asked yet)."""
        self._asked, self._asked_at, self._pending = 0, -math.inf, False
        self._answered = 0  # the count the last answer was for
        self._short = False  # the last count fell short of what was wanted, on an answer

    def count(self, wanted: int, held: int, now: float) -> int:
        """The count to work toward now, for `wanted` with `held` replicas there already: no
        growth but on an answer to this very count, younger than `RECHECK_ROOM_S` (others
        take room meanwhile: an older answer, or one for another count, is asked again)."""
        self._short = False
        if wanted <= held:
            return wanted
        fresh = self._answered == wanted and now < self._asked_at + RECHECK_ROOM_S
        if fresh and self.fits is not None:
            count = max(held, min(wanted, self.fits))
            self._short = count < wanted
            return count
        if not self._pending:
            self._pending, self._asked, self._asked_at = True, wanted, now
            self._answered = 0
            self._start(self._ask, wanted)
        return held

    @property
    def asking(self) -> bool:
        """Whether a question of room is on its way: the count is not final until it answers."""
        return self._pending

    @property
    def next_at(self) -> float:
        """When to ask again, while the last answer falls short of what is wanted (an answer
        on its way wakes the loop itself)."""
        return self._asked_at + RECHECK_ROOM_S if self._short else math.inf

    def checked(self, event: ev.RoomChecked) -> None:
        self._pending = False
        if event.wanted == self._asked:
            self.fits, self._answered = event.room, event.wanted

    async def _ask(self, wanted: int) -> None:
        try:
            room = await self._check(wanted)
        except Exception as exc:  # the runtime could not say: grow no further this time
            logger.warning("capacity check failed (%s); not scaling up for now", exc)
            room = 0
        self._send(ev.RoomChecked(wanted, room))
