"""The controller's semantics, driven through FakeRuntime under trio's MockClock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import controller
from controller import GoalFailed, GoalOutcome, ReplicaState
from controller._model.values.json_values import JSON
from controller.testing import FakeRuntime, FakeState

from ..conftest import RC, config, deploy_ready, opened, settle


def states(ctl: controller.Controller, name: str) -> dict[str, ReplicaState]:
    return {r.tag: r.state for r in ctl.status(name).replicas}


async def test_deploy_reaches_the_goal(autojump_clock: trio.testing.MockClock) -> None:
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        goal = await ctl.deploy("a", config(num_replicas=3), RC)
        assert await goal.wait() is GoalOutcome.COMPLETED
        status = ctl.status("a")
        assert [r.state for r in status.replicas] == [ReplicaState.RUNNING] * 3
        assert {r.version for r in status.replicas} == {"v1"}
        assert all(r.tag.startswith("a#") for r in status.replicas)
        assert status.message == "3/3 replicas of version v1 running"
        assert sorted(rt.tags(FakeState.READY)) == sorted(r.tag for r in status.replicas)


async def test_same_spec_again_returns_the_same_goal_and_changes_nothing() -> None:
    rt = FakeRuntime(auto_ready=True)
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        goal = await ctl.deploy("a", config(num_replicas=2, user_config={"k": [1]}), RC)
        await goal.wait()
        await settle()  # the writer stores the "Ready" event
        writes, started = store.writes, len(rt.replicas)
        again = await ctl.deploy("a", config(num_replicas=2, user_config={"k": [1]}), RC)
        assert again is goal
        await settle()
        assert (store.writes, len(rt.replicas)) == (writes, started)
        assert ctl.status("a").generation == 1


async def test_a_different_spec_supersedes_the_pending_goal() -> None:
    rt = FakeRuntime()  # starts wait for the test
    async with opened(rt) as ctl:
        first = await ctl.deploy("a", config(num_replicas=2), RC)
        second = await ctl.deploy("a", config(num_replicas=1), RC)
        assert second is not first
        # Released, and told it was superseded, not failed.
        assert await first.wait() is GoalOutcome.SUPERSEDED
        assert first.error is None
        assert not second.done
        await settle()
        for tag in rt.tags(FakeState.STARTING):
            rt.finish_start(tag)
        assert await second.wait() is GoalOutcome.COMPLETED


async def test_scale_up_starts_all_missing_replicas_at_once() -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        await ctl.deploy("a", config(num_replicas=5), RC)
        await settle()
        assert len(rt.tags(FakeState.STARTING)) == 5
        assert set(states(ctl, "a").values()) == {ReplicaState.STARTING}
        assert ctl.status("a").message == "0/5 replicas of version v1 running; 5 starting"


async def test_scale_down_stops_starting_before_running() -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        await ctl.deploy("a", config(num_replicas=4), RC)
        await settle()
        ready = rt.tags(FakeState.STARTING)[:2]
        for tag in ready:
            rt.finish_start(tag)
        await settle()
        goal = await ctl.deploy("a", config(num_replicas=2), RC)
        assert await goal.wait() is GoalOutcome.COMPLETED
        assert sorted(states(ctl, "a")) == sorted(ready)
        assert sorted(rt.tags()) == sorted(ready)
        # The two that never became ready were killed without a drain.
        killed = [r for r in rt.replicas.values() if r.state is FakeState.DEAD]
        assert len(killed) == 2
        assert all(r.drain_requested_at is None for r in killed)


class Spy:
    """A runtime that records what the controller showed when a call reached the runtime."""

    def __init__(self, inner: FakeRuntime):
        self.inner = inner
        self.ctl: controller.Controller | None = None
        self.serving_at: dict[tuple[str, str], set[str]] = {}
        self.state_at: dict[tuple[str, str], ReplicaState] = {}

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def _record(self, call: str, tag: str) -> None:
        assert self.ctl is not None
        backend = tag.partition("#")[0]
        self.serving_at[call, tag] = {r.tag for r in self.ctl.snapshot(backend).replicas}
        self.state_at[call, tag] = states(self.ctl, backend)[tag]

    async def drain_replica(self, tag: str) -> None:
        self._record("drain", tag)
        await self.inner.drain_replica(tag)

    async def reconfigure_replica(self, tag: str, user_config: JSON) -> None:
        self._record("reconfigure", tag)
        await self.inner.reconfigure_replica(tag, user_config)


async def test_stopping_leaves_the_snapshot_before_the_drain_and_is_killed_at_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    spy = Spy(FakeRuntime(auto_ready=True, auto_drain=False))
    async with opened(spy) as ctl:  # type: ignore[arg-type]  # duck-typed runtime
        spy.ctl = ctl
        await (
            await ctl.deploy("a", config(num_replicas=2, graceful_shutdown_timeout_s=7), RC)
        ).wait()
        t0 = trio.current_time()
        goal = await ctl.deploy("a", config(num_replicas=1, graceful_shutdown_timeout_s=7), RC)
        await settle()
        (draining,) = spy.inner.tags(FakeState.DRAINING)
        assert draining not in spy.serving_at["drain", draining]
        assert len(spy.serving_at["drain", draining]) == 1
        assert spy.state_at["drain", draining] is ReplicaState.STOPPING
        await goal.wait()
        replica = spy.inner.replicas[draining]
        # The replica ignored its drain: killed exactly at the graceful-shutdown deadline.
        assert replica.drain_requested_at == t0
        assert replica.killed_at == t0 + 7.0
        assert trio.current_time() == t0 + 7.0


async def test_a_drain_that_finishes_early_is_killed_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True, auto_drain=False)
    async with opened(rt) as ctl:
        await (
            await ctl.deploy("a", config(num_replicas=1, graceful_shutdown_timeout_s=30), RC)
        ).wait()
        goal = await ctl.delete("a")
        await trio.sleep(2)
        (tag,) = rt.tags(FakeState.DRAINING)
        rt.finish_drain(tag)
        assert await goal.wait() is GoalOutcome.COMPLETED
        assert rt.replicas[tag].killed_at == rt.replicas[tag].drain_requested_at + 2  # type: ignore[operator]


async def test_forced_delete_skips_the_grace_period(autojump_clock: trio.testing.MockClock) -> None:
    rt = FakeRuntime(auto_ready=True, auto_drain=False)
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        await (
            await ctl.deploy("a", config(num_replicas=3, graceful_shutdown_timeout_s=60), RC)
        ).wait()
        t0 = trio.current_time()
        goal = await ctl.delete("a", force=True)
        await goal.wait()
        assert trio.current_time() == t0
        assert all(r.drain_requested_at is None and r.killed_at == t0 for r in rt.replicas.values())
        assert store.data == {}


async def test_delete_drains_every_replica_then_forgets_the_backend(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True, auto_drain=False)
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        await (await ctl.deploy("a", config(num_replicas=3), RC)).wait()
        goal = await ctl.delete("a")
        await settle()
        draining = rt.tags(FakeState.DRAINING)
        assert len(draining) == 3
        assert ctl.snapshot("a").replicas == ()
        for tag in draining[:2]:
            rt.finish_drain(tag)
        await settle()
        assert not goal.done  # one replica is still draining
        assert ctl.status("a").deleting
        rt.finish_drain(draining[2])
        assert await goal.wait() is GoalOutcome.COMPLETED
        with pytest.raises(controller.UnknownBackendError):
            ctl.status("a")
        assert store.data == {}
        assert not ctl.snapshot("a").exists
        assert rt.tags() == []


async def test_deploy_during_delete_takes_the_backend_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True, auto_drain=False)
    async with opened(rt) as ctl:
        await (await ctl.deploy("a", config(num_replicas=2), RC)).wait()
        deleting = await ctl.delete("a")
        await settle()
        redeploy = await ctl.deploy("a", config(num_replicas=2), RC)
        assert await deleting.wait() is GoalOutcome.SUPERSEDED
        assert await redeploy.wait() is GoalOutcome.COMPLETED
        assert len(rt.tags(FakeState.READY)) == 2
        assert ctl.status("a").generation == 3


async def test_start_timeout_stops_and_replaces_the_replica(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()  # every start hangs
    async with opened(rt) as ctl:
        t0 = trio.current_time()
        goal = await ctl.deploy("a", config(num_replicas=1, start_timeout_s=5), RC)
        await settle()
        (first,) = rt.tags(FakeState.STARTING)
        await trio.sleep(5)
        await settle()
        assert rt.replicas[first].killed_at == t0 + 5
        assert rt.tags(FakeState.STARTING) == []  # backing off after the failure
        await trio.sleep(1)
        await settle()
        (second,) = rt.tags(FakeState.STARTING)
        assert second != first
        assert rt.replicas[second].started_at == t0 + 5 + 1
        assert not goal.done
        assert "ReplicaStartTimeout" in (ctl.status("a").last_error or "")
        rt.finish_start(second)
        assert await goal.wait() is GoalOutcome.COMPLETED


async def test_repeated_start_failures_fail_the_goal_with_the_replica_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        goal = await ctl.deploy("a", config(num_replicas=2), RC)
        for _ in range(3):
            # Under autojump_clock this also waits out the backoff before each replacement.
            await rt.wait_until(lambda r: bool(r.tags(FakeState.STARTING)))
            rt.fail_start(rt.tags(FakeState.STARTING)[0], "ValueError", "bad port")
        with pytest.raises(GoalFailed, match="ValueError: bad port") as info:
            await goal.wait()
        assert info.value.backend == "a"
        await settle()
        status = ctl.status("a")
        assert status.last_error == "ValueError: bad port"
        assert status.state is controller.BackendState.DEPLOY_FAILED
        assert "3 failed to start: ValueError: bad port" in status.message
        # No start after the goal failed, and the one still starting was stopped: a failed
        # deploy halts where it is.
        assert len(rt.tags(FakeState.STARTING)) == 0
        assert len(rt.replicas) == 4
        # Deploying again resets the failure count and starts again.
        again = await deploy_ready(ctl, rt, config(num_replicas=2))
        assert again is not goal


async def test_a_crashed_replica_is_replaced_and_leaves_the_snapshot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        await (await ctl.deploy("a", config(num_replicas=2), RC)).wait()
        victim = rt.tags()[0]
        t0 = trio.current_time()
        rt.crash(victim, "segfault")
        await settle()
        assert victim not in {r.tag for r in ctl.snapshot("a").replicas}
        assert ctl.status("a").last_error == "died: segfault"
        assert ctl.status("a").state is controller.BackendState.UNHEALTHY
        # Replaced after the backoff (1 s after a first failure, with no jitter).
        await rt.wait_until(lambda r: len(r.replicas) == 3)
        assert trio.current_time() == t0 + 1
        await settle()
        assert len(ctl.snapshot("a").replicas) == 2


async def test_infeasible_scale_up_fails_at_deploy_and_writes_nothing() -> None:
    rt = FakeRuntime(auto_ready=True, capacity={"CPU": 2})
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        with pytest.raises(controller.InfeasibleError) as info:
            await ctl.deploy("a", config(num_replicas=3, resources={"CPU": 1}), RC)
        message = str(info.value)
        assert "'CPU': 1.0" in message
        assert "only 2 fit" in message
        assert "'CPU': 2" in message
        assert store.data == {}
        assert rt.replicas == {}
        await (await ctl.deploy("a", config(num_replicas=2, resources={"CPU": 1}), RC)).wait()
        with pytest.raises(controller.InfeasibleError, match="only 0 fit"):
            await ctl.deploy("b", config(num_replicas=1, resources={"CPU": 0.5}), RC)
        with pytest.raises(controller.InfeasibleError):
            await ctl.deploy("a", config(num_replicas=3, resources={"CPU": 1}), RC)
        assert ctl.status("a").backend_config.num_replicas == 2
        # Scaling down is never refused.
        await (await ctl.deploy("a", config(num_replicas=1, resources={"CPU": 1}), RC)).wait()


async def test_feasibility_places_each_replica_on_one_node() -> None:
    rt = FakeRuntime(auto_ready=True, capacity=[{"CPU": 1}, {"CPU": 1}])
    async with opened(rt) as ctl:
        with pytest.raises(controller.InfeasibleError, match=r"2 nodes"):
            await ctl.deploy("big", config(num_replicas=1, resources={"CPU": 2}), RC)
        await (await ctl.deploy("small", config(num_replicas=2, resources={"CPU": 1}), RC)).wait()


async def test_new_user_config_reconfigures_in_place(
    autojump_clock: trio.testing.MockClock,
) -> None:
    spy = Spy(FakeRuntime(auto_ready=True))
    rt = spy.inner
    async with opened(spy) as ctl:  # type: ignore[arg-type]  # duck-typed runtime
        spy.ctl = ctl
        await (await ctl.deploy("a", config(num_replicas=2, user_config={"n": 1}), RC)).wait()
        tags = sorted(rt.tags())
        goal = await ctl.deploy("a", config(num_replicas=2, user_config={"n": 2}), RC)
        await goal.wait()
        for tag in tags:
            assert spy.state_at["reconfigure", tag] is ReplicaState.UPDATING
            # Updating replicas keep serving.
            assert spy.serving_at["reconfigure", tag] == set(tags)
        assert sorted(rt.tags()) == tags  # no restart
        assert all(rt.replicas[t].user_config == {"n": 2} for t in tags)
        assert set(states(ctl, "a").values()) == {ReplicaState.RUNNING}


async def test_a_failed_reconfigure_fails_the_deploy_and_goes_back_to_the_config_before(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        await (await ctl.deploy("a", config(num_replicas=1, user_config=1), RC)).wait()
        (old,) = rt.tags()
        rt.replicas[old].reconfigure_error = ("KeyError", "'threshold'")
        with pytest.raises(controller.GoalFailed, match="KeyError: 'threshold'"):
            await (await ctl.deploy("a", config(num_replicas=1, user_config=2), RC)).wait()
        # Its way back fails too (every reconfigure of it does): replaced, with the old config.
        await rt.wait_until(lambda r: len(r.tags(FakeState.READY)) == 1 and old not in r.tags())
        (new,) = rt.tags()
        assert rt.replicas[new].user_config == 1
        assert ctl.status("a").last_error == "reconfigure failed: KeyError: 'threshold'"
        assert ctl.status("a").reason == "ReconfigureFailed"


async def test_new_version_replaces_replicas_without_dropping_capacity(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        await ctl.deploy("a", config(num_replicas=2), RC)
        await settle()
        old = rt.tags(FakeState.STARTING)
        for tag in old:
            rt.finish_start(tag)
        await settle()
        # A surge of 100%: every new replica starts at once (the defaults throttle; see
        # test_rollout.py).
        goal = await ctl.deploy("a", config(num_replicas=2, version="v2", max_surge=1.0), RC)
        await settle()
        new = rt.tags(FakeState.STARTING)
        assert len(new) == 2
        assert {r.tag for r in ctl.snapshot("a").replicas} == set(old)
        rt.finish_start(new[0])
        await settle()
        assert len(ctl.snapshot("a").replicas) == 2  # one old went as one new came
        rt.finish_start(new[1])
        await goal.wait()
        assert {r.version for r in ctl.status("a").replicas} == {"v2"}
        assert sorted(rt.tags()) == sorted(new)


async def test_without_a_version_every_changed_deploy_replaces(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        cfg = controller.BackendConfig(num_replicas=1)
        await (await ctl.deploy("a", cfg, RC)).wait()
        (first,) = rt.tags()
        assert ctl.status("a").replicas[0].version == "gen-1"
        await ctl.deploy("a", cfg, RC)  # same spec: nothing happens
        await settle()
        assert rt.tags() == [first]
        await (
            await ctl.deploy("a", controller.BackendConfig(num_replicas=1, user_config=1), RC)
        ).wait()
        (second,) = rt.tags()
        assert second != first
        assert ctl.status("a").replicas[0].version == "gen-2"
        # What the controller alone acts on (scale, limits, timeouts, routing) is not code:
        # such a deploy keeps every replica, even without a version.
        await (
            await ctl.deploy(
                "a",
                controller.BackendConfig(
                    num_replicas=2,
                    user_config=1,
                    route_prefix="/a",
                    max_ongoing_requests=3,
                    graceful_shutdown_timeout_s=1,
                ),
                RC,
            )
        ).wait()
        assert second in rt.tags()
        assert {r.version for r in ctl.status("a").replicas} == {"gen-2"}


async def test_closing_the_controller_leaves_replicas_running() -> None:
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        await (await ctl.deploy("a", config(num_replicas=2), RC)).wait()
    assert len(rt.tags(FakeState.READY)) == 2
    with pytest.raises(controller.ControllerClosedError):
        await ctl.deploy("b", config(), RC)


async def test_an_error_in_the_body_reaches_the_caller_unwrapped() -> None:
    with pytest.raises(KeyError, match="mine"):
        async with opened():
            raise KeyError("mine")


async def test_status_of_all_backends_is_sorted_and_frozen() -> None:
    async with opened() as ctl:
        await (await ctl.deploy("b", config(num_replicas=1), RC)).wait()
        await (await ctl.deploy("a", config(num_replicas=2), RC)).wait()
        status = ctl.status()
        assert [b.name for b in status.backends] == ["a", "b"]
        assert status["a"].counts == {ReplicaState.RUNNING: 2}
        with pytest.raises(AttributeError):
            status.backends = ()  # type: ignore[misc]
