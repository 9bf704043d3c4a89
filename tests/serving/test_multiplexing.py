"""``@controller.multiplexed`` on a replica, under MockClock: a model is loaded once however many
ask at once, different models load at once (unless bounded), the least recently used goes first
with its ``unload()``, and a caller that leaves breaks no load."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import controller
from controller._routing.models import parse_held
from controller._serving.multiplex import Shelf, current_model, current_shelf

LOAD_S = 1.0


class Model:
    def __init__(self, name: str, unloaded: list[str]):
        self.name = name
        self._unloaded = unloaded

    async def unload(self) -> None:
        self._unloaded.append(self.name)


class Server:
    """A replica's code with a multiplexed loader, counting its loads."""

    def __init__(self, limit: int = 3, at_once: int | None = None):
        self.loads: list[tuple[str, float]] = []
        self.unloaded: list[str] = []
        self.fail: set[str] = set()

        @controller.multiplexed(max_models_per_replica=limit, max_concurrent_loads=at_once)
        async def get_model(model_id: str) -> Model:
            self.loads.append((model_id, trio.current_time()))
            await trio.sleep(LOAD_S)
            if model_id in self.fail:
                raise RuntimeError(f"no weights for {model_id}")
            return Model(model_id, self.unloaded)

        self.get_model = get_model


@pytest.fixture
def shelf() -> Any:
    shelf = Shelf()
    token = current_shelf.set(shelf)
    yield shelf
    current_shelf.reset(token)


async def test_concurrent_requests_for_one_model_share_its_one_load(
    autojump_clock: trio.testing.MockClock, shelf: Shelf
) -> None:
    server = Server()
    got: list[tuple[Model, float]] = []

    async def ask() -> None:
        got.append((await server.get_model("a"), trio.current_time()))

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(ask)
    assert server.loads == [("a", 0.0)]
    assert len({id(model) for model, _ in got}) == 1
    assert [at for _, at in got] == [LOAD_S] * 5  # all answered as the one load ends
    assert (shelf.loads, shelf.misses, shelf.hits) == (1, 5, 0)
    await server.get_model("a")
    assert trio.current_time() == LOAD_S  # held: no wait
    assert shelf.hits == 1


async def test_different_models_load_at_once_unless_bounded(
    autojump_clock: trio.testing.MockClock, shelf: Shelf
) -> None:
    free, bounded = Server(), Server(at_once=1)
    for server in (free, bounded):
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for name in "abc":
                nursery.start_soon(server.get_model, name)
        # Three loads of a second: together, or one after another when bounded to one.
        assert trio.current_time() - start == (LOAD_S if server is free else 3 * LOAD_S)


async def test_the_least_recently_used_model_goes_first_and_is_unloaded(
    autojump_clock: trio.testing.MockClock, shelf: Shelf
) -> None:
    server = Server(limit=2)
    await server.get_model("a")
    await server.get_model("b")
    await server.get_model("a")  # a is now the more recently used
    await server.get_model("c")
    assert server.unloaded == ["b"]
    assert shelf.held().models == {"a", "c"}
    assert shelf.evictions == 1
    # Room is made before the next load starts: its memory is given back first.
    await server.get_model("d")
    assert server.unloaded == ["b", "a"]
    assert [name for name, _ in server.loads] == ["a", "b", "c", "d"]


async def test_a_caller_that_leaves_breaks_no_load(
    autojump_clock: trio.testing.MockClock, shelf: Shelf
) -> None:
    server = Server()
    got: list[Model] = []

    async def stays() -> None:
        got.append(await server.get_model("a"))

    async with trio.open_nursery() as nursery:
        with trio.move_on_after(LOAD_S / 2):  # its deadline, say: it leaves mid-load
            nursery.start_soon(stays)
            await server.get_model("a")
            pytest.fail("the caller should have left")
    assert [m.name for m in got] == ["a"]
    assert trio.current_time() == LOAD_S
    assert shelf.held().models == {"a"}  # loaded, and kept for the next request


async def test_a_failed_load_fails_its_waiters_and_the_next_request_loads_again(
    autojump_clock: trio.testing.MockClock, shelf: Shelf, capsys: pytest.CaptureFixture[str]
) -> None:
    server = Server()
    server.fail.add("bad")
    errors: list[str] = []

    async def ask() -> None:
        try:
            await server.get_model("bad")
        except RuntimeError as exc:
            errors.append(str(exc))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(ask)
    assert errors == ["no weights for bad"] * 3
    assert "loading model 'bad' failed" in capsys.readouterr().err
    assert shelf.held().models == frozenset()
    server.fail.clear()
    assert (await server.get_model("bad")).name == "bad"
    assert len(server.loads) == 2


async def test_the_request_names_the_model_and_bad_ids_are_refused(
    autojump_clock: trio.testing.MockClock, shelf: Shelf
) -> None:
    server = Server()
    with pytest.raises(ValueError, match="no model id"):
        await server.get_model()
    token = current_model.set("m-1")
    try:
        assert controller.model_id() == "m-1"
        assert (await server.get_model()).name == "m-1"
    finally:
        current_model.reset(token)
    for bad in ("", "a b", "x" * 129, "é"):
        with pytest.raises(ValueError, match="model_id must be 1 to 128 characters"):
            await server.get_model(bad)


async def test_a_method_loader_keeps_one_cache_per_instance(
    autojump_clock: trio.testing.MockClock, shelf: Shelf
) -> None:
    class Code:
        def __init__(self) -> None:
            self.loaded: list[str] = []

        @controller.multiplexed(max_models_per_replica=1)
        async def get_model(self, model_id: str) -> str:
            self.loaded.append(model_id)
            return f"{model_id} of {id(self)}"

    one, two = Code(), Code()
    assert await one.get_model("a") == f"a of {id(one)}"
    assert await two.get_model("a") == f"a of {id(two)}"
    await one.get_model("a")
    assert one.loaded == ["a"]
    assert two.loaded == ["a"]


async def test_answers_say_what_is_held_and_loading_with_a_newer_generation_each_change(
    autojump_clock: trio.testing.MockClock, shelf: Shelf
) -> None:
    server = Server(limit=2)
    seen = [parse_held(shelf.header())]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.get_model, "a")
        await trio.testing.wait_all_tasks_blocked()
        seen.append(parse_held(shelf.header()))  # loading counts as held: routers send there
    seen.append(parse_held(shelf.header()))
    assert [None if h is None else (h.capacity, set(h.models)) for h in seen] == [
        (1, set()),
        (2, {"a"}),
        (2, {"a"}),
    ]
    generations = [h.generation for h in seen if h is not None]
    assert generations == sorted(generations)
    assert len(set(generations)) == 3
    report = shelf.report()
    assert report is not None
    assert report.models is not None
    assert report.models.models == ("a",)
    assert report.models.capacity == 2
    assert report.batches == ()


def test_options_are_checked_when_decorating() -> None:
    with pytest.raises(controller.ConfigError, match="max_models_per_replica"):
        controller.multiplexed(max_models_per_replica=0)
    with pytest.raises(controller.ConfigError, match="max_concurrent_loads"):
        controller.multiplexed(max_concurrent_loads=True)
    with pytest.raises(controller.ConfigError, match="async def"):
        controller.multiplexed(lambda model_id: model_id)


async def test_the_limit_holds_while_loads_are_under_way(
    autojump_clock: trio.testing.MockClock, shelf: Shelf
) -> None:
    server = Server(limit=2)
    async with trio.open_nursery() as nursery:
        for name in "abcdef":
            nursery.start_soon(server.get_model, name)
        await trio.testing.wait_all_tasks_blocked()
        # Two load at a time (the limit): the others wait their turn, counted as loading.
        assert len(server.loads) == 2
        assert shelf.held().loading == set("abcdef")
    # Each load made room first: never more than two models held or being loaded.
    assert [at for _, at in server.loads] == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
    assert len(server.unloaded) == 4
    assert len(shelf.held().models) == 2


async def test_a_loader_that_exits_fails_its_waiters_not_the_replica(
    autojump_clock: trio.testing.MockClock, shelf: Shelf
) -> None:
    @controller.multiplexed
    async def get(model_id: str) -> str:
        if model_id == "exit":
            raise SystemExit(3)
        return model_id

    errors: list[BaseException] = []

    async def ask() -> None:
        try:
            await get("exit")
        except Exception as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(ask)
    assert [type(e).__name__ for e in errors] == ["HandlerEscaped"] * 3
    assert len({id(e) for e in errors}) == 3  # each its own copy
    assert await get("fine") == "fine"
