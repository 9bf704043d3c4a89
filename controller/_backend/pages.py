"""A backend's checkpoint entries in pages, so that a checkpoint costs about what changed.

A backend's checkpoint lists every replica, each as a JSON entry. The entries are kept in pages
of ``PAGE_SIZE``, each as the text of its entries joined, with where each entry ends: an entry
that changed is made anew (``entry_of``) and its page's text remade from the others' slices, and
each entry is held once, as part of its page's text. Page 0 is stored within the backend's
replica record (``replicas/<name>``), the others under keys of their own, so that one change
in a backend of 10,000 replicas writes the record and one page (~80 KB), not ~1.5 MB.

Which pages the store holds as they are here is tracked by a change clock: a batch written
holds every page changed since it was last stored; once the store confirms the batch (`stored`),
those pages count as stored unless they changed again meanwhile. A batch that failed is simply
made again, with whatever changed since.

Pure: no trio, no I/O.
"""

from __future__ import annotations

from array import array
from typing import final

#: Entries per page: small enough that remaking and writing a page is cheap, large enough that
#: the pages of the largest backend are few.
PAGE_SIZE = 256


@final
class Page:
    """Some replicas' entries: `text`, the ones of `tags` joined by commas (entry i ends at
    `ends[i]`), and what changed since it was made."""

    __slots__ = ("changed", "ends", "fresh", "gone", "number", "saved", "tags", "text")

    def __init__(self, number: int) -> None:
        self.number = number
        self.text = ""
        self.tags: list[str] = []
        """In the order they were added, those in `text` first."""
        self.ends = array("I")
        """Where each entry of `text` ends (exclusive)."""
        self.fresh: dict[str, str] = {}
        """Entries made anew since `text` was, by tag (new tags among them)."""
        self.gone: set[str] = set()
        """Tags removed since `text` was made."""
        self.changed = 0
        """The change clock at its last change."""
        self.saved = -1
        """The change clock of the last batch the store confirmed with it in (-1: none)."""

    @property
    def size(self) -> int:
        return len(self.tags) - len(self.gone)

    def remake(self) -> None:
        """`text` anew: the entries that changed as made, the others sliced from the old text."""
        parts: list[str] = []
        tags: list[str] = []
        ends = array("I")
        at = 0
        for i, tag in enumerate(self.tags):
            if tag in self.gone:
                continue
            entry = self.fresh.get(tag)
            if entry is None:  # in the old text (every tag added since is fresh)
                entry = self.text[self.ends[i - 1] + 1 if i else 0 : self.ends[i]]
            parts.append(entry)
            tags.append(tag)
            ends.append(at + len(entry))
            at += len(entry) + 1
        self.text, self.tags, self.ends = ",".join(parts), tags, ends
        self.fresh.clear()
        self.gone.clear()


@final
class Batch:
    """What a checkpoint writes of the pages: page 0's entries (for the record itself), the
    other pages to write and to delete, by number, and the page numbers the record lists."""

    __slots__ = ("clock", "deleted", "first", "listed", "written")

    def __init__(self, clock: int, first: str, listed: list[int]) -> None:
        self.clock = clock
        self.first = first
        self.listed = listed
        self.written: dict[int, str] = {}
        self.deleted: list[int] = []


@final
class Pages:
    """Every entry of one checkpoint, by page. The caller keeps each tag's page (a replica
    holds its own), so that no index by tag is needed here."""

    def __init__(self) -> None:
        self._pages: list[Page] = [Page(0)]  # page 0 is never removed: it is the record's own
        self._clock = 0
        self._next = 1
        self._stored: set[int] = set()
        """Numbers of the pages (other than 0) the store holds."""

    def add(self, tag: str) -> Page:
        """A new tag, after every other, whose entry must be `set` before the next `batch`;
        returns its page."""
        if len(self._pages[-1].tags) >= PAGE_SIZE:
            self._pages.append(Page(self._next))
            self._next += 1
        page = self._pages[-1]
        page.tags.append(tag)
        self.set(page, tag, "")
        return page

    def set(self, page: Page, tag: str, entry: str) -> None:
        page.fresh[tag] = entry
        self._clock += 1
        page.changed = self._clock

    def remove(self, page: Page, tag: str) -> None:
        page.fresh.pop(tag, None)
        page.gone.add(tag)
        self._clock += 1
        page.changed = self._clock
        if page.size == 0 and page.number != 0:
            self._pages.remove(page)

    def held_by_store(self, numbers: list[int]) -> None:
        """The store holds these pages, as another controller wrote them (after a restart):
        pages not made again are deleted by the next batch. Every page here counts as changed,
        as the replicas read back were laid out in pages anew."""
        self._stored.update(numbers)
        for page in self._pages:
            page.saved = -1

    def batch(self) -> Batch:
        """What the next checkpoint writes: every page changed since it was last stored."""
        for page in self._pages:
            if page.fresh or page.gone:
                page.remake()
        first, *others = self._pages
        batch = Batch(self._clock, first.text, [page.number for page in others])
        for page in others:
            if page.changed > page.saved:
                batch.written[page.number] = page.text
        batch.deleted = sorted(self._stored - set(batch.listed))
        return batch

    def stored(self, batch: Batch) -> None:
        """The store holds `batch`."""
        for page in self._pages:
            if page.number in batch.written:
                page.saved = batch.clock
        self._stored -= set(batch.deleted)
        self._stored |= set(batch.written)

    def numbers(self) -> list[int]:
        """The numbers of the pages (other than 0) held here or by the store."""
        return sorted(self._stored | {page.number for page in self._pages[1:]})

    def joined(self) -> str:
        """Every entry, comma-separated, in the order they were added (for tests)."""
        self.batch()
        return ",".join(page.text for page in self._pages if page.text)
