"""Checkpoint before act: a backend's intent reaches the store before the runtime is asked.

The loop notes each change of the backend's replica record (``changed``) and hands each runtime
action to ``act``; the writer task (``run``) stores the record, with the backend's events, and
reports ``Written(seq)``; an action waits until the change behind it is durable. The loop itself
never waits on storage, and a watcher never waits on an fsync.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import final

import trio

from .._model.records.records import events_key
from .._model.values.errors import ControllerError
from .._ports.store import Store
from . import events as ev
from .history import EventLog
from .turns import Turns

logger = logging.getLogger("controller")

#: How long a closing controller gives its last checkpoint writes.
FLUSH_ON_CLOSE_S = 2.0
#: The first and the longest wait between retries of a failed store write.
WRITE_RETRY_MIN_S = 0.1
WRITE_RETRY_MAX_S = 5.0


@final
class Intent:
    """The durability gate of one backend, and the task that writes its checkpoints."""

    def __init__(
        self,
        name: str,
        store: Store,
        record: Callable[[], tuple[dict[str, str | None], Callable[[], None]]],
        history: EventLog,
        send: Callable[[ev.Event], None],
        turns: Turns,
    ):
        self._name = name
        self._turns = turns
        self._store = store
        self._record = record
        self._history = history
        self._send = send
        self.record_seq = 0
        """Bumped by each change of what the store should hold of the replicas."""
        self.durable_seq = 0
        """The change the store is known to hold (from the writer's `Written` events)."""
        # What the writer last stored: the record as of this change number, and this many
        # events (so that a wake-up for one of the two does not rewrite the other).
        self._stored_seq = 0
        self._events_stored = 0
        self._wanted = trio.Event()
        self._queued: list[tuple[int, Callable[[], object]]] = []
        # after_stored's actions: those the next write takes, and those whose write landed.
        self._after: list[Callable[[], object]] = []
        self._landed: list[Callable[[], object]] = []
        self._failures = 0  # failed writes in a row, for the backoff
        self._touches = self._touches_stored = 0
        self._forgotten = False

    @property
    def durable(self) -> bool:
        """Everything the loop changed is in the store."""
        return self.durable_seq >= self.record_seq

    @property
    def idle(self) -> bool:
        """Nothing is left to write, the events and readiness included (a write in flight
        reports with `Written` when it is done)."""
        return (
            self._stored_seq == self.record_seq
            and self._events_stored == self._history.added
            and self._touches_stored == self._touches
        )

    def restored(self, *, changed: bool) -> None:
        """What was read back from the store needs no write; `changed`: it does after all
        (replicas found dead were dropped from it)."""
        self.record_seq = self.durable_seq = self._stored_seq = 0
        if changed:
            self.changed()

    def changed(self) -> None:
        """The replica record changed: store it."""
        self.record_seq += 1
        self._wanted.set()

    def events_changed(self) -> None:
        """An event was added: store the events (nothing waits on it)."""
        self._wanted.set()

    def touched(self) -> None:
        """The record changed in a way no action waits on (a replica became ready): store it
        with the next write, without holding anything back until then."""
        self._touches += 1
        self._wanted.set()

    def act(self, action: Callable[[], object]) -> None:
        """Do `action` (ask the runtime for something) once the intent behind it is durable."""
        if self.durable:
            action()
        else:
            self._queued.append((self.record_seq, action))

    def after_stored(self, action: Callable[[], object]) -> None:
        """Do `action` (resolve a goal) once everything recorded so far, the record and the
        events alike, is stored: by a write that starts after this call."""
        self._after.append(action)
        self._wanted.set()

    def written(self, seq: int) -> None:
        """The writer's report: run the actions waiting for change `seq` or an earlier one,
        and those waiting for the write that landed."""
        self.durable_seq = max(self.durable_seq, seq)
        ready = [action for s, action in self._queued if s <= self.durable_seq]
        self._queued = [(s, a) for s, a in self._queued if s > self.durable_seq]
        ready += self._landed
        self._landed = []
        for action in ready:
            action()

    async def run(self) -> None:
        """The writer task: store what changed, report it, wait for more; never returns. When
        the controller closes, what is not stored yet is written once more, briefly (a close is
        otherwise like a crash: this only spares the next controller some guessing, such as
        which replicas had become ready)."""
        try:
            await self._write_forever()
        finally:
            if not self._forgotten:
                await self._flush()

    async def _flush(self) -> None:
        with trio.move_on_after(FLUSH_ON_CLOSE_S, shield=True):
            changes, _ = self._changes(self.record_seq, self._history.added, self._touches)
            if changes:
                try:
                    await self._store.write(changes)
                except BaseException:  # the store is failing or gone
                    logger.debug("backend %s: last checkpoint not written", self._name)

    async def _write_forever(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted = trio.Event()
            after, self._after = self._after, []
            # The texts and the sequence number are taken together, with no checkpoint in
            # between: the record text holds every change up to `seq`. A write that fails is
            # retried with the newest texts, which supersede the old (and hold every page
            # the failed one did: pages count as stored only once a write lands).
            while True:
                seq, events, touches = self.record_seq, self._history.added, self._touches
                changes, stored = self._changes(seq, events, touches)
                if not changes:
                    break
                if await self._try_write(changes):
                    stored()
                    break
            self._stored_seq, self._events_stored, self._touches_stored = seq, events, touches
            self._landed += after
            self._send(ev.Written(seq))

    def _changes(
        self, seq: int, events: int, touches: int
    ) -> tuple[dict[str, str | None], Callable[[], None]]:
        """What to write, and what to call once it is stored."""
        changes: dict[str, str | None] = {}
        stored: Callable[[], None] = _nothing
        if seq != self._stored_seq or touches != self._touches_stored:
            changes, stored = self._record()
        if events != self._events_stored:
            changes[events_key(self._name)] = self._history.text()
        return changes, stored

    async def forget(self, keys: list[str]) -> None:
        """Delete every key of a deleted backend, retrying with backoff until that lands (a
        store that fails for a while delays it, no more). The writer must be `idle`: it
        writes nothing after this, not even when the controller closes."""
        assert self.idle, "a write in flight could land after the deletion"
        self._forgotten = True
        while not await self._try_write(dict.fromkeys(keys)):
            pass

    async def _try_write(self, changes: Mapping[str, str | None]) -> bool:
        try:
            await self._store.write(changes)
        except ControllerError as exc:
            if not exc.retryable:
                raise
            # Nothing that depends on this write happens until it lands, so retrying is safe.
            self._failures += 1
            delay = min(WRITE_RETRY_MIN_S * 2 ** (self._failures - 1), WRITE_RETRY_MAX_S)
            logger.error("backend %s: checkpoint failed (%s); retry in %gs", self._name, exc, delay)
            await trio.sleep(delay)
            return False
        self._failures = 0
        # One store write lands for every backend that asked meanwhile (thousands, in a prune):
        # they go on in turns, not all in one round of the loop.
        await self._turns.take()
        return True


def _nothing() -> None:
    pass
