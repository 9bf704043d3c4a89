"""A backend's load and the count its autoscaler sets: the part of the backend's loop that hears
load and keeps how many replicas it should have.

The loop owns it and calls it: load reports (the ingresses', the replicas' own) go to the book and
ask the loop for one pass; each pass of an autoscaled backend decides the autoscaler's evaluation
and the capacity gate's count (``decide_scale``, pure), which this part keeps (``took``). It walks
no replicas itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import final

from .._model.config.config import BackendConfig
from .._model.decisions.pass_plan import Scaled, ScaleInput
from .._model.records.code_report import CodeReport
from .._model.records.records import AutoscaleRecord
from .._model.views.status import (
    AutoscalerStatus,
    BackendLoad,
    BackendReason,
    BackendState,
    LoadReport,
)
from . import events as ev
from .autoscaler import Autoscaler, Room
from .history import Journal
from .intent import Intent
from .load import LoadBook
from .observe import Observer


@final
class Scaling:
    """One backend's load book, autoscaler and capacity gate, and the count they set."""

    def __init__(
        self,
        name: str,
        *,
        room: Callable[[str, int], Awaitable[int]],
        observer: Observer,
        intent: Intent,
        journal: Journal,
        start_task: Callable[..., None],
        send: Callable[[ev.Event], None],
    ):
        self._book = LoadBook()
        self._desired: int | None = None  # the autoscaler's count, as far as it fits
        self.under_way: tuple[BackendState, BackendReason] | None = None
        """The autoscaler changed the count and the replicas have not caught up yet."""
        self.scaler = Autoscaler(
            name,
            changed=intent.changed,
            touched=intent.touched,
            event=journal.event,
            decided=lambda d: observer.autoscaled(name, d.previous, d.target),
        )
        self._room = Room(lambda wanted: room(name, wanted), start_task, send)

    @property
    def autoscaled(self) -> bool:
        return self.scaler.target is not None

    # -- what is heard --

    def report(self, report: LoadReport, now: float) -> bool:
        """A source's latest load (the loop's to give); True if the book's totals moved."""
        return self._book.take(report, now)

    def report_own(
        self,
        tag: str,
        ongoing: int | None,
        served: int | None = None,
        code: CodeReport | None = None,
    ) -> bool:
        """What a live replica says of its own load (None: it no longer says), of the
        requests it has answered and of its models (status shows them; they move no
        decision); True if the book's totals moved."""
        if served is not None:
            self._book.take_served(tag, served)
        if code is not None:
            self._book.take_code(tag, code)
        return self._book.forget_own(tag) if ongoing is None else self._book.take_own(tag, ongoing)

    def room_checked(self, event: ev.RoomChecked) -> None:
        self._room.checked(event)

    def gone(self, tag: str) -> None:
        """Replica `tag` is gone: what it said of its load no longer counts."""
        self._book.forget_own(tag)

    # -- specs and the store --

    def configure(self, config: BackendConfig, now: float) -> None:
        self.scaler.configure(config, now)

    def restore(self, record: AutoscaleRecord | None, config: BackendConfig, now: float) -> None:
        self.scaler.restore(record, config, now)

    def record(self) -> AutoscaleRecord | None:
        return self.scaler.record()

    # -- a pass --

    def scale_input(self, now: float) -> ScaleInput | None:
        """What the pass decides the count on (None: not autoscaled)."""
        config, state = self.scaler.config, self.scaler.state
        if config is None or state is None:
            return None
        ongoing = self._book.ongoing(now)
        load = None if ongoing is None else float(ongoing)  # a decision shows it as a number
        return ScaleInput(config, state, load, self._room.gate)

    def took(self, scaled: Scaled) -> None:
        """Keep what the pass decided: the autoscaler's state, the gate's (and ask the runtime
        for room, if it says so), and the count worked toward."""
        self.scaler.took(scaled.state, scaled.decision)
        self._room.took(scaled.gate, scaled.ask)
        count = scaled.count
        if count is None:
            return
        if self._desired is not None and count != self._desired:
            # A change under way until the replicas catch up, as after a deploy.
            up = count > self._desired
            self.under_way = (
                (BackendState.UPSCALING, "ScaleUp")
                if up
                else (BackendState.DOWNSCALING, "ScaleDown")
            )
        self._desired = count

    def tell(self) -> None:
        """Tell of the last evaluation (its event, log and metric)."""
        self.scaler.tell()

    def as_stored(self) -> None:
        """For a standby's view: the stored target, as the leader had it (a standby asks the
        runtime for no room)."""
        self._desired = self.scaler.target

    def not_autoscaled(self) -> None:
        self._desired = None

    def converged(self) -> None:
        self.under_way = None

    # -- views --

    def desired(self, num_replicas: int) -> int:
        """The count the backend moves to: the autoscaler's as far as it fits, or `num_replicas`
        for one that is not autoscaled."""
        if self.scaler.target is None or self._desired is None:
            return num_replicas
        return self._desired

    def load(self, now: float) -> BackendLoad:
        return self._book.load(now)

    def status(self, num_replicas: int) -> AutoscalerStatus | None:
        wanted, desired = self.scaler.target, self.desired(num_replicas)
        capped = desired if wanted is not None and desired < wanted else None
        return self.scaler.status(capped)
