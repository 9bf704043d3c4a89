"""The pages of a checkpoint (``_backend.pages``), pure: whatever is added, changed and removed,
and however often it is batched, each page's text is its entries joined, in the order they were
added; a batch writes the pages changed since the store last confirmed them, and no other."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from controller._backend.pages import SPLICE_MAX, Page, Pages

# Small pages would hide nothing: the page size is the module's, so these histories fill a few.
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 300)),
        st.tuples(st.just("set"), st.integers(0, 10**6)),
        st.tuples(st.just("remove"), st.integers(0, 10**6)),
        st.tuples(st.just("batch"), st.booleans()),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=OPS)
def test_every_page_holds_its_entries_joined_whatever_the_history(
    ops: list[tuple[str, int | bool]],
) -> None:
    pages = Pages()
    entries: dict[str, str] = {}  # the model: by tag, in the order added
    page_of: dict[str, Page] = {}
    stored: dict[int, str] = {}  # what the store holds of pages other than 0
    made = 0
    for op, arg in ops:
        if op == "add":
            for _ in range(int(arg)):
                tag = f"t{made}"
                made += 1
                page_of[tag] = pages.add(tag)
                entries[tag] = f'{{"tag":"{tag}","n":{"x" * (made % 7)}}}'
                pages.set(page_of[tag], tag, entries[tag])
        elif op in ("set", "remove") and entries:
            tag = list(entries)[int(arg) % len(entries)]
            if op == "set":
                entries[tag] = entries[tag] + "!" * (int(arg) % 3)
                pages.set(page_of[tag], tag, entries[tag])
            else:
                del entries[tag]
                pages.remove(page_of.pop(tag), tag)
        elif op == "batch":
            batch = pages.batch()
            if arg:  # the store confirms it (else: the write failed, and is made again)
                pages.stored(batch)
                for number in batch.deleted:
                    stored.pop(number, None)
                stored.update(batch.written)
            # What the store would hold after this batch lands is every page as it is here.
            held = {**stored, **batch.written}
            for number in batch.deleted:
                held.pop(number, None)
            by_page: dict[int, list[str]] = {}
            for tag, entry in entries.items():
                by_page.setdefault(page_of[tag].number, []).append(entry)
            assert batch.first == ",".join(by_page.pop(0, []))
            assert held == {n: ",".join(e) for n, e in by_page.items()}
            assert sorted(batch.listed) == sorted(by_page)
    assert pages.joined() == ",".join(entries.values())


def test_a_few_changes_are_spliced_and_many_rebuild_the_same_text() -> None:
    for changes in (1, 2, SPLICE_MAX, SPLICE_MAX + 1, 40):
        pages = Pages()
        model = {f"t{i}": f"<t{i}>" for i in range(60)}
        page = pages.add("t0")
        for tag in list(model)[1:]:
            assert pages.add(tag) is page
        for tag, entry in model.items():
            pages.set(page, tag, entry)
        pages.batch()
        for i in range(changes):
            tag = list(model)[(7 * i) % len(model)]
            if i % 3 == 0:
                del model[tag]
                pages.remove(page, tag)
            else:
                model[tag] = f"<{tag}:{i}>"
                pages.set(page, tag, model[tag])
        assert pages.add("new") is page
        model["new"] = "<new>"
        pages.set(page, "new", "<new>")
        assert pages.batch().first == ",".join(model.values())
        assert list(page.lengths) == [len(e) for e in model.values()]
