"""A large backend's replicas are stored in pages: a change writes its record and one page,
recovery reads them all back, pages no longer used are deleted, and a store whose pages do
not add up is refused before anything is done."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import hypothesis
import pytest
import trio
import trio.testing
from hypothesis import strategies as st

import controller
from controller._backend.pages import PAGE_SIZE
from controller._model.records.checkpoint import _converter, dump_replica, parse_all
from controller._model.records.records import ReplicaRecord
from controller.testing import FakeRuntime, FakeState

from ..conftest import RC, FlakyStore, config, opened, settle

BIG = 2 * PAGE_SIZE + 88  # three pages: the record's own and two more


@contextlib.asynccontextmanager
async def big_backend(
    rt: FakeRuntime, store: controller.Store
) -> AsyncIterator[controller.Controller]:
    """A controller holding backend "a" of BIG replicas, all serving."""
    async with opened(rt, store) as ctl:
        await (await ctl.deploy("a", config(num_replicas=BIG), RC)).wait()
        await settle()
        yield ctl


def page_keys(store: controller.MemoryStore | FlakyStore) -> list[str]:
    return sorted(k for k in store.data if k.startswith("replicas/a/"))


def stored_tags(store: controller.MemoryStore | FlakyStore) -> set[str]:
    return {r.tag for r in parse_all(dict(store.data)).replicas["a"].replicas}


async def test_a_change_in_a_large_backend_writes_its_record_and_one_page(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt, store = FakeRuntime(auto_ready=True), FlakyStore()
    async with big_backend(rt, store) as ctl:
        assert page_keys(store) == ["replicas/a/1", "replicas/a/2"]
        store.batches.clear()
        # One on the last page (where its replacement goes too).
        rt.crash(json.loads(store.data["replicas/a/2"])["replicas"][0]["tag"])
        await ctl.wait_until(lambda c: len(c.snapshot("a").replicas) == BIG)
        await settle()
        assert store.batches  # the death, the replacement's start, its readiness
        for batch in store.batches:
            pages = [k for k in batch if k.startswith("replicas/a/")]
            assert pages in ([], ["replicas/a/2"]), batch  # page 1 is not written again


async def test_pages_changed_by_a_failed_write_are_in_the_next(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt, store = FakeRuntime(auto_ready=True), FlakyStore()
    async with big_backend(rt, store) as ctl:
        page_1 = [r["tag"] for r in json.loads(store.data["replicas/a/1"])["replicas"]]
        store.failing = True
        rt.crash(page_1[0])  # page 1 changes in a write that fails...
        await settle()
        store.failing = False
        store.batches.clear()
        page_2 = [r["tag"] for r in json.loads(store.data["replicas/a/2"])["replicas"]]
        rt.crash(page_2[0])  # ...and is written with the next, though unchanged since
        await ctl.wait_until(lambda c: len(c.snapshot("a").replicas) == BIG)
        await settle()
        assert "replicas/a/1" in store.batches[0]
        assert stored_tags(store) == {r.tag for r in ctl.status("a").replicas}
        assert page_1[0] not in stored_tags(store)


async def test_a_large_backend_recovers_from_its_pages_and_drops_them_as_it_shrinks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt, store = FakeRuntime(auto_ready=True), controller.MemoryStore()
    async with big_backend(rt, store):
        pass
    started = rt.start_calls
    live = set(rt.tags(FakeState.READY))
    async with opened(rt, store) as ctl:
        await ctl.wait_until(lambda c: len(c.snapshot("a").replicas) == BIG)
        assert rt.start_calls == started  # every one adopted, none started anew
        assert {r.tag for r in ctl.status("a").replicas} == live
        await (await ctl.deploy("a", config(num_replicas=3), RC)).wait()
        await settle()
        assert page_keys(store) == []
    checkpoint = parse_all(dict(store.data))  # refuses a page no record lists
    assert len(checkpoint.replicas["a"].replicas) == 3


def damages(good: dict[str, str]) -> list[tuple[str, dict[str, str | None], str]]:
    """(what, the keys changed (None: deleted), what the refusal names) of a store of one
    backend "a" in three pages, and of another, "b", of one replica."""
    page_1, page_2 = good["replicas/a/1"], good["replicas/a/2"]
    record = json.loads(good["replicas/a"])
    b_record = json.loads(good["replicas/b"])
    first_tag = json.loads(page_1)["replicas"][0]["tag"]
    return [
        ("a listed page missing", {"replicas/a/2": None}, "'replicas/a/2'"),
        ("a page holding another page", {"replicas/a/2": page_1}, "'replicas/a/2'"),
        (
            "a page no record lists",
            {"replicas/a/9": page_1.replace('"page":1', '"page":9')},
            "'replicas/a/9'",
        ),
        (
            "a page the record no longer lists",
            {"replicas/a": json.dumps({**record, "pages": [1]})},
            "'replicas/a/2'",
        ),
        (
            "an empty listed page",
            {"replicas/a/2": json.dumps({**json.loads(page_2), "replicas": []})},
            "'replicas/a/2'",
        ),
        (
            "a replica in two pages",
            {"replicas/a/2": page_1.replace('"page":1', '"page":2')},
            first_tag,
        ),
        (
            "a replica in two backends",
            {
                "replicas/b": json.dumps(
                    {
                        **b_record,
                        "replicas": [
                            *b_record["replicas"],
                            {"tag": first_tag, "version": "v1", "config_digest": "d"},
                        ],
                    }
                )
            },
            first_tag,
        ),
    ]


async def test_a_store_whose_pages_do_not_add_up_is_refused_untouched(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt, store = FakeRuntime(auto_ready=True), controller.MemoryStore()
    async with big_backend(rt, store) as ctl:
        await (await ctl.deploy("b", config(num_replicas=1), RC)).wait()
    good = dict(store.data)
    live = set(rt.tags(FakeState.READY))
    for what, changed, named in damages(good):
        store.data.clear()
        store.data.update({k: v for k, v in {**good, **changed}.items() if v is not None})
        damaged = dict(store.data)
        with pytest.raises(controller.CheckpointError) as refused:
            async with opened(rt, store):
                pass
        assert named in str(refused.value), (what, refused.value)
        assert store.data == damaged, what  # nothing written
        assert set(rt.tags(FakeState.READY)) == live, what  # nothing killed


@hypothesis.given(
    st.builds(
        ReplicaRecord,
        tag=st.text(),
        version=st.text(),
        config_digest=st.text(),
        stopping=st.booleans(),
        created_ms=st.none() | st.integers(min_value=0, max_value=2**53),
        served=st.booleans(),
        address=st.none() | st.text(),
        revision=st.none() | st.integers(min_value=1, max_value=2**31),
        stopping_ms=st.none() | st.integers(min_value=0, max_value=2**53),
    )
)
def test_a_replica_entry_written_by_hand_is_what_cattrs_and_json_make_of_it(
    record: ReplicaRecord,
) -> None:
    # dump_replica writes the entry out by hand, for speed; the text must stay the one the
    # converter makes (every field in order, those at their default left out), and read back.
    made = json.dumps(_converter.unstructure(record), separators=(",", ":"), allow_nan=False)
    assert dump_replica(record) == made
    assert _converter.structure(json.loads(dump_replica(record)), ReplicaRecord) == record
