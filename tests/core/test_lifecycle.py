"""Rolling updates, health checks, backoff and status: each rule under MockClock, exactly."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import controller
from controller import BackendState, GoalOutcome, ReplicaState
from controller._api.metrics import Metrics
from controller._api.views import status_json
from controller._model.values.json_values import JSON
from controller.testing import FakeRuntime, FakeState

from ..conftest import DEADLOCK_LIMIT_S, RC, config, deploy_ready, opened, serving, settle

S = FakeState


def alive(rt: FakeRuntime) -> int:
    return len(rt.tags())


# -- rolling updates ----


async def test_a_10_replica_rollout_moves_in_bounded_batches(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        await deploy_ready(ctl, rt, config(num_replicas=10))
        goal = await ctl.deploy("a", config(num_replicas=10, version="v2"), RC)
        await settle()
        # 25% / 25% of 10: surge 3 (rounded up), unavailable 2 (rounded down).
        assert len(rt.tags(S.STARTING)) == 3
        assert len(ctl.snapshot("a").replicas) == 10  # nothing old goes before a new one serves
        most_alive = most_starting = 0
        least_serving = 10
        while not goal.done:
            most_alive = max(most_alive, alive(rt))
            most_starting = max(most_starting, len(rt.tags(S.STARTING)))
            least_serving = min(least_serving, len(ctl.snapshot("a").replicas))
            starting = rt.tags(S.STARTING)
            if starting:
                rt.finish_start(starting[0])
            await settle()
        # The limits bound the total (10 + surge 3) and the serving floor (10 - unavailable 2);
        # so a batch of starts is at most surge + unavailable.
        assert most_alive <= 13
        assert most_starting <= 5
        assert least_serving >= 8
        assert {r.version for r in ctl.status("a").replicas} == {"v2"}
        assert len(ctl.snapshot("a").replicas) == 10


async def test_rollout_with_scale_down_scales_down_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        await deploy_ready(ctl, rt, config(num_replicas=10))
        await ctl.deploy("a", config(num_replicas=4, version="v2"), RC)
        await settle()
        # 6 old replicas go at once; with 4 left, the surge (1) allows one new start.
        assert len(rt.tags(S.READY)) == 4
        assert len(rt.tags(S.STARTING)) == 1
        assert len(ctl.snapshot("a").replicas) == 4


async def test_rollout_with_scale_up_starts_new_replicas_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        await deploy_ready(ctl, rt, config(num_replicas=4))
        old = set(rt.tags(S.READY))
        await ctl.deploy("a", config(num_replicas=10, version="v2"), RC)
        await settle()
        # Surge 3 of 10: up to 13 in all, so 9 new start while all 4 old keep serving.
        assert len(rt.tags(S.STARTING)) == 9
        assert set(rt.tags(S.READY)) == old


async def test_a_new_deployment_starts_every_replica_at_once() -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        await ctl.deploy("a", config(num_replicas=10), RC)
        await settle()
        assert len(rt.tags(S.STARTING)) == 10


class GatedReconfigure:
    """A runtime whose reconfigures wait at a gate, counting how many are in flight at once."""

    def __init__(self, inner: FakeRuntime):
        self.inner = inner
        self.gate = trio.Event()
        self.in_flight = 0
        self.most = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def reconfigure_replica(self, tag: str, user_config: JSON) -> None:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await self.gate.wait()
            await self.inner.reconfigure_replica(tag, user_config)
        finally:
            self.in_flight -= 1


async def test_reconfigures_are_throttled_by_max_unavailable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gated = GatedReconfigure(FakeRuntime(auto_ready=True))
    async with opened(gated) as ctl:  # type: ignore[arg-type]  # duck-typed runtime
        await (await ctl.deploy("a", config(num_replicas=10, user_config=1), RC)).wait()
        goal = await ctl.deploy("a", config(num_replicas=10, user_config=2), RC)
        await settle()
        assert gated.in_flight == 2  # floor(25% of 10)
        counts = ctl.status("a").counts
        assert counts == {ReplicaState.UPDATING: 2, ReplicaState.RUNNING: 8}
        while not goal.done:
            gated.gate.set()
            gated.gate = trio.Event()
            await settle()
        assert gated.most == 2
        assert all(r.user_config == 2 for r in gated.inner.replicas.values())
        assert len(gated.inner.replicas) == 10  # in place: no restart


async def test_a_redeploy_during_a_stuck_rollout_supersedes_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        await deploy_ready(ctl, rt, config(num_replicas=4, start_timeout_s=600))
        old = set(rt.tags(S.READY))
        stuck = await ctl.deploy("a", config(num_replicas=4, version="v2", start_timeout_s=600), RC)
        await settle()
        v2 = rt.tags(S.STARTING)
        assert len(v2) == 1  # surge 1 of 4; its start hangs
        await trio.sleep(100)
        fixed = await ctl.deploy("a", config(num_replicas=4, version="v3"), RC)
        assert await stuck.wait() is GoalOutcome.SUPERSEDED
        await settle()
        assert rt.replicas[v2[0]].state is S.DEAD  # the stuck v2 start was cancelled and killed
        assert set(rt.tags(S.READY)) == old  # v1 still serving
        while not fixed.done:
            for tag in rt.tags(S.STARTING):
                rt.finish_start(tag)
            await settle()
        assert {r.version for r in ctl.status("a").replicas} == {"v3"}


# -- failures, backoff and DEPLOY_FAILED ----


async def test_a_constructor_that_always_fails_leaves_the_old_version_serving(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        await deploy_ready(ctl, rt, config(num_replicas=3))
        old = set(rt.tags(S.READY))
        t0 = trio.current_time()
        goal = await ctl.deploy("a", config(num_replicas=3, version="v2"), RC)
        started: list[float] = []
        for _ in range(3):
            await rt.wait_until(lambda r: bool(r.tags(S.STARTING)))
            (tag,) = rt.tags(S.STARTING)
            started.append(rt.replicas[tag].started_at - t0)
            rt.fail_start(tag, "ImportError", "no module named app")
        # Each retry waited out the backoff: 1 s, then 2 s.
        assert started == [0, 1, 3]
        with pytest.raises(controller.GoalFailed, match="ImportError: no module named app"):
            await goal.wait()
        await trio.sleep(3600)
        status = ctl.status("a")
        assert status.state is BackendState.DEPLOY_FAILED
        assert status.reason == "StartFailures"
        assert set(rt.tags()) == old  # no new start, and no healthy replica replaced
        assert {r.tag for r in ctl.snapshot("a").replicas} == old
        assert "3 failed to start: ImportError: no module named app" in status.message


async def test_a_constructor_that_fails_for_some_replicas_still_converges(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        goal = await ctl.deploy("a", config(num_replicas=4), RC)
        fail_next = True
        while not goal.done:
            await rt.wait_until(lambda r: bool(r.tags(S.STARTING)) or goal.done)
            for tag in rt.tags(S.STARTING):
                if fail_next:
                    rt.fail_start(tag, "OSError", "port in use")
                else:
                    rt.finish_start(tag)
                fail_next = not fail_next
            await settle()
        assert await goal.wait() is GoalOutcome.COMPLETED
        assert ctl.status("a").state is BackendState.HEALTHY


async def test_a_constructor_that_fails_only_at_first_recovers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        t0 = trio.current_time()
        goal = await ctl.deploy("a", config(num_replicas=1), RC)
        for _ in range(2):
            await rt.wait_until(lambda r: bool(r.tags(S.STARTING)))
            rt.fail_start(rt.tags(S.STARTING)[0], "ConnectionError", "database not up yet")
        await rt.wait_until(lambda r: bool(r.tags(S.STARTING)))
        assert trio.current_time() == t0 + 1 + 2
        rt.finish_start(rt.tags(S.STARTING)[0])
        assert await goal.wait() is GoalOutcome.COMPLETED


async def test_a_crash_loop_backs_off_exponentially_to_a_cap_and_resets(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    policy = controller.RestartPolicy(jitter=0.0, max_delay_s=8.0, reset_after_s=100.0)
    async with opened(rt, policy=policy) as ctl:
        await (await ctl.deploy("a", config(num_replicas=1), RC)).wait()
        starts: list[float] = []
        for _ in range(6):
            (tag,) = rt.tags(S.READY)
            rt.crash(tag)
            # Wait until the controller serves the replacement, not merely until the runtime has
            # it ready: a death before the controller has seen it ready is a failed start, and
            # three of those in a row would (rightly) fail the deploy.
            await serving(ctl, "a", 0)
            await serving(ctl, "a", 1)
            starts.append(trio.current_time())
        gaps = [round(b - a, 6) for a, b in zip([0.0, *starts], starts, strict=False)][1:]
        # 1, 2, 4, 8, then capped at 8 (each crash happens right after the replica started).
        assert gaps == [2.0, 4.0, 8.0, 8.0, 8.0]
        assert starts[0] == 1.0
        # Healthy for longer than reset_after_s: the next crash waits 1 s again.
        await trio.sleep(101)
        t = trio.current_time()
        (tag,) = rt.tags(S.READY)
        rt.crash(tag)
        await serving(ctl, "a", 0)
        await serving(ctl, "a", 1)
        assert trio.current_time() == t + 1.0


async def test_jitter_shortens_the_backoff_within_bounds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    policy = controller.RestartPolicy(jitter=0.5, initial_delay_s=10.0)
    async with opened(rt, policy=policy) as ctl:
        await (await ctl.deploy("a", config(num_replicas=1), RC)).wait()
        t = trio.current_time()
        rt.crash(rt.tags(S.READY)[0])
        await rt.wait_until(lambda r: len(r.tags(S.READY)) == 1)
        assert 5.0 <= trio.current_time() - t <= 10.0


async def test_delete_and_shutdown_are_never_blocked_by_a_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    policy = controller.RestartPolicy(jitter=0.0, initial_delay_s=3600.0)
    async with opened(rt, policy=policy) as ctl:
        await (await ctl.deploy("a", config(num_replicas=2), RC)).wait()
        await (await ctl.deploy("b", config(num_replicas=1), RC)).wait()
        rt.crash(rt.tags()[0])
        rt.crash(next(t for t in rt.tags() if t.startswith("b#")))
        await settle()
        t = trio.current_time()
        await (await ctl.delete("a")).wait()
        assert trio.current_time() == t  # no wait for the hour-long backoff
    # Leaving the controller while "b" backs off returns at once too.
    assert trio.current_time() == t


# -- health checks ----


async def test_health_checks_run_on_schedule_and_replace_after_the_threshold(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True, auto_drain=False)
    cfg = config(num_replicas=2, health_check_period_s=10, graceful_shutdown_timeout_s=5)
    async with opened(rt) as ctl:
        t0 = trio.current_time()
        await (await ctl.deploy("a", cfg, RC)).wait()
        sick, well = rt.tags()
        rt.replicas[sick].health_error = ("RuntimeError", "db connection lost")
        await rt.wait_until(lambda r: len(r.replicas[sick].health_checks) == 3)
        assert rt.replicas[sick].health_checks == [t0 + 10, t0 + 20, t0 + 30]
        await settle()
        # Past the threshold (3): out of the snapshot first, then drained (bounded), replaced.
        assert sick not in {r.tag for r in ctl.snapshot("a").replicas}
        assert rt.replicas[sick].state is S.DRAINING
        assert rt.replicas[sick].drain_requested_at == t0 + 30
        assert "unhealthy: RuntimeError: db connection lost" in (ctl.status("a").last_error or "")
        await rt.wait_until(lambda r: r.replicas[sick].state is S.DEAD)
        assert rt.replicas[sick].killed_at == t0 + 35
        await rt.wait_until(lambda r: len(r.tags(S.READY)) == 2)
        assert rt.replicas[well].health_checks[:3] == [t0 + 10, t0 + 20, t0 + 30]
        await settle()
        assert ctl.status("a").last_error is None  # replaced: healthy again


#: Checks every 10 s that may hang 30 s, ten failures before a replacement, a slow start
#: allowed: a hung check is late at each period in between.
PATIENT = config(
    health_check_period_s=10,
    health_check_timeout_s=30,
    health_check_failure_threshold=10,
    start_timeout_s=600,
)


async def test_no_health_check_before_ready_and_never_two_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    cfg = PATIENT
    async with opened(rt) as ctl:
        await ctl.deploy("a", cfg, RC)
        await settle()
        (tag,) = rt.tags(S.STARTING)
        await trio.sleep(100)
        assert rt.replicas[tag].health_checks == []  # none while starting
        rt.finish_start(tag)
        t0 = trio.current_time()
        await settle()
        rt.replicas[tag].health_hangs = True
        await trio.sleep(95)
        # A check at +10 hangs until its timeout at +40; the ones due at +20 and +30 are late
        # (failed, not sent); at +40 the next is sent as the hung one times out; and so on.
        assert rt.replicas[tag].health_checks == [t0 + 10, t0 + 40, t0 + 70]
        status = ctl.status("a")
        assert status.replicas[0].healthy is False
        assert status.state is BackendState.UNHEALTHY


async def ready_then_hung(
    ctl: controller.Controller, rt: FakeRuntime, cfg: controller.BackendConfig
) -> tuple[str, float]:
    """Backend "a" deployed with `cfg`, its one replica ready, then its health checks hanging:
    the replica's tag, and when it became ready."""
    await ctl.deploy("a", cfg, RC)
    await settle()
    (tag,) = rt.tags(S.STARTING)
    rt.finish_start(tag)
    t0 = trio.current_time()
    await settle()
    rt.replicas[tag].health_hangs = True
    return tag, t0


async def test_late_checks_at_the_threshold_replace_the_replica_after_a_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A late check counts as failed in the pass that finds it late: at the threshold, that
    pass replaces the replica, and its replacement waits out the backoff the failure drew."""
    rt = FakeRuntime()
    cfg = config(
        health_check_period_s=10, health_check_timeout_s=30, health_check_failure_threshold=2
    )
    async with opened(rt, policy=controller.RestartPolicy(initial_delay_s=5, jitter=0)) as ctl:
        tag, t0 = await ready_then_hung(ctl, rt, cfg)
        # Sent at +10 (it hangs), late at +20 (1 of 2) and at +30 (2 of 2): replaced then.
        await trio.sleep_until(t0 + 30)
        await settle()
        assert tag not in {r.tag for r in ctl.status("a").replicas}  # stopped at once
        events = [e.message for e in ctl.status("a").events if e.kind == "Unhealthy"]
        late = "HealthCheckLate: no answer within health_check_period_s=10"
        assert events[-1] == f"replica {tag}: unhealthy: {late}; next start in 5s"
        assert rt.tags(S.STARTING) == []
        await trio.sleep_until(t0 + 35)
        await settle()
        assert len(rt.tags(S.STARTING)) == 1  # the replacement, once the backoff is over


async def test_late_checks_are_counted_in_the_daemons_metrics(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Found by a trial: a check failed as late makes no call to the runtime, so the histogram
    # that times calls never saw it; a hung check looked, on /metrics, like no check at all.
    rt = FakeRuntime()
    metrics = Metrics()
    cfg = PATIENT

    def late() -> dict[str, float]:
        return {
            sample.labels["backend"]: sample.value
            for family in metrics.registry.collect()
            if family.name == "controller_health_checks_late"
            for sample in family.samples
            if sample.name.endswith("_total")
        }

    with trio.fail_after(DEADLOCK_LIMIT_S):
        async with controller.open_controller(
            runtime=rt, store=controller.MemoryStore(), observer=metrics
        ) as ctl:
            tag, t0 = await ready_then_hung(ctl, rt, cfg)
            await trio.sleep_until(t0 + 95)
            await settle()
            # Sent at +10, +40 and +70 (each hung until its timeout); late at +20, +30, +50,
            # +60, +80 and +90.
            assert rt.replicas[tag].health_checks == [t0 + 10, t0 + 40, t0 + 70]
            assert late() == {"a": 6}
            await (await ctl.delete("a", force=True)).wait()
            await settle()
            assert late() == {}  # a deleted backend's series go with it


async def test_checks_due_close_together_are_taken_together_each_on_its_own_cadence(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A check that comes due takes with it the backend's checks due within a tenth of the
    # period (at most 1 s), a little early: one timer, wave and pass for them all. Each keeps
    # its own cadence: the next is a period after it was due, so the group forms again.
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        t0 = trio.current_time()
        await (await ctl.deploy("a", config(num_replicas=1, health_check_period_s=10), RC)).wait()
        await trio.sleep_until(t0 + 0.5)
        await (await ctl.deploy("a", config(num_replicas=2, health_check_period_s=10), RC)).wait()
        await trio.sleep_until(t0 + 2.5)
        await (await ctl.deploy("a", config(num_replicas=3, health_check_period_s=10), RC)).wait()
        first, second, third = rt.tags()
        assert rt.replicas[second].ready_at == t0 + 0.5
        await trio.sleep_until(t0 + 33)
        await settle()
        assert rt.replicas[first].health_checks == [t0 + 10, t0 + 20, t0 + 30]
        assert rt.replicas[second].health_checks == [t0 + 10, t0 + 20, t0 + 30]  # 0.5 s early
        assert rt.replicas[third].health_checks == [t0 + 12.5, t0 + 22.5, t0 + 32.5]  # apart


async def test_checks_due_together_answer_each_on_its_own(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Replicas that started together are checked in one wave, which shares a deadline: a hung
    # check must not hold back the verdict on the others.
    rt = FakeRuntime(auto_ready=True)
    cfg = config(num_replicas=3, health_check_period_s=10, health_check_timeout_s=5)
    async with opened(rt) as ctl:
        t0 = trio.current_time()
        await (await ctl.deploy("a", cfg, RC)).wait()
        hung, sick, well = rt.tags()
        rt.replicas[hung].health_hangs = True
        rt.replicas[sick].health_error = ("RuntimeError", "disk full")

        def serving() -> set[str]:
            return {r.tag for r in ctl.snapshot("a").replicas}

        await trio.sleep_until(t0 + 10)
        await settle()
        assert all(rt.replicas[t].health_checks == [t0 + 10] for t in (hung, sick, well))
        assert serving() == {hung, well}  # the failure is acted on at once
        # READY counts what serves: a replica out of routing is out of it too, in the status,
        # its summary (for a listing: no replica walked), its JSON and the charts' numbers.
        assert ctl.status("a").ready == ctl.summary("a").ready == 2
        assert status_json(ctl.summary("a"))["ready_of_version"] == 2
        # And says why, though the replica is not replaced yet (one failure of three).
        assert ctl.status("a").last_error == "unhealthy: RuntimeError: disk full"
        assert [n.ready for n in ctl.numbers()] == [2]
        await trio.sleep_until(t0 + 14.9)
        await settle()
        assert serving() == {hung, well}
        await trio.sleep_until(t0 + 15)
        await settle()
        assert serving() == {well}  # the hung one at its own timeout
        status = {r.tag: r.healthy for r in ctl.status("a").replicas}
        assert status == {hung: False, sick: False, well: True}
        assert status_json(ctl.status("a"))["ready"] == 1
        assert status_json(ctl.status("a"))["counts"] == {"RUNNING": 3}
        rt.replicas[hung].health_hangs = False
        rt.replicas[sick].health_error = None
        await trio.sleep_until(t0 + 20)
        await settle()
        assert ctl.summary("a").ready == 3  # back once a check passes
        assert ctl.status("a").last_error is None


async def test_health_checks_can_be_turned_off(autojump_clock: trio.testing.MockClock) -> None:
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        await (await ctl.deploy("a", config(health_check_period_s=0), RC)).wait()
        await trio.sleep(1000)
        assert all(r.health_checks == [] for r in rt.replicas.values())
        # On, then off again by a redeploy: what the old spec scheduled does not run.
        await (await ctl.deploy("a", config(health_check_period_s=10), RC)).wait()
        await trio.sleep(25)
        await (await ctl.deploy("a", config(health_check_period_s=0), RC)).wait()
        await trio.sleep(1000)
        (replica,) = rt.replicas.values()
        assert len(replica.health_checks) == 2


# -- status ----


async def test_status_states_reasons_and_events(autojump_clock: trio.testing.MockClock) -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        await ctl.deploy("a", config(num_replicas=2), RC)
        await settle()
        status = ctl.status("a")
        assert (status.state, status.reason) == (BackendState.UPSCALING, "ScaleUp")
        assert status.observed_generation == status.generation == 1
        for tag in rt.tags(S.STARTING):
            rt.finish_start(tag)
        await settle()
        assert (ctl.status("a").state, ctl.status("a").reason) == (
            BackendState.HEALTHY,
            "Converged",
        )
        await ctl.deploy("a", config(num_replicas=1), RC)
        assert ctl.status("a").state is BackendState.DOWNSCALING
        await settle()
        await ctl.deploy("a", config(num_replicas=1, version="v2"), RC)
        await settle()
        status = ctl.status("a")
        assert (status.state, status.reason) == (BackendState.UPDATING, "NewVersion")
        assert status.counts_by_version == {
            ("v1", ReplicaState.RUNNING): 1,
            ("v2", ReplicaState.STARTING): 1,
        }
        assert (
            status.message == "0/1 replica of version v2 running; 1 starting; 1 of an older version"
        )
        await ctl.deploy("a", config(num_replicas=1, version="v2", user_config=1), RC)
        assert ctl.status("a").reason == "NewUserConfig"
        await ctl.delete("a")
        assert (ctl.status("a").state, ctl.status("a").reason) == (
            BackendState.DELETING,
            "Deleting",
        )
        kinds = [e.kind for e in ctl.status("a").events]
        assert kinds[0] == "Deploy"
        assert {"Scale", "Ready", "Delete"} <= set(kinds)


async def test_failures_after_the_goal_back_off_and_heal_without_a_redeploy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The goal was reached (the version proved it can start); then the replica crashed and
    # every restart failed for a while. That is a sick backend, not a failed deploy: it keeps
    # backing off and trying, and heals on its own once starts work again.
    rt = FakeRuntime()
    cfg = config(num_replicas=1, start_timeout_s=30)
    async with opened(rt) as ctl:
        goal = await deploy_ready(ctl, rt, cfg)
        rt.crash(rt.tags(FakeState.READY)[0])
        await trio.sleep(120)  # three restarts time out
        status = ctl.status("a")
        assert (status.state, status.reason) == (BackendState.UNHEALTHY, "ReplicaFailures")
        assert goal.outcome is controller.GoalOutcome.COMPLETED
        rt.auto_ready = True
        for tag in rt.tags(FakeState.STARTING):
            rt.finish_start(tag)
        await serving(ctl, "a", 1)
        assert ctl.status("a").state is BackendState.HEALTHY
