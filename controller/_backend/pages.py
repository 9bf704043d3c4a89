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


#: Up to this many changes, a page's text is edited in place (each edit a slice or two of the
#: text, at C speed); beyond, it is rebuilt from its entries in one walk.
SPLICE_MAX = 8


@final
class Page:
    """Some replicas' entries: `text`, the ones of `tags` joined by commas (entry i is
    `lengths[i]` long), and what changed since it was made."""

    __slots__ = ("changed", "fresh", "gone", "lengths", "number", "saved", "tags", "text")

    def __init__(self, number: int) -> None:
        self.number = number
        self.text = ""
        self.tags: list[str] = []
        """In the order they were added, those in `text` first."""
        self.lengths = array("I")
        """How long each entry of `text` is (its start is the sum of those before it, and a
        comma after each): a change moves no other entry's record."""
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
        """`text` anew: the entries that changed as made, the others kept. A crash in a large
        backend changes an entry or two: those are spliced in, so the cost does not grow with
        the page's entries walked one by one in Python."""
        if len(self.fresh) + len(self.gone) > SPLICE_MAX:
            self._rebuild()
        else:
            self._splice()
        self.fresh.clear()
        self.gone.clear()

    def _rebuild(self) -> None:
        parts: list[str] = []
        tags: list[str] = []
        lengths = array("I")
        at = 0
        for i, tag in enumerate(self.tags):
            entry = self.fresh.get(tag)
            if i < len(self.lengths):  # in the old text (every tag added since is fresh)
                if entry is None:
                    entry = self.text[at : at + self.lengths[i]]
                at += self.lengths[i] + 1
            if tag in self.gone:
                continue
            assert entry is not None, "every tag added since the text is fresh"
            parts.append(entry)
            tags.append(tag)
            lengths.append(len(entry))
        self.text, self.tags, self.lengths = ",".join(parts), tags, lengths

    def _splice(self) -> None:
        in_text = len(self.lengths)
        for tag in self.gone:
            try:
                i = self.tags.index(tag, 0, in_text)
            except ValueError:  # added and removed since the text was made
                self.tags.remove(tag)
                continue
            start = sum(self.lengths[:i]) + i
            end = start + self.lengths[i]
            if in_text == 1:
                self.text = ""
            elif i < in_text - 1:
                self.text = self.text[:start] + self.text[end + 1 :]  # with the comma after
            else:
                self.text = self.text[: start - 1]  # the last: with the comma before
            del self.lengths[i]
            del self.tags[i]
            in_text -= 1
        new: list[str] = []
        for tag, entry in self.fresh.items():
            try:
                i = self.tags.index(tag, 0, in_text)
            except ValueError:  # a new tag: appended below, in the order of `tags`
                new.append(tag)
                continue
            start = sum(self.lengths[:i]) + i
            self.text = self.text[:start] + entry + self.text[start + self.lengths[i] :]
            self.lengths[i] = len(entry)
        if new:
            added = self.tags[in_text:]
            assert len(added) == len(new), "every tag added since the text is fresh"
            entries = [self.fresh[tag] for tag in added]
            self.text = ",".join([self.text, *entries] if in_text else entries)
            self.lengths.extend(len(entry) for entry in entries)


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
    holds its own), so that no index by tag is needed here. The pages that changed are kept
    apart, so that a checkpoint walks those, not every page of a large backend."""

    def __init__(self) -> None:
        self._pages: list[Page] = [Page(0)]  # page 0 is never removed: it is the record's own
        self._clock = 0
        self._next = 1
        self._stored: set[int] = set()
        """Numbers of the pages (other than 0) the store holds."""
        self._to_remake: set[Page] = set()
        """Pages with entries changed, added or removed since their text was made."""
        self._unsaved: dict[int, Page] = {}
        """Pages (other than 0) changed since the store last confirmed them, by number."""

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
        self._touch(page)

    def remove(self, page: Page, tag: str) -> None:
        page.fresh.pop(tag, None)
        page.gone.add(tag)
        self._touch(page)
        if page.size == 0 and page.number != 0:
            self._pages.remove(page)
            self._to_remake.discard(page)
            self._unsaved.pop(page.number, None)

    def _touch(self, page: Page) -> None:
        self._clock += 1
        page.changed = self._clock
        self._to_remake.add(page)
        if page.number:
            self._unsaved[page.number] = page

    def held_by_store(self, numbers: list[int]) -> None:
        """The store holds these pages, as another controller wrote them (after a restart):
        pages not made again are deleted by the next batch. Every page here counts as changed,
        as the replicas read back were laid out in pages anew."""
        self._stored.update(numbers)
        for page in self._pages:
            page.saved = -1
            if page.number:
                self._unsaved[page.number] = page

    def batch(self) -> Batch:
        """What the next checkpoint writes: every page changed since it was last stored."""
        for page in self._to_remake:
            page.remake()
        self._to_remake.clear()
        listed = [page.number for page in self._pages[1:]]
        batch = Batch(self._clock, self._pages[0].text, listed)
        for number, page in self._unsaved.items():
            batch.written[number] = page.text
        batch.deleted = sorted(self._stored - set(listed))
        return batch

    def stored(self, batch: Batch) -> None:
        """The store holds `batch`."""
        for number in batch.written:
            page = self._unsaved.get(number)
            if page is not None:
                page.saved = batch.clock
                if page.changed <= batch.clock:
                    del self._unsaved[number]
        self._stored -= set(batch.deleted)
        self._stored |= set(batch.written)

    def numbers(self) -> list[int]:
        """The numbers of the pages (other than 0) held here or by the store."""
        return sorted(self._stored | {page.number for page in self._pages[1:]})

    def joined(self) -> str:
        """Every entry, comma-separated, in the order they were added (for tests)."""
        self.batch()
        return ",".join(page.text for page in self._pages if page.text)
