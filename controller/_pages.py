"""A backend's checkpoint entries in pages, so that a checkpoint costs about what changed.

A backend's checkpoint is one stored value that lists every replica. Each replica's entry is
made anew only when what is stored of it changes (``entry_of``); the entries are kept in pages
of ``PAGE_SIZE``, each with its joined text kept, so that after one change the checkpoint of a
backend of 10,000 replicas joins one page of entries and then ~40 page texts, instead of
10,000 entries. The stored value is the same either way.

Pure: no trio, no I/O.
"""

from __future__ import annotations

from typing import final

#: Entries per page: small enough that remaking a page is cheap, large enough that the pages of
#: the largest backend are few.
PAGE_SIZE = 256


@final
class Page:
    """Some replicas' entries, in the order they were added, and their joined text (None once
    an entry changed)."""

    __slots__ = ("entries", "text")

    def __init__(self) -> None:
        self.entries: dict[str, str] = {}
        self.text: str | None = ""


@final
class Pages:
    """Every entry of one checkpoint, by page. The caller keeps each tag's page (a replica
    holds its own), so that no index by tag is needed here."""

    def __init__(self) -> None:
        self._pages: list[Page] = []

    def add(self, tag: str, entry: str) -> Page:
        """A new entry, after every other; returns its page."""
        if not self._pages or len(self._pages[-1].entries) >= PAGE_SIZE:
            self._pages.append(Page())
        page = self._pages[-1]
        page.entries[tag] = entry
        page.text = None
        return page

    def set(self, page: Page, tag: str, entry: str) -> None:
        page.entries[tag] = entry
        page.text = None

    def remove(self, page: Page, tag: str) -> None:
        del page.entries[tag]
        page.text = None
        if not page.entries:
            self._pages.remove(page)

    def joined(self) -> str:
        """Every entry, comma-separated, in the order they were added."""
        texts = []
        for page in self._pages:
            if page.text is None:
                page.text = ",".join(page.entries.values())
            texts.append(page.text)
        return ",".join(texts)
