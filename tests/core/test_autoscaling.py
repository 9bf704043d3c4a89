"""Autoscaling through the controller, on FakeRuntime under MockClock: exact virtual times."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import pytest
import trio
import trio.testing

import controller
from controller import AutoscalingConfig, GoalOutcome, LoadReport
from controller._model.config.manifest import parse_backend
from controller._model.config.traffic import DEFAULT_MAX_UPLOADS
from controller._model.views.status import LOAD_TTL_S
from controller.testing import FakeRuntime, FakeState

from ..conftest import DEADLOCK_LIMIT_S, EXACT, RC, config, settle

#: How often the fake ingress below repeats its report (as the real one does: a third of the TTL).
REFRESH_S = LOAD_TTL_S / 3


class Scalings:
    """An observer that keeps each change the autoscaler makes, at its virtual time."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, int, int]] = []
        self._new = trio.Event()
        self.unknown = 0
        """Replicas named in load reports that the backend did not have (dropped)."""

    def autoscaled(self, backend: str, before: int, after: int) -> None:
        self.seen.append((trio.current_time(), before, after))
        self._new.set()

    def events_handled(self, backend: str, count: int, latency_s: float) -> None:
        pass

    def failure(self, backend: str, kind: str) -> None:
        pass

    def late_checks(self, backend: str, count: int) -> None:
        pass

    def unknown_load(self, backend: str, count: int) -> None:
        self.unknown += count

    def rollout(self, backend: str, outcome: str) -> None:
        pass

    def forgotten(self, backend: str) -> None:
        pass

    async def next(self) -> tuple[float, int, int]:
        """The next change: (virtual time, count before, count after)."""
        count = len(self.seen)
        while len(self.seen) == count:
            self._new = trio.Event()
            await self._new.wait()
        return self.seen[count]


@asynccontextmanager
async def opened(
    rt: FakeRuntime, store: controller.Store | None = None, scalings: Scalings | None = None
) -> AsyncIterator[controller.Controller]:
    with trio.fail_after(DEADLOCK_LIMIT_S):
        async with controller.open_controller(
            runtime=rt,
            store=store if store is not None else controller.MemoryStore(),
            restart_policy=EXACT,
            seed=0,
            observer=scalings,
        ) as ctl:
            yield ctl


def auto(**kwargs: object) -> AutoscalingConfig:
    kwargs.setdefault("max_replicas", 20)
    kwargs.setdefault("target_ongoing_requests", 2)
    return AutoscalingConfig(**kwargs)  # type: ignore[arg-type]  # test values


class Ingress:
    """Reports a backend's ongoing requests the way an ingress does: on change, and again every
    `REFRESH_S` so that the signal stays alive."""

    def __init__(self, ctl: controller.Controller, name: str = "a"):
        self.ctl, self.name, self.load = ctl, name, 0
        self.sent_at = 0.0

    def set(self, load: int) -> None:
        self.load = load
        self._send()

    def _send(self) -> None:
        self.sent_at = trio.current_time()
        self.ctl.report_load(LoadReport("ingress-1", self.name, {}, queued=self.load))

    async def run(self) -> None:
        while True:
            await trio.sleep_until(self.sent_at + REFRESH_S)
            if trio.current_time() >= self.sent_at + REFRESH_S:
                self._send()


@asynccontextmanager
async def autoscaled(
    scaling: AutoscalingConfig,
    num_replicas: int = 1,
    store: controller.Store | None = None,
    runtime: FakeRuntime | None = None,
    scalings: Scalings | None = None,
) -> AsyncIterator[tuple[controller.Controller, Ingress, FakeRuntime]]:
    rt = runtime if runtime is not None else FakeRuntime(auto_ready=True)
    async with opened(rt, store, scalings) as ctl, trio.open_nursery() as nursery:
        goal = await ctl.deploy("a", config(num_replicas=num_replicas, autoscaling=scaling), RC)
        assert await goal.wait() is GoalOutcome.COMPLETED
        ingress = Ingress(ctl)
        ingress.set(0)
        nursery.start_soon(ingress.run)
        yield ctl, ingress, rt
        nursery.cancel_scope.cancel()


def approx(change: tuple[float, int, int]) -> tuple[float, int, int]:
    """A change with its time rounded to the microsecond (virtual times add up in floats)."""
    return (round(change[0], 6), change[1], change[2])


def last(ctl: controller.Controller) -> controller.ScaleDecision:
    scaler = ctl.status("a").autoscaler
    assert scaler is not None
    assert scaler.last is not None
    return scaler.last


def last_change(ctl: controller.Controller) -> controller.ScaleDecision:
    scaler = ctl.status("a").autoscaler
    assert scaler is not None
    assert scaler.last_change is not None
    return scaler.last_change


def desired(ctl: controller.Controller) -> int:
    return ctl.status("a").desired_replicas


async def until(check: Callable[[], bool]) -> None:
    """Let virtual time run until `check` holds (checked on every change of the backend)."""
    await settle()
    while not check():
        await trio.sleep(0.5)
        await settle()


async def test_step_load_scales_up_when_the_upscale_window_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    scalings = Scalings()
    scaling = auto(upscale_stabilization_s=30)
    async with autoscaled(scaling, 2, scalings=scalings) as (ctl, ingress, _):
        ingress.set(4)  # 2 per replica: on target
        await settle()
        assert desired(ctl) == 2
        t0 = trio.current_time()
        ingress.set(16)  # x4
        await settle()
        assert last(ctl).reason == "Stabilizing"
        assert repr(last(ctl).ongoing) == "16.0"  # a number, as status and the API show it
        # The lowest recommendation in the window is still 2, until the window has passed: then
        # up by the rate limit (max(100 %, 4) per 15 s: 2 -> 6), and the rest 15 s later.
        assert await scalings.next() == (t0 + 30, 2, 6)
        now = last(ctl)
        assert (now.reason, now.recommended, now.ongoing) == ("RateLimited", 8, 16.0)
        assert await scalings.next() == (t0 + 45, 6, 8)
        await until(lambda: len(ctl.snapshot("a").replicas) == 8)


async def test_upscale_with_no_window_is_at_once(autojump_clock: trio.testing.MockClock) -> None:
    scalings = Scalings()
    async with autoscaled(auto(), 2, scalings=scalings) as (ctl, ingress, _):
        t0 = trio.current_time()
        ingress.set(9)
        assert await scalings.next() == (t0, 2, 5)
        kinds = [e.kind for e in ctl.status("a").events]
        assert "Autoscale" in kinds


async def test_downscale_waits_the_whole_window_and_a_burst_inside_it_holds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    scalings = Scalings()
    async with autoscaled(auto(min_replicas=1), 8, scalings=scalings) as (ctl, ingress, _):
        ingress.set(16)
        await settle()
        assert desired(ctl) == 8
        t0 = trio.current_time()
        ingress.set(2)
        await trio.sleep(100)
        ingress.set(16)  # one burst, 100 s into the quiet
        await trio.sleep(1)
        ingress.set(2)
        await trio.sleep(298)  # 399 s after the quiet began
        assert desired(ctl) == 8
        # The burst's recommendation of 8 holds until 300 s after it ended (at 101 s).
        assert approx(await scalings.next()) == approx((t0 + 401, 8, 1))


async def test_no_signal_never_scales_down(autojump_clock: trio.testing.MockClock) -> None:
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        scaling = auto(downscale_stabilization_s=0)
        await ctl.deploy("a", config(num_replicas=6, autoscaling=scaling), RC)
        await settle()
        # No ingress ever reports: an hour later it still holds what it started with.
        await trio.sleep(3600)
        assert desired(ctl) == 6
        assert last(ctl).reason == "NoSignal"
        # A report that goes stale is no signal either: 12 is on target for 6, then the
        # ingress that sent it is gone.
        ctl.report_load(LoadReport("gone", "a", {}, queued=12))
        await trio.sleep(LOAD_TTL_S + 60)
        assert desired(ctl) == 6


async def test_constant_load_with_noise_for_a_day_changes_at_most_once_after_settling(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rng = random.Random(7)
    async with autoscaled(auto(), num_replicas=1) as (ctl, ingress, _):
        changes: list[tuple[float, int]] = []
        last = desired(ctl)
        settled_at = trio.current_time() + 600
        end = trio.current_time() + 24 * 3600
        while trio.current_time() < end:
            ingress.set(rng.randint(8, 12))  # 10 +- 20 %
            await trio.sleep(5)
            now = desired(ctl)
            if now != last and trio.current_time() > settled_at:
                changes.append((trio.current_time(), now))
            last = now
        assert len(changes) <= 1, changes
        assert 4 <= desired(ctl) <= 6


async def test_scale_to_zero_after_the_delay_and_back_on_the_first_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    scaling = auto(min_replicas=0, scale_to_zero_delay_s=60, downscale_stabilization_s=30)
    scalings = Scalings()
    async with autoscaled(scaling, 1, scalings=scalings) as (ctl, ingress, _rt):
        # Idle since the deploy (counted busy then): the last replica goes 60 s later.
        t0 = trio.current_time()
        assert approx(await scalings.next()) == approx((t0 + 60, 1, 0))
        await until(lambda: not ctl.status("a").replicas)
        assert last_change(ctl).reason == "ScaleToZero"
        # The first request, queued at the ingress: a replica at once, no window.
        t1 = trio.current_time()
        ingress.set(1)
        assert await scalings.next() == (t1, 0, 1)
        assert last_change(ctl).reason == "ScaleFromZero"
        await settle()
        assert len(ctl.snapshot("a").replicas) == 1
        assert trio.current_time() == t1


async def test_a_scale_to_zero_says_that_zero_was_recommended(
    autojump_clock: trio.testing.MockClock,
) -> None:
    scaling = auto(min_replicas=0, scale_to_zero_delay_s=60, downscale_stabilization_s=30)
    scalings = Scalings()
    async with autoscaled(scaling, 1, scalings=scalings) as (ctl, _ingress, _rt):
        assert (await scalings.next())[1:] == (1, 0)
        await settle()
        change = last_change(ctl)
        assert (change.reason, change.recommended, change.target) == ("ScaleToZero", 0, 0)
        told = [e.message for e in ctl.status("a").events if e.kind == "Autoscale"]
        assert told[-1] == (
            "1 -> 0 replicas (ScaleToZero): load 0 for 2 per replica, 0 not ready, recommended 0"
        )


async def test_a_steady_trickle_never_flaps_between_one_and_zero(
    autojump_clock: trio.testing.MockClock,
) -> None:
    scaling = auto(min_replicas=0, scale_to_zero_delay_s=60, downscale_stabilization_s=30)
    async with autoscaled(scaling, num_replicas=1) as (ctl, ingress, _):
        seen: set[int] = set()
        for _ in range(200):  # a request every 50 s, each a second long, for ~3 hours
            ingress.set(1)
            await trio.sleep(1)
            seen.add(desired(ctl))
            ingress.set(0)
            await trio.sleep(49)
            seen.add(desired(ctl))
        assert seen == {1}


async def test_a_restart_keeps_the_target_and_does_not_scale_down_in_its_first_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store, rt = controller.MemoryStore(), FakeRuntime(auto_ready=True)
    async with autoscaled(auto(), 2, store=store, runtime=rt) as (ctl, ingress, _):
        ingress.set(12)
        await until(lambda: len(ctl.snapshot("a").replicas) == 6)
    tags = sorted(rt.replicas)
    # A new controller on the same store and runtime; its ingress reports an idle backend.
    scalings = Scalings()
    async with opened(rt, store, scalings) as ctl:
        restarted = trio.current_time()
        assert desired(ctl) == 6
        await until(lambda: len(ctl.snapshot("a").replicas) == 6)
        assert sorted(rt.replicas) == tags  # adopted, none restarted
        ingress = Ingress(ctl)
        async with trio.open_nursery() as nursery:
            ingress.set(0)
            nursery.start_soon(ingress.run)
            assert approx(await scalings.next()) == approx((restarted + 300, 6, 1))
            nursery.cancel_scope.cancel()


async def test_a_deploy_of_only_the_autoscaling_block_restarts_nothing_and_keeps_the_target(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with autoscaled(auto(), num_replicas=1) as (ctl, ingress, rt):
        ingress.set(8)
        await until(lambda: len(ctl.snapshot("a").replicas) == 4)
        tags = sorted(r.tag for r in ctl.status("a").replicas)
        # The same manifest again (num_replicas 1 is only the initial count), and new bounds.
        again = await ctl.deploy("a", config(num_replicas=1, autoscaling=auto(max_replicas=30)), RC)
        assert await again.wait() is GoalOutcome.COMPLETED
        assert desired(ctl) == 4
        assert sorted(r.tag for r in ctl.status("a").replicas) == tags
        # Bounds apply at once: a max below the target brings it down without waiting.
        lower = await ctl.deploy("a", config(num_replicas=1, autoscaling=auto(max_replicas=3)), RC)
        assert await lower.wait() is GoalOutcome.COMPLETED
        assert desired(ctl) == 3
        assert last_change(ctl).reason == "Bounds"
        # Without the block, num_replicas rules again.
        plain = await ctl.deploy("a", config(num_replicas=2), RC)
        assert await plain.wait() is GoalOutcome.COMPLETED
        assert desired(ctl) == 2
        assert ctl.status("a").autoscaler is None
        assert len(rt.replicas) >= 2


async def test_the_load_book_has_one_writer_the_loop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with autoscaled(auto(), num_replicas=1) as (ctl, _ingress, rt):
        await settle()
        ctl.report_load(LoadReport("ingress-2", "a", {}, queued=7))
        (tag,) = rt.tags()
        rt.report_load(tag, 3)
        # Both wait in the loop's channel: a source's report, and a replica's own.
        load = ctl.status("a").load
        assert (load.queued, load.self_reported) == (0, 0)
        await settle()
        load = ctl.status("a").load
        assert (load.queued, load.self_reported) == (7, 3)


async def test_load_reports_name_only_replicas_that_exist_each_within_its_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Found by an outside attack: 30 sources claiming `ec#fake` made the status show it, with
    # an in-flight sum of 64,424,509,410, and the autoscaler took that for load.
    rt = FakeRuntime(auto_ready=True)
    seen = Scalings()
    async with opened(rt, scalings=seen) as ctl:
        bounds = {"max_ongoing_requests": 5, "autoscaling": auto(max_replicas=3)}
        await (await ctl.deploy("a", config(num_replicas=1, **bounds), RC)).wait()
        (tag,) = rt.tags()
        huge = 2**31 - 1
        for n in range(30):
            ctl.report_load(LoadReport(f"s{n}", "a", {"a#fake": huge, tag: huge}))
        await settle()
        load = ctl.status("a").load
        assert set(load.replicas) == {tag}  # the made-up replica is not shown
        # Each source's count at max_ongoing_requests and the uploads an ingress sends beside.
        assert load.replicas[tag] == 30 * (5 + DEFAULT_MAX_UPLOADS)
        assert seen.unknown == 30  # and each drop is counted


async def test_autoscaling_during_a_rolling_update_keeps_the_rollouts_bounds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with autoscaled(auto(), num_replicas=1) as (ctl, ingress, _rt):
        ingress.set(8)
        await until(lambda: len(ctl.snapshot("a").replicas) == 4)
        peak = 0

        def counted(ctl: controller.Controller) -> bool:
            # Called after every pass of the loop: no count it held is missed.
            nonlocal peak
            peak = max(peak, len(ctl.status("a").replicas))
            return False

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ctl.wait_until, counted)
            new = config(num_replicas=1, version="v2", autoscaling=auto())
            goal = await ctl.deploy("a", new, RC)
            assert await goal.wait() is GoalOutcome.COMPLETED
            nursery.cancel_scope.cancel()
        status = ctl.status("a")
        assert desired(ctl) == 4
        assert {r.version for r in status.replicas} == {"v2"}
        assert len(status.replicas) == 4
        # max_surge 25 % of 4 is 1: never more than 5 replicas at once, and the surge was
        # used (a count of 0 would say the counter never ran).
        assert peak == 5


def test_contradictions_are_refused_with_the_field_and_the_rule() -> None:
    cases = [
        ({"max_replicas": 2, "min_replicas": 3}, "autoscaling.min_replicas", "<= max_replicas"),
        ({"max_replicas": 2, "target_ongoing_requests": 0}, "target_ongoing_requests", ">= 0.01"),
        ({"max_replicas": 2, "target_ongoing_requests": 1e-310}, "target_ongoing", ">= 0.01"),
        ({"min_replicas": 1}, "autoscaling.max_replicas", "required"),
        ({"max_replicas": 2, "tolerance": 1.5}, "tolerance", "at most"),
        ({"max_replicas": 2, "scale_up_percent": 0, "scale_up_replicas": 0}, "scale_up", "never"),
        ({"max_replicas": 2, "min_replica": 1}, "min_replica", "unknown field"),
    ]
    for block, field, rule in cases:
        with pytest.raises(controller.ConfigError) as info:
            controller.BackendConfig.from_dict({"autoscaling": block})
        assert field in str(info.value), (block, str(info.value))
        assert rule in str(info.value), (block, str(info.value))
    # num_replicas outside the bounds is the count it starts with, put within them.
    cfg = controller.BackendConfig(num_replicas=0, autoscaling=auto(min_replicas=2))
    assert cfg.initial_replicas() == 2


async def test_replicas_that_report_their_own_load_are_scaled_on_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    scalings = Scalings()
    async with opened(rt, scalings=scalings) as ctl:
        await ctl.deploy("a", config(num_replicas=2, autoscaling=auto()), RC)
        await until(lambda: len(ctl.snapshot("a").replicas) == 2)
        first, second = (r.tag for r in ctl.status("a").replicas)
        t0 = trio.current_time()
        rt.report_load(first, 6)  # no ingress: the replicas' own count is the signal
        rt.report_load(second, 4)
        assert approx(await scalings.next()) == approx((t0, 2, 5))
        assert ctl.status("a").load.self_reported == 10
        # A replica that goes takes its report with it.
        await until(lambda: len(ctl.snapshot("a").replicas) == 5)
        rt.crash(first)
        await until(lambda: ctl.status("a").load.self_reported == 4)


async def test_a_load_spike_grows_a_backend_only_as_far_as_the_runtime_fits_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Room for 6 replicas in all; another backend holds 2 of them.
    rt = FakeRuntime(auto_ready=True, capacity={"CPU": 100}, max_replicas=6)
    async with opened(rt) as ctl:
        await (await ctl.deploy("other", config(num_replicas=2), RC)).wait()
        scaling = auto(max_replicas=1000, target_ongoing_requests=1, scale_up_replicas=1000)
        await (await ctl.deploy("a", config(num_replicas=1, autoscaling=scaling), RC)).wait()
        ctl.report_load(LoadReport("ingress-1", "a", {}, queued=30))
        await until(lambda: len(ctl.snapshot("a").replicas) == 4)
        await trio.sleep(5)
        status = ctl.status("a")
        assert status.autoscaler is not None
        assert status.autoscaler.target == 30  # what the load asks
        assert status.autoscaler.capped_at == 4  # what fits
        assert status.desired_replicas == 4
        assert len(status.replicas) == 4
        # Room made elsewhere is taken within a second or so.
        await (await ctl.delete("other")).wait()
        ctl.report_load(LoadReport("ingress-1", "a", {}, queued=31))
        await until(lambda: len(ctl.snapshot("a").replicas) == 6)


async def test_the_windows_count_from_when_a_steady_load_ends_not_from_when_it_began(
    autojump_clock: trio.testing.MockClock,
) -> None:
    scaling = auto(min_replicas=0, downscale_stabilization_s=10, scale_to_zero_delay_s=20)
    scalings = Scalings()
    async with autoscaled(scaling, 1, scalings=scalings) as (_, ingress, _rt):
        ingress.set(4)  # steady for 25 s, longer than either window: one report, no change
        assert approx(await scalings.next())[1:] == (1, 2)
        await trio.sleep(25)
        t0 = trio.current_time()
        ingress.set(0)
        # Down to 1 a whole window after the load ended, and to zero a whole delay after.
        assert approx(await scalings.next()) == approx((t0 + 10, 2, 1))
        assert approx(await scalings.next()) == approx((t0 + 20, 1, 0))


async def test_a_bad_block_in_a_manifest_reports_every_fault_at_once() -> None:
    decl, problems = parse_backend(
        "a",
        {
            "entrypoint": "m:C",
            "autoscaling": {"min_replicas": -1, "tolerance": 3, "target_ongoing_requests": -1},
        },
    )
    assert decl is None
    text = "\n".join(problems)
    for field in ("min_replicas", "tolerance", "target_ongoing_requests", "max_replicas"):
        assert f"autoscaling.{field}" in text, text


async def test_two_backends_growing_on_one_machine_never_hold_more_than_it_fits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True, capacity={"CPU": 100}, max_replicas=4)
    scaling = auto(
        min_replicas=1, max_replicas=30, target_ongoing_requests=1, scale_up_replicas=1000
    )
    scaling = attrs.evolve(scaling, downscale_stabilization_s=0)
    async with opened(rt) as ctl:
        for name in ("a", "b"):
            await (await ctl.deploy(name, config(num_replicas=1, autoscaling=scaling), RC)).wait()

        def live() -> int:
            return sum(1 for r in rt.replicas.values() if r.state is FakeState.READY)

        ctl.report_load(LoadReport("i", "a", {}, queued=30))  # a takes what is left: 3
        await until(lambda: len(ctl.snapshot("a").replicas) == 3)
        ctl.report_load(LoadReport("i", "a", {}, queued=1))  # and gives it back
        await until(lambda: len(ctl.snapshot("a").replicas) == 1)
        ctl.report_load(LoadReport("i", "b", {}, queued=30))  # b takes it: 3
        await until(lambda: len(ctl.snapshot("b").replicas) == 3)
        ctl.report_load(LoadReport("i", "a", {}, queued=30))  # a's old answer said 3: stale
        await trio.sleep(10)
        assert live() <= 4
        assert len(ctl.snapshot("a").replicas) == 1
        a = ctl.status("a").autoscaler
        assert a is not None
        assert (a.target, a.capped_at) == (30, 1)
        assert "ScaleUp" not in ctl.status("a").reason  # capped, not under way
        ctl.report_load(LoadReport("i", "a", {}, queued=1))  # wants 1: nothing capped now
        await settle()
        a = ctl.status("a").autoscaler
        assert a is not None
        assert (a.target, a.capped_at) == (1, None)


async def test_an_autoscaler_change_under_way_is_upscaling_or_downscaling_not_unhealthy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()  # starts wait for the test
    async with opened(rt) as ctl:
        goal = await ctl.deploy("a", config(num_replicas=1, autoscaling=auto()), RC)
        await settle()
        for tag in rt.tags(FakeState.STARTING):
            rt.finish_start(tag)
        await goal.wait()
        ctl.report_load(LoadReport("i", "a", {}, queued=8))
        await settle()
        status = ctl.status("a")
        assert (status.state, status.reason) == (controller.BackendState.UPSCALING, "ScaleUp")
        for tag in rt.tags(FakeState.STARTING):
            rt.finish_start(tag)
        await settle()
        assert ctl.status("a").state is controller.BackendState.HEALTHY


async def test_a_replica_that_stops_saying_its_load_or_says_nonsense_stops_counting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        await ctl.deploy("a", config(num_replicas=1, autoscaling=auto()), RC)
        await until(lambda: len(ctl.snapshot("a").replicas) == 1)
        (tag,) = (r.tag for r in ctl.status("a").replicas)
        rt.report_load(tag, 2)
        await settle()
        assert ctl.status("a").load.self_reported == 2
        rt.report_load(tag, None)  # its load() raised, or returned junk
        await settle()
        assert ctl.status("a").load.self_reported == 0
        rt.report_load(tag, 10**400)  # a bug in a replica: dropped, never a crash
        await settle()
        assert ctl.status("a").load.self_reported == 0
        assert ctl.status("a").autoscaler is not None


def test_a_block_s_faults_across_fields_are_reported_together_and_beside_the_others() -> None:
    decl, problems = parse_backend(
        "a",
        {
            "entrypoint": "m:C",
            "autoscaling": {
                "min_replicas": 5,
                "max_replicas": 2,
                "scale_up_percent": 0,
                "scale_up_replicas": 0,
                "tolerance": 7,
            },
        },
    )
    assert decl is None
    text = "\n".join(problems)
    assert "autoscaling.tolerance" in text
    assert "must be <= max_replicas (2)" in text
    assert "may not both be 0" in text


async def test_a_new_autoscaled_backend_is_not_done_before_its_replicas_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Found by an outside attack: while the runtime was asked for room, the count was what
    was held (0), which converged at once: the goal was reached, and `apply --wait` said done,
    before a replica started."""
    rt = FakeRuntime()
    async with controller.open_controller(
        runtime=rt, store=controller.MemoryStore(), restart_policy=EXACT
    ) as ctl:
        cfg = controller.BackendConfig(
            version="v1", autoscaling=AutoscalingConfig(min_replicas=2, max_replicas=4)
        )
        goal = await ctl.deploy("a", cfg, RC)
        await trio.testing.wait_all_tasks_blocked()
        assert not goal.done
        assert not ctl.status("a").goal_done
        starting = rt.tags(FakeState.STARTING)
        assert len(starting) == 2
        for tag in starting:
            rt.finish_start(tag)
        assert await goal.wait() is GoalOutcome.COMPLETED
        assert len(rt.tags(FakeState.READY)) == 2
