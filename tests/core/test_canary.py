"""Canary releases driven through FakeRuntime under trio's MockClock: the split of replicas and
traffic, the step timer at exact virtual times, the gates on reported numbers, promotion,
abort and the rollback to the stable revision, a person's promote and abort, and a restart in
the middle of a step."""

from __future__ import annotations

import contextlib

import pytest
import trio
import trio.testing

import controller
from controller import (
    CanaryConfig,
    GoalOutcome,
    LoadReport,
    ReplicaState,
    RequestTally,
    RolloutError,
)
from controller.testing import FakeRuntime

from ..conftest import RC, config, opened, settle

STEPS = [{"weight": 25, "pause_s": 60}, {"weight": 50, "pause_s": 60}]


def canary_config(**kwargs: object) -> controller.BackendConfig:
    block = {"steps": STEPS, "min_requests": 10, **kwargs.pop("canary", {})}  # type: ignore[dict-item]
    kwargs.setdefault("num_replicas", 4)
    return config(canary=CanaryConfig.from_dict(block), **kwargs)


def tally(requests: int, errors: int = 0, seconds: float = 0.01) -> RequestTally:
    t = RequestTally()
    for i in range(requests):
        t.count(i < errors, seconds)
    return t


def report(ctl: controller.Controller, **by_version: RequestTally) -> None:
    ctl.report_load(LoadReport("test", "a", {}, 0, traffic=by_version))


async def ended(goal: controller.Goal) -> None:
    """Wait for `goal` to end, failed or not."""
    with contextlib.suppress(controller.GoalFailed):
        await goal.wait()


def versions(ctl: controller.Controller) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in ctl.status("a").replicas:
        if r.state is ReplicaState.RUNNING:
            out[r.version] = out.get(r.version, 0) + 1
    return out


def events(ctl: controller.Controller, kind: str) -> list[str]:
    return [e.message for e in ctl.status("a").events if e.kind == kind]


async def stable_v1(ctl: controller.Controller) -> None:
    goal = await ctl.deploy("a", canary_config(), RC)
    await goal.wait()
    assert goal.outcome is GoalOutcome.COMPLETED


async def v2_as_canary(ctl: controller.Controller) -> controller.Goal:
    """v1 serving, then v2 deployed as a canary: its goal, once the loop has taken it."""
    await stable_v1(ctl)
    goal = await ctl.deploy("a", canary_config(version="v2"), RC)
    await settle()
    return goal


async def test_a_healthy_canary_goes_through_every_step_and_is_promoted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        goal = await v2_as_canary(ctl)
        # The stable revision keeps its 4; the canary has 25% of 4 = 1, and a quarter of the
        # requests.
        assert versions(ctl) == {"v1": 4, "v2": 1}
        snapshot = ctl.snapshot("a")
        assert snapshot.traffic == controller.TrafficSplit("v2", "v1", 25.0)
        started = trio.current_time()
        status = ctl.status("a").rollout
        assert status is not None
        assert status.canary is not None
        assert (status.canary.phase, status.canary.step, status.canary.stable_revision) == (
            "judging",
            1,
            1,
        )
        report(ctl, v2=tally(20), v1=tally(60))
        await trio.sleep(59.9)
        assert ctl.snapshot("a").traffic == controller.TrafficSplit("v2", "v1", 25.0)
        await trio.sleep_until(started + 60)
        await settle()
        # Step 2: 50% of 4 = 2 canary replicas, the stable still at 4.
        assert ctl.snapshot("a").traffic == controller.TrafficSplit("v2", "v1", 50.0)
        assert versions(ctl) == {"v1": 4, "v2": 2}
        second = trio.current_time()
        report(ctl, v2=tally(30), v1=tally(30))
        await trio.sleep_until(second + 60)
        await goal.wait()
        assert goal.outcome is GoalOutcome.COMPLETED
        assert versions(ctl) == {"v2": 4}
        assert ctl.snapshot("a").traffic is None
        assert [(r.number, r.outcome, r.canary_of) for r in ctl.revisions("a")] == [
            (1, "complete", None),
            (2, "complete", 1),
        ]
        assert len(events(ctl, "CanaryStepPassed")) == 1
        (promoted,) = events(ctl, "CanaryPromoted")
        assert "every step passed" in promoted
        assert "canary 30 requests" in promoted


async def test_the_canarys_numbers_have_one_writer_its_loop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def counted(ctl: controller.Controller) -> tuple[int, int]:
        rollout = ctl.status("a").rollout
        assert rollout is not None
        assert rollout.canary is not None
        return rollout.canary.canary.requests, rollout.canary.stable.requests

    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        await v2_as_canary(ctl)
        report(ctl, v2=tally(20), v1=tally(60))
        # The report waits in the loop's channel: nothing but the loop adds to the numbers.
        assert counted(ctl) == (0, 0)
        await settle()
        assert counted(ctl) == (20, 60)


async def test_a_canary_that_fails_the_error_gate_is_aborted_and_rolled_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        goal = await v2_as_canary(ctl)
        await trio.sleep(5)
        # A fifth of the canary's requests fail: aborted at once, before the pause ends.
        report(ctl, v2=tally(20, errors=4), v1=tally(60))
        await settle()
        assert ctl.snapshot("a").traffic in (None, controller.TrafficSplit("v2", "v1", 0.0))
        await ended(goal)
        assert goal.outcome is GoalOutcome.FAILED
        assert goal.error is not None
        assert "error rate 20.0% > stable 0.0% + 1.0%" in goal.error
        await ctl.wait_until(
            lambda c: versions(c) == {"v1": 4} and len(c.status("a").replicas) == 4
        )
        revisions = ctl.revisions("a")
        assert [(r.number, r.outcome, r.restores, r.automatic) for r in revisions] == [
            (1, "complete", None, False),
            (2, "failed", None, False),
            (3, "complete", 1, True),
        ]
        assert revisions[1].error is not None
        assert "canary 20 requests, 4 errors" in revisions[1].error
        assert "back to revision 1, the stable one" in revisions[1].error
        assert ctl.snapshot("a").traffic is None


async def test_a_slow_canary_fails_the_latency_gate(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        goal = await v2_as_canary(ctl)
        report(ctl, v2=tally(20, seconds=0.2), v1=tally(60, seconds=0.1))
        await ended(goal)
        assert goal.error is not None
        assert "p99" in goal.error
        await ctl.wait_until(lambda c: versions(c) == {"v1": 4})


async def test_no_verdict_waits_past_the_pause_then_fails_at_the_progress_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        await stable_v1(ctl)
        started = trio.current_time()
        goal = await ctl.deploy("a", canary_config(version="v2", progress_deadline_s=300), RC)
        report(ctl, v2=tally(3), v1=tally(60))
        await ended(goal)
        assert goal.error is not None
        assert "no verdict within progress_deadline_s=300" in goal.error
        assert trio.current_time() - started == pytest.approx(300)


async def test_a_person_promotes_and_aborts(autojump_clock: trio.testing.MockClock) -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        await stable_v1(ctl)
        with pytest.raises(RolloutError, match="no canary release being judged"):
            await ctl.promote("a")
        goal = await ctl.deploy("a", canary_config(version="v2"), RC)
        await settle()
        await ctl.promote("a", via="cli")
        await goal.wait()
        assert goal.outcome is GoalOutcome.COMPLETED
        assert versions(ctl) == {"v2": 4}
        (promoted,) = events(ctl, "CanaryPromoted")
        assert "promoted by a person (cli) at step 1" in promoted
        goal = await ctl.deploy("a", canary_config(version="v3"), RC)
        await settle()
        await ctl.abort("a", via="cli")
        await ended(goal)
        assert goal.error is not None
        assert "aborted by a person (cli) at step 1" in goal.error
        await ctl.wait_until(
            lambda c: versions(c) == {"v2": 4} and len(c.status("a").replicas) == 4
        )


async def test_a_pause_holds_the_step_and_a_resume_goes_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        await v2_as_canary(ctl)
        report(ctl, v2=tally(20), v1=tally(60))
        await trio.sleep(30)
        await ctl.pause("a")
        await trio.sleep(600)
        status = ctl.status("a").rollout
        assert status is not None
        assert status.canary is not None
        assert (status.canary.phase, status.canary.step) == ("held", 1)
        assert status.canary.elapsed_s == pytest.approx(30)
        resumed = trio.current_time()
        await ctl.resume("a")
        await trio.sleep(29.9)
        assert ctl.snapshot("a").traffic == controller.TrafficSplit("v2", "v1", 25.0)
        await trio.sleep_until(resumed + 30)
        await settle()
        assert ctl.snapshot("a").traffic == controller.TrafficSplit("v2", "v1", 50.0)


async def test_a_restart_mid_canary_goes_on_at_the_same_step() -> None:
    rt = FakeRuntime(auto_ready=True)
    store = controller.MemoryStore()
    steps = [{"weight": 25, "pause_s": 0}, {"weight": 50, "pause_s": 3600}]
    with trio.fail_after(20):
        async with opened(rt, store) as ctl:
            await stable_v1(ctl)
            await ctl.deploy("a", canary_config(version="v2", canary={"steps": steps}), RC)
            await ctl.wait_until(lambda c: versions(c) == {"v1": 4, "v2": 1})
            report(ctl, v2=tally(20), v1=tally(60))
            await ctl.wait_until(lambda c: versions(c) == {"v1": 4, "v2": 2})
            tags = {r.tag for r in ctl.status("a").replicas}
        async with opened(rt, store) as ctl:
            await ctl.wait_until(lambda c: versions(c) == {"v1": 4, "v2": 2})
            status = ctl.status("a").rollout
            assert status is not None
            assert status.canary is not None
            assert (status.canary.step, status.canary.weight, status.canary.phase) == (
                2,
                50.0,
                "judging",
            )
            assert status.canary.elapsed_s is not None
            assert status.canary.elapsed_s < 20
            assert ctl.snapshot("a").traffic == controller.TrafficSplit("v2", "v1", 50.0)
            assert {r.tag for r in ctl.status("a").replicas} == tags  # adopted, none restarted


async def test_a_scale_during_a_canary_scales_both_revisions(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        await v2_as_canary(ctl)
        assert versions(ctl) == {"v1": 4, "v2": 1}
        await ctl.scale("a", 8)
        await ctl.wait_until(lambda c: versions(c) == {"v1": 8, "v2": 2})
        await ctl.scale("a", 2)
        await ctl.wait_until(
            lambda c: versions(c) == {"v1": 2, "v2": 1} and len(c.status("a").replicas) == 3
        )
        status = ctl.status("a").rollout
        assert status is not None
        assert status.canary is not None
        assert (status.canary.phase, status.canary.weight) == ("judging", 25.0)
        # The state says the canary, not the scale.
        assert (ctl.status("a").state, ctl.status("a").reason) == (
            controller.BackendState.UPDATING,
            "Canary",
        )


async def test_a_deploy_during_a_canary_is_judged_against_the_same_stable_revision(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        await v2_as_canary(ctl)
        goal = await ctl.deploy("a", canary_config(version="v3"), RC)
        await ctl.wait_until(lambda c: versions(c) == {"v1": 4, "v3": 1})
        assert [(r.number, r.outcome, r.canary_of) for r in ctl.revisions("a")] == [
            (1, "complete", None),
            (2, "superseded", 1),
            (3, "in_progress", 1),
        ]
        await ctl.promote("a")
        await goal.wait()
        assert versions(ctl) == {"v3": 4}


async def test_no_canary_for_a_first_revision_or_a_change_of_user_config_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        await stable_v1(ctl)
        goal = await ctl.deploy("a", canary_config(user_config={"x": 1}), RC)
        await goal.wait()
        first, second = ctl.revisions("a")
        assert first.canary_skipped is not None
        assert "no revision has completed" in first.canary_skipped
        assert second.canary_skipped is not None
        assert "keep version 'v1'" in second.canary_skipped
        assert ctl.snapshot("a").traffic is None


async def test_a_canary_whose_replicas_cannot_start_goes_back_to_stable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        await stable_v1(ctl)
        rt.failing_starts = {"v2"}
        # on_failure is "halt" (the default): a canary goes back all the same.
        goal = await ctl.deploy("a", canary_config(version="v2"), RC)
        await ended(goal)
        assert goal.error is not None
        assert "consecutive replica starts failed" in goal.error
        assert "the canary is aborted: back to revision 1" in goal.error
        await ctl.wait_until(lambda c: c.status("a").rollout.revision == 3)  # type: ignore[union-attr]
        await ctl.wait_until(
            lambda c: versions(c) == {"v1": 4} and len(c.status("a").replicas) == 4
        )
        assert [r.outcome for r in ctl.revisions("a")] == ["complete", "failed", "complete"]


async def test_a_canary_block_taken_out_promotes_and_a_delete_ends_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        goal = await v2_as_canary(ctl)
        assert versions(ctl) == {"v1": 4, "v2": 1}
        goal = await ctl.deploy("a", config(num_replicas=4, version="v2"), RC)
        await goal.wait()
        assert versions(ctl) == {"v2": 4}
        (promoted,) = events(ctl, "CanaryPromoted")
        assert "the canary block was taken out of the config" in promoted
        await ctl.deploy("a", canary_config(version="v3"), RC)
        await ctl.wait_until(lambda c: versions(c) == {"v2": 4, "v3": 1})
        await (await ctl.delete("a")).wait()
        assert "a" not in ctl.backend_names()


async def grown_by_load(ctl: controller.Controller) -> None:
    """An autoscaled v1 (4 to 8 replicas), v2 as its canary at 25 %, then load that takes the
    backend to 8: 8 of v1 and 2 of v2."""
    auto = {"min_replicas": 4, "max_replicas": 8, "target_ongoing_requests": 2}
    await (await ctl.deploy("a", canary_config(autoscaling=auto), RC)).wait()
    await ctl.deploy("a", canary_config(version="v2", autoscaling=auto), RC)
    await ctl.wait_until(lambda c: versions(c) == {"v1": 4, "v2": 1})
    busy = {r.tag: 10 for r in ctl.status("a").replicas}
    ctl.report_load(LoadReport("test", "a", busy, 0))
    await ctl.wait_until(lambda c: versions(c) == {"v1": 8, "v2": 2})


async def test_an_autoscaled_canary_grows_with_the_backend(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        await grown_by_load(ctl)
        status = ctl.status("a").rollout
        assert status is not None
        assert status.canary is not None
        assert status.canary.phase == "judging"


async def test_an_autoscaled_canary_restarted_keeps_every_replica(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The canary's share is of the count its pass decides: a restart once split the replicas by
    # the config's num_replicas (4: one canary replica), drained a healthy canary replica, and
    # started another one pass later.
    rt, store = FakeRuntime(auto_ready=True), controller.MemoryStore()
    async with opened(rt, store) as ctl:
        await grown_by_load(ctl)
        tags = {r.tag for r in ctl.status("a").replicas}
        starts = rt.start_calls
    async with opened(rt, store) as ctl:
        await ctl.wait_until(lambda c: versions(c) == {"v1": 8, "v2": 2})
        await trio.sleep(5)  # virtual time: the passes after the first
        assert {r.tag for r in ctl.status("a").replicas} == tags
        assert rt.start_calls == starts


async def test_a_canary_replica_that_dies_aborts_the_canary(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        await stable_v1(ctl)
        goal = await ctl.deploy("a", canary_config(version="v2"), RC)
        await ctl.wait_until(lambda c: versions(c) == {"v1": 4, "v2": 1})
        (tag,) = [r.tag for r in ctl.status("a").replicas if r.version == "v2"]
        rt.crash(tag, "segfault")
        await ended(goal)
        assert goal.error is not None
        assert f"step 1: replica {tag} of the canary died: segfault" in goal.error
        await ctl.wait_until(lambda c: c.status("a").rollout.revision == 3)  # type: ignore[union-attr]


async def test_a_canary_replica_replaced_as_unhealthy_aborts_the_canary_at_the_threshold(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A failed check below the threshold keeps the canary going; the check that reaches it
    replaces the replica and aborts the canary."""
    rt = FakeRuntime(auto_ready=True)
    checks = {"health_check_period_s": 1.0, "health_check_failure_threshold": 3}
    async with opened(rt) as ctl:
        await (await ctl.deploy("a", canary_config(**checks), RC)).wait()
        goal = await ctl.deploy("a", canary_config(version="v2", **checks), RC)
        await ctl.wait_until(lambda c: versions(c) == {"v1": 4, "v2": 1})
        (tag,) = [r.tag for r in ctl.status("a").replicas if r.version == "v2"]
        rt.replicas[tag].health_error = ("RuntimeError", "leaks memory")
        err = "RuntimeError: leaks memory"
        await ctl.wait_until(lambda c: any("check 2/3" in m for m in events(c, "Unhealthy")))
        assert ctl.status("a").rollout.canary.phase == "judging"  # type: ignore[union-attr]
        await ended(goal)
        assert goal.error is not None
        assert f"step 1: replica {tag} of the canary unhealthy: RuntimeError" in goal.error
        said = events(ctl, "Unhealthy")
        assert [m for m in said if "health check" in m][-1].endswith("check 3/3 failed: " + err)
        assert said[-1] == f"replica {tag}: unhealthy: {err}; no new start until the next deploy"
        await ctl.wait_until(lambda c: c.status("a").rollout.revision == 3)  # type: ignore[union-attr]


async def test_a_restart_waits_for_the_canary_and_is_a_canary_itself(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        goal = await v2_as_canary(ctl)
        with pytest.raises(RolloutError, match="in a canary release: promote or abort it first"):
            await ctl.restart("a")
        await ctl.promote("a")
        await goal.wait()
        goal = await ctl.restart("a")
        await settle()
        restarted = ctl.revisions("a")[-1]
        assert (restarted.restarts, restarted.canary_of) == (2, 2)
        assert versions(ctl) == {"v2": 4, f"v2+restart.{restarted.code_generation}": 1}
        await ctl.promote("a")
        await goal.wait()


async def test_a_paused_step_keeps_its_clock_across_a_restart(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        await v2_as_canary(ctl)
        await trio.sleep(30)
        await ctl.pause("a")
        await trio.sleep(100)
    async with opened(rt, store) as ctl:
        await ctl.wait_until(lambda c: versions(c) == {"v1": 4, "v2": 1})
        await trio.sleep(50)
        status = ctl.status("a").rollout
        assert status is not None
        assert status.canary is not None
        assert (status.canary.phase, status.canary.step) == ("held", 1)
        assert status.canary.elapsed_s == pytest.approx(30)


async def test_a_restart_mid_step_keeps_its_clock_in_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Found by held-out tests: the step's start was stored by the wall clock, so under
    MockClock a restart after 100 virtual seconds found 0.06 s elapsed. The controller's wall
    clock follows the MockClock: the step keeps its start, and the time no controller ran
    counts, as it does for real."""
    rt = FakeRuntime(auto_ready=True)
    store = controller.MemoryStore()
    slow = {"steps": [{"weight": 25, "pause_s": 3600}]}
    async with opened(rt, store) as ctl:
        await stable_v1(ctl)
        await ctl.deploy("a", canary_config(version="v2", canary=slow), RC)
        await ctl.wait_until(lambda c: versions(c) == {"v1": 4, "v2": 1})
        await trio.sleep(100)
        before = ctl.status("a").rollout
        assert before is not None
        assert before.canary is not None
        assert before.canary.elapsed_s == pytest.approx(100, abs=1)
        started = before.canary.step_started
        assert started is not None
    await trio.sleep(50)  # no controller runs meanwhile
    async with opened(rt, store) as ctl:
        await ctl.wait_until(lambda c: versions(c) == {"v1": 4, "v2": 1})
        status = ctl.status("a").rollout
        assert status is not None
        assert status.canary is not None
        assert (status.canary.phase, status.canary.step) == ("judging", 1)
        assert status.canary.elapsed_s == pytest.approx(150, abs=1)
        assert status.canary.step_started == pytest.approx(started, abs=0.01)


async def test_the_routing_an_ingress_uses_is_public(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from controller.ingress import ControllerSource, Ingress, RouteInfo, Split

    async with opened(FakeRuntime(auto_ready=True)) as ctl, trio.open_nursery() as nursery:
        await (await ctl.deploy("a", canary_config(route_prefix="/a"), RC)).wait()
        await ctl.deploy("a", canary_config(version="v2", route_prefix="/a"), RC)
        await ctl.wait_until(lambda c: versions(c) == {"v1": 4, "v2": 1})
        ingress = Ingress(ControllerSource(ctl))
        await nursery.start(ingress.run)
        await settle()
        route = ingress.routes()["a"]
        assert isinstance(route, RouteInfo)
        assert route.split == Split("v2", "v1", 25.0)
        serving = {r.tag: r.version for r in ctl.status("a").replicas}
        assert dict(route.versions) == serving
        assert {tag for tag, _ in route.replicas} == set(serving)
        nursery.cancel_scope.cancel()


async def test_a_backend_scaled_to_zero_holds_its_canary(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        await v2_as_canary(ctl)
        report(ctl, v2=tally(20), v1=tally(60))
        await trio.sleep(10)
        await ctl.scale("a", 0)
        await trio.sleep(600)
        status = ctl.status("a").rollout
        assert status is not None
        assert status.canary is not None
        assert status.canary.step == 1
        assert status.canary.elapsed_s == pytest.approx(10)
        await ctl.scale("a", 4)
        await ctl.wait_until(lambda c: versions(c) == {"v1": 4, "v2": 1})


async def test_a_canary_replica_gone_while_no_controller_ran_aborts_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        await stable_v1(ctl)
        await ctl.deploy("a", canary_config(version="v2"), RC)
        await ctl.wait_until(lambda c: versions(c) == {"v1": 4, "v2": 1})
        (tag,) = [r.tag for r in ctl.status("a").replicas if r.version == "v2"]
    rt.crash(tag, "segfault")  # while no controller runs
    async with opened(rt, store) as ctl:
        await ctl.wait_until(lambda c: c.status("a").rollout.revision == 3)  # type: ignore[union-attr]
        failed = ctl.revisions("a")[1]
        assert failed.outcome == "failed"
        assert failed.error is not None
        assert f"replica {tag} of the canary was gone when the controller started" in failed.error
