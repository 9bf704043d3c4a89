"""The revision books of a controller's backends, and their one writer.

A book is read by its backend's loop (its rollout and canary), the API and the rollout commands;
it is written here only: the spec desk adds the revisions a change makes (``install``), and each
outcome a backend's rollout reports (``report``) is marked here. While a change holds a name
(``holding``), the outcomes reported for it are held and marked in the history the change
writes (``write``), so that a change never writes over an outcome and nothing reconciles two
writers afterwards.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import final

from .._backend.turns import take_turns
from .._model.decisions.steering import SpecChange
from .._model.records.checkpoint import dump
from .._model.records.records import RevisionsRecord, revisions_key
from .._model.records.revisions import Outcome, Revision, RevisionBook, with_outcomes
from .._ports.store import Store


@final
class Histories:
    """Each backend's revision book, by name, and the outcomes held for names a change holds."""

    def __init__(self, store: Store):
        self._store = store
        self._books: dict[str, RevisionBook] = {}
        # The outcomes rollouts reported for names a change holds, marked once it writes (or
        # lets go): the change made its history from the book before they came.
        self._held: dict[str, list[Outcome]] = {}

    def __getitem__(self, name: str) -> RevisionBook:
        return self._books[name]

    def get(self, name: str) -> RevisionBook | None:
        return self._books.get(name)

    def restore(self, name: str, book: RevisionBook) -> None:
        """`name`'s book as the store keeps it (a recovery, or a standby's view)."""
        self._books[name] = book

    def forget(self, name: str) -> None:
        self._books.pop(name, None)

    def report(self, name: str, outcome: Outcome) -> None:
        """How `name`'s rollout goes, as it reports it: marked in its book, or held while a
        change of the name is under way (the change marks it in the history it writes)."""
        held = self._held.get(name)
        if held is not None:
            held.append(outcome)
        elif (book := self._books.get(name)) is not None:
            book.mark(outcome)

    @contextmanager
    def holding(self, names: Collection[str]) -> Iterator[None]:
        """Hold the outcomes reported for `names` while a change of them is under way (the
        caller holds their locks); those not written by then are marked on the way out."""
        for name in names:
            self._held[name] = []
        try:
            yield
        finally:
            for name in names:
                book = self._books.get(name)
                for outcome in self._held.pop(name, ()):
                    if book is not None:
                        book.mark(outcome)

    async def write(self, writes: dict[str, str | None], changes: Mapping[str, SpecChange]) -> None:
        """Write `writes` with the changes' histories, then make those the books. Each history
        was made from the book before its name was held; the outcomes its rollout reported
        since are marked in it before the write, and those reported during the write before
        one more."""
        histories = {n: c.revisions for n, c in changes.items() if c.revisions is not None}
        due = set(histories)
        while True:
            for done, name in enumerate(due, 1):
                await take_turns(done)
                outcomes = self._held.get(name, [])
                histories[name] = with_outcomes(histories[name], outcomes, changes[name].replaces)
                outcomes.clear()
                writes[revisions_key(name)] = dump(RevisionsRecord(name, histories[name]))
            await self._store.write(writes)
            due = {name for name in histories if self._held.get(name)}
            if not due:
                break
            writes = {}
        self._install(changes, histories)

    def _install(
        self, changes: Mapping[str, SpecChange], histories: Mapping[str, list[Revision]]
    ) -> None:
        for name in changes:
            book = self._books.setdefault(name, RevisionBook())
            if name in histories:
                book.revisions = histories[name]
