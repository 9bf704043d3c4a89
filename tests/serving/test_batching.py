"""``@controller.batch`` at exact virtual times (MockClock): a batch runs when full or when its
wait ends, never later; an exception fails exactly its batch's callers; a caller cancelled
while it waits leaves, one cancelled while its batch runs leaves the others' results right. The
same on a real worker process is in tests/test_batching_worker.py."""

from __future__ import annotations

import traceback
from typing import Any

import pytest
import trio
import trio.testing

import controller

#: Each batch as its function saw it: (virtual time, items).
RAN: list[tuple[float, list[Any]]] = []


@controller.batch(max_batch_size=4, batch_wait_timeout_s=0.05)
async def doubled(items: list[int]) -> list[int]:
    RAN.append((trio.current_time(), list(items)))
    await trio.sleep(1)  # the work: a batch takes a second
    if -1 in items:
        raise ValueError("no negatives")
    return [2 * x for x in items]


@pytest.fixture(autouse=True)
def _fresh() -> None:
    RAN.clear()


async def gather(values: list[int], *, after: float = 0) -> dict[int, Any]:
    """Each value through `doubled` from a task of its own, `after` seconds apart."""
    got: dict[int, Any] = {}

    async def one(value: int) -> None:
        try:
            got[value] = await doubled(value)
        except ValueError as exc:
            got[value] = exc

    async with trio.open_nursery() as nursery:
        for value in values:
            nursery.start_soon(one, value)
            await trio.sleep(after)
    return got


async def test_a_batch_runs_at_the_wait_with_what_came_and_each_caller_gets_its_own(
    autojump_clock: trio.testing.MockClock,
) -> None:
    began = trio.current_time()
    assert await gather([1, 2, 3], after=0.01) == {1: 2, 2: 4, 3: 6}
    ((at, items),) = RAN
    assert items == [1, 2, 3]
    assert at - began == pytest.approx(0.05)  # from the first's arrival, not the last's


async def test_a_full_batch_runs_at_once_and_the_rest_wait_their_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    began = trio.current_time()
    got = await gather(list(range(10)))  # all at one (virtual) instant, in no set order
    assert got == {x: 2 * x for x in range(10)}
    assert [len(items) for _, items in RAN] == [4, 4, 2]
    assert sorted(x for _, items in RAN for x in items) == list(range(10))
    times = [round(at - began, 6) for at, _ in RAN]
    # Full: at once. The next is full when the first ends (1 s of work): at once then. The
    # last two waited their 50 ms from when the batcher was free to look at them.
    assert times == [0.0, 1.0, 2.05]
    # What the replica reports as its batches' waits: each from its first item's arrival (all
    # at 0) to its run.
    numbers = doubled.batch_stats()  # type: ignore[attr-defined]
    assert (numbers.batches, numbers.items, numbers.largest) == (3, 10, 4)
    assert numbers.waited_s == pytest.approx(0.0 + 1.0 + 2.05)


async def test_an_exception_fails_exactly_its_batchs_callers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    got = await gather([5, -1, 6, 7, 8, 9], after=0.001)  # in this order
    assert isinstance(got[5], ValueError)
    assert all(isinstance(got[x], ValueError) for x in (5, -1, 6, 7))
    assert (got[8], got[9]) == (16, 18)


async def test_a_caller_cancelled_while_it_waits_leaves_and_the_batch_goes_on_without_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    got: dict[int, int] = {}
    async with trio.open_nursery() as nursery:

        async def one(value: int, scope: trio.CancelScope | None = None) -> None:
            if scope is None:
                got[value] = await doubled(value)
                return
            with scope:
                got[value] = await doubled(value)

        leaving = trio.CancelScope()
        nursery.start_soon(one, 1)
        nursery.start_soon(one, 2, leaving)
        nursery.start_soon(one, 3)
        await trio.sleep(0.01)
        leaving.cancel()  # a client's hang-up, while the batch still gathers
    assert got == {1: 2, 3: 6}
    assert [sorted(items) for _, items in RAN] == [[1, 3]]  # in no set order


async def test_a_caller_cancelled_while_its_batch_runs_breaks_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    got: dict[int, int] = {}
    leaving = trio.CancelScope()

    async def one(value: int, scope: trio.CancelScope) -> None:
        with scope:
            got[value] = await doubled(value)

    async with trio.open_nursery() as nursery:
        for value in (1, 2, 3):
            nursery.start_soon(one, value, leaving if value == 2 else trio.CancelScope())
        await trio.sleep(0.5)  # the batch runs (it started at 0.05, it takes 1 s)
        leaving.cancel()
    assert got == {1: 2, 3: 6}
    assert [sorted(items) for _, items in RAN] == [[1, 2, 3]]
    stats = doubled.batch_stats()  # type: ignore[attr-defined]
    assert (stats.batches, stats.items, stats.largest) == (1, 3, 3)


class Model:
    """A method batches per instance: two models' requests never share a batch."""

    def __init__(self, scale: int) -> None:
        self.scale = scale
        self.batches: list[list[int]] = []

    @controller.batch(max_batch_size=8, batch_wait_timeout_s=0.02)
    async def predict(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        return [self.scale * x for x in items]


async def test_a_method_batches_per_instance(autojump_clock: trio.testing.MockClock) -> None:
    a, b = Model(10), Model(100)
    got: dict[tuple[str, int], int] = {}
    async with trio.open_nursery() as nursery:
        for x in (1, 2, 3):

            async def call(m: Model, name: str, x: int = x) -> None:
                got[(name, x)] = await m.predict(x)

            nursery.start_soon(call, a, "a")
            nursery.start_soon(call, b, "b")
    assert got == {("a", x): 10 * x for x in (1, 2, 3)} | {("b", x): 100 * x for x in (1, 2, 3)}
    assert [sorted(x) for x in a.batches] == [sorted(x) for x in b.batches] == [[1, 2, 3]]


@controller.batch
async def wrong_length(items: list[int]) -> list[int]:
    return items[:1]


async def test_a_result_of_the_wrong_length_fails_every_caller_with_why(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def one() -> None:
        with pytest.raises(TypeError, match=r"one result per item \(got 1 results for 2 items\)"):
            await wrong_length(7)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one)
        nursery.start_soon(one)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_batch_size": 2.5}, "max_batch_size"),
        ({"max_batch_size": True}, "max_batch_size"),
        ({"batch_wait_timeout_s": -1}, "batch_wait_timeout_s"),
        ({"batch_wait_timeout_s": float("nan")}, "batch_wait_timeout_s"),
    ],
)
def test_wrong_options_are_refused_naming_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(controller.ConfigError) as raised:
        controller.batch(**options)
    assert raised.value.field == field


def test_only_an_async_function_of_a_list_is_batched() -> None:
    def sync(items: list[int]) -> list[int]:
        return items

    async def two(a: int, b: int, c: int) -> list[int]:
        return [a]

    with pytest.raises(controller.ConfigError, match="async def"):
        controller.batch(sync)  # type: ignore[arg-type]
    with pytest.raises(controller.ConfigError, match=r"async def f\(items\)"):
        controller.batch(two)


@controller.batch(max_batch_size=50, batch_wait_timeout_s=0.05)
async def exits(items: list[str]) -> list[str]:
    if "exit" in items:
        raise SystemExit(4)  # a batched function's sys.exit(): its batch's error, no more
    if "fail" in items:
        raise ValueError("bad batch")
    return items


async def test_a_batch_that_exits_or_fails_fails_its_callers_each_with_its_own_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    got: dict[int, BaseException] = {}

    async def one(i: int, item: str) -> None:
        try:
            await exits(item)
        except Exception as exc:
            got[i] = exc

    for bad, kind in (("exit", "HandlerEscaped"), ("fail", "ValueError")):
        got.clear()
        async with trio.open_nursery() as nursery:
            for i in range(40):
                nursery.start_soon(one, i, bad if i == 0 else "ok")
        assert {type(e).__name__ for e in got.values()} == {kind}
        assert len(got) == 40
        # Each caller raised a copy of its own: one exception raised in 40 callers would carry
        # all their frames, the 40th's traceback 40 times as long (quadratic in the log).
        assert len({id(e) for e in got.values()}) == 40
        depths = {len(traceback.extract_tb(e.__traceback__)) for e in got.values()}
        assert max(depths) <= min(depths) + 2, depths
    # The batcher lives on: the next batch runs.
    assert await exits("fine") == "fine"
