"""Rollouts a person can steer: revisions, undo, pause and resume, the progress deadline and the
automatic rollback, driven through FakeRuntime under trio's MockClock (exact times)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
import trio.testing

import controller
from controller import BackendState, Cause, GoalFailed, GoalOutcome, ReplicaState, RolloutError
from controller.testing import FakeRuntime, FakeState

from ..conftest import RC, HeldSpecWrites, config, opened, settle


def finish(rt: FakeRuntime, version: str | None = None) -> list[str]:
    """Finish every pending start (of `version` only, if given); return their tags."""
    done = []
    for tag in rt.tags(FakeState.STARTING):
        if version is None or rt.replicas[tag].spec.version == version:
            rt.finish_start(tag)
            done.append(tag)
    return done


async def ready(ctl: controller.Controller, rt: FakeRuntime, goal: controller.Goal) -> None:
    """Finish starts until `goal` is reached."""
    while not goal.done:
        await settle()
        finish(rt)
        await settle()
    assert goal.outcome is GoalOutcome.COMPLETED, goal.error


def running_tags(ctl: controller.Controller, name: str = "a") -> set[str]:
    return {r.tag for r in ctl.status(name).replicas if r.state is ReplicaState.RUNNING}


def summary(ctl: controller.Controller, name: str = "a") -> list[tuple[int, str, str, bool]]:
    return [(r.number, r.version, r.outcome, r.good) for r in ctl.revisions(name)]


async def test_each_change_of_what_replicas_run_makes_a_revision_and_scaling_makes_none() -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        await ready(ctl, rt, await ctl.deploy("a", config(num_replicas=2), RC))
        await ready(ctl, rt, await ctl.deploy("a", config(num_replicas=3), RC))
        # Settings of the controller's own: no revision either.
        await ready(ctl, rt, await ctl.deploy("a", config(num_replicas=3, max_surge=2), RC))
        assert summary(ctl) == [(1, "v1", "complete", True)]
        await ready(ctl, rt, await ctl.deploy("a", config(num_replicas=3, user_config=5), RC))
        await ready(ctl, rt, await ctl.deploy("a", config(num_replicas=3, version="v2"), RC))
        other = controller.ReplicaConfig("app.replica:Echo", init_args=[1])
        cause = Cause(via="api", message="new args", manifest="x.toml", manifest_digest="ab12")
        goal = await ctl.deploy("a", config(num_replicas=3, version="v3"), other, cause=cause)
        await ready(ctl, rt, goal)
        revisions = ctl.revisions("a")
        assert summary(ctl) == [
            (1, "v1", "complete", True),
            (2, "v1", "complete", True),
            (3, "v2", "complete", True),
            (4, "v3", "complete", True),
        ]
        assert revisions[1].content.user_config == 5
        assert revisions[3].cause == cause
        assert revisions[0].cause.via == "python"
        assert revisions[3].content.replica_config.init_args == (1,)
        status = ctl.status("a")
        assert status.rollout is not None
        assert (status.rollout.revision, status.rollout.current_revision) == (4, 4)
        assert {r.revision for r in ctl._backends["a"].replicas.values()} == {4}


async def test_unversioned_configs_get_revisions_too() -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        await ready(ctl, rt, await ctl.deploy("a", controller.BackendConfig(num_replicas=1), RC))
        await ready(ctl, rt, await ctl.deploy("a", controller.BackendConfig(num_replicas=2), RC))
        two = controller.BackendConfig(num_replicas=2, user_config={"x": 1})
        await ready(ctl, rt, await ctl.deploy("a", two, RC))
        assert [(r.number, r.version) for r in ctl.revisions("a")] == [(1, "gen-1"), (2, "gen-3")]
        # Undo brings gen-1 back as revision 3: its replicas have version gen-1 again.
        goal = await ctl.undo("a")
        await ready(ctl, rt, goal)
        assert ctl.status("a").version == "gen-1"
        assert [(r.number, r.version, r.restores) for r in ctl.revisions("a")][-1] == (
            3,
            "gen-1",
            1,
        )


async def test_undo_goes_back_to_the_last_good_revision_keeping_its_replicas() -> None:
    rt = FakeRuntime()
    policy = controller.RestartPolicy(jitter=0.0, max_failed_starts=2)
    async with opened(rt, policy=policy) as ctl:
        await ready(ctl, rt, await ctl.deploy("a", config(num_replicas=2, max_surge=1), RC))
        good = running_tags(ctl)
        # Revision 2 cannot start; revision 3 neither: both fail the deploy.
        for version in ("v2", "v3"):
            goal = await ctl.deploy("a", config(num_replicas=2, max_surge=1, version=version), RC)
            while not goal.done:
                await settle()
                for tag in rt.tags(FakeState.STARTING):
                    rt.fail_start(tag, "ValueError", "bad release")
                await settle()
            assert goal.outcome is GoalOutcome.FAILED
        assert running_tags(ctl) == good
        assert [r.outcome for r in ctl.revisions("a")] == ["complete", "failed", "failed"]
        # Plain undo: revision 1 (the last that completed), not 2 (the one before).
        goal = await ctl.undo("a", cause=Cause(message="bad release"))
        assert await goal.wait() is GoalOutcome.COMPLETED
        last = ctl.revisions("a")[-1]
        assert (last.number, last.version, last.restores, last.automatic) == (4, "v1", 1, False)
        assert last.cause.message == "bad release"
        # The replicas that served all along are the ones serving: none restarted.
        assert running_tags(ctl) == good
        status = ctl.status("a")
        assert status.state is BackendState.HEALTHY
        assert status.rollout is not None
        assert status.rollout.revision == 4
        assert any(e.kind == "Deploy" and "revision 4" in e.message for e in status.events)


async def test_undo_to_a_named_revision_and_what_is_refused() -> None:
    rt = FakeRuntime(auto_ready=True)
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        for version in ("v1", "v2", "v3"):
            await (await ctl.deploy("a", config(num_replicas=1, version=version), RC)).wait()
        await settle()
        writes = store.writes
        with pytest.raises(RolloutError, match=r"keeps no revision 9 \(kept: 1, 2, 3\)") as info:
            await ctl.undo("a", to_revision=9)
        assert info.value.reason == "UnknownRevision"
        with pytest.raises(controller.UnknownBackendError):
            await ctl.undo("nope")
        for bad in ("1", 0, True, 1.0):
            with pytest.raises(controller.ConfigError, match="to_revision"):
                await ctl.undo("a", to_revision=bad)  # type: ignore[arg-type]
        # Undo to what runs already changes nothing.
        same = await ctl.undo("a", to_revision=3)
        assert same.generation == 3
        assert store.writes == writes
        goal = await ctl.undo("a", to_revision=1)
        await goal.wait()
        assert ctl.status("a").version == "v1"
        assert [r.number for r in ctl.revisions("a")] == [1, 2, 3, 4]
        await ctl.pause("a")
        with pytest.raises(RolloutError, match="paused: resume it first") as info:
            await ctl.undo("a", to_revision=2)
        assert info.value.reason == "Paused"


async def test_no_good_revision_to_undo_to() -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        await ctl.deploy("a", config(num_replicas=1), RC)
        with pytest.raises(
            RolloutError, match="no earlier revision of other content completed"
        ) as info:
            await ctl.undo("a")
        assert info.value.reason == "NoGoodRevision"


async def test_pause_then_three_deploys_then_resume_rolls_out_the_last_once() -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        await ready(ctl, rt, await ctl.deploy("a", config(num_replicas=2), RC))
        v1 = running_tags(ctl)
        await ctl.pause("a")
        for version in ("v2", "v3", "v4"):
            await ctl.deploy("a", config(num_replicas=2, version=version), RC)
        # A change of scale applies while paused; it runs the revision that runs now.
        goal = await ctl.deploy("a", config(num_replicas=3, version="v4"), RC)
        await ready(ctl, rt, goal)
        status = ctl.status("a")
        assert status.version == "v1"
        assert status.rollout is not None
        assert (status.rollout.paused, status.rollout.pending_revision) == (True, 4)
        assert "paused, revision 4 pending" in status.message
        assert v1 < running_tags(ctl)
        assert summary(ctl) == [
            (1, "v1", "complete", True),
            (2, "v2", "superseded", False),
            (3, "v3", "superseded", False),
            (4, "v4", "pending", False),
        ]
        # The same deploy again while paused changes nothing.
        again = await ctl.deploy("a", config(num_replicas=3, version="v4"), RC)
        assert again is goal
        starts = rt.start_calls
        goal = await ctl.resume("a")
        await ready(ctl, rt, goal)
        assert ctl.status("a").version == "v4"
        versions = {
            rt.replicas[t].spec.version for t in list(rt.replicas)[-(rt.start_calls - starts) :]
        }
        assert versions == {"v4"}  # one rollout, to the last: no start of v2 or v3
        assert rt.start_calls - starts == 3
        assert summary(ctl)[-1] == (4, "v4", "complete", True)
        assert ctl.status("a").rollout.paused is False  # type: ignore[union-attr]


async def test_a_pause_during_a_rollout_lets_it_finish_and_its_goal_stands() -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        await ready(ctl, rt, await ctl.deploy("a", config(num_replicas=2), RC))
        goal = await ctl.deploy("a", config(num_replicas=2, version="v2"), RC)
        await settle()
        paused = await ctl.pause("a")
        assert paused is goal  # the same generation: a pause asks nothing new of the replicas
        status = ctl.status("a")
        assert (status.generation, status.state, status.reason) == (
            2,
            BackendState.UPDATING,
            "NewVersion",
        )
        await ready(ctl, rt, goal)
        assert ctl.status("a").version == "v2"
        assert (await ctl.resume("a")) is goal
        assert [e.kind for e in ctl.status("a").events].count("Paused") == 1


async def test_deploying_what_runs_while_paused_drops_the_pending_revision() -> None:
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        await (await ctl.deploy("a", config(num_replicas=1), RC)).wait()
        await ctl.pause("a")
        await ctl.deploy("a", config(num_replicas=1, version="v2"), RC)
        await ctl.deploy("a", config(num_replicas=1), RC)
        status = ctl.status("a")
        assert status.rollout is not None
        assert status.rollout.pending_revision is None
        await (await ctl.resume("a")).wait()
        assert ctl.status("a").version == "v1"
        assert summary(ctl)[-1] == (2, "v2", "superseded", False)


async def test_a_scale_while_paused_keeps_the_pending_revision() -> None:
    # Found by a review: the scale asked for the content the paused spec runs, which dropped the
    # pending revision as "back to what runs", so the resume rolled out nothing.
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        await (await ctl.deploy("a", config(num_replicas=1), RC)).wait()
        await ctl.pause("a")
        await ctl.deploy("a", config(num_replicas=1, version="v2"), RC)
        await (await ctl.scale("a", 3)).wait()
        status = ctl.status("a")
        assert (status.version, status.desired_replicas) == ("v1", 3)
        assert status.rollout is not None
        assert status.rollout.pending_revision == 2
        assert summary(ctl)[-1] == (2, "v2", "pending", False)
        await (await ctl.resume("a")).wait()
        status = ctl.status("a")
        assert (status.version, status.desired_replicas) == ("v2", 3)
        assert summary(ctl) == [(1, "v1", "complete", True), (2, "v2", "complete", True)]


async def test_a_rollout_that_completes_while_the_next_deploy_is_written_keeps_its_mark() -> None:
    # Found by a review: the commit put back the history it had copied before its write, over
    # the rollout's mark made meanwhile, so revision 1 was kept as superseded and not good, and
    # undo was refused ("no earlier revision completed"). Now the book has one writer, the
    # desk: the rollout reports, and while a change of the name is under way the desk holds
    # the report and marks it in the history the change writes.
    rt = FakeRuntime()
    memory = controller.MemoryStore()
    store = HeldSpecWrites(memory)
    async with opened(rt, store) as ctl:
        first = await ctl.deploy("a", config(num_replicas=1), RC)
        await settle()
        assert summary(ctl) == [(1, "v1", "in_progress", False)]
        release = store.hold = trio.Event()
        second: list[controller.Goal] = []

        async def deploy_v2() -> None:
            second.append(await ctl.deploy("a", config(num_replicas=1, version="v2"), RC))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(deploy_v2)
            await store.holding.wait()
            finish(rt)  # revision 1's replica serves while revision 2's spec is being written
            await first.wait()
            # Reported, held: the change's history is being written, and no one else marks.
            assert summary(ctl) == [(1, "v1", "in_progress", False)]
            release.set()
        assert summary(ctl) == [(1, "v1", "complete", True), (2, "v2", "in_progress", False)]
        await ready(ctl, rt, second[0])
        await ready(ctl, rt, await ctl.undo("a"))
        assert ctl.status("a").version == "v1"
    async with opened(rt, memory) as ctl:  # and so it was stored
        assert summary(ctl)[:2] == [(1, "v1", "complete", True), (2, "v2", "complete", True)]


async def test_progress_deadline_halts_at_the_exact_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    base = {"num_replicas": 2, "max_surge": 1, "max_unavailable": 0, "progress_deadline_s": 30.0}
    async with opened(rt) as ctl:
        await ready(ctl, rt, await ctl.deploy("a", config(**base), RC))
        v1 = running_tags(ctl)
        goal = await ctl.deploy("a", config(**base, version="v2", start_timeout_s=1000), RC)
        began = trio.current_time()
        with pytest.raises(GoalFailed, match="ProgressDeadlineExceeded") as info:
            await goal.wait()
        assert trio.current_time() - began == 30.0
        assert "halted where it is (on_failure=halt)" in str(info.value)
        status = ctl.status("a")
        assert (status.state, status.reason) == (
            BackendState.DEPLOY_FAILED,
            "ProgressDeadlineExceeded",
        )
        assert running_tags(ctl) == v1  # what served keeps serving
        await settle()
        # Halted: the start still under way was stopped, so it cannot come up later and
        # displace a replica of v1.
        assert not rt.tags(FakeState.STARTING)
        assert summary(ctl)[-1][2] == "failed"
        assert status.rollout is not None
        assert "ProgressDeadlineExceeded" in (status.rollout.error or "")


async def test_a_restart_during_a_start_then_a_halt_stops_the_start(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    store = controller.MemoryStore()
    base = {"num_replicas": 2, "max_surge": 1, "max_unavailable": 0, "start_timeout_s": 120}
    async with opened(rt, store) as ctl:
        await ready(ctl, rt, await ctl.deploy("a", config(**base), RC))
        v1 = running_tags(ctl)
        await ctl.deploy("a", config(**base, version="v2", progress_deadline_s=5), RC)
        await settle()
        (starting,) = rt.tags(FakeState.STARTING)
    # Restarted while v2's replica starts: it is adopted (RECOVERING), and the deadline halts
    # the rollout 5 s later. The start is stopped, so it can never displace a v1 replica.
    async with opened(rt, store) as ctl:
        await ctl.wait_until(lambda c: c.status("a").state is BackendState.DEPLOY_FAILED)
        await settle()
        assert rt.replicas[starting].state is FakeState.DEAD
        await trio.sleep(300)
        assert running_tags(ctl) == v1
        assert ctl.status("a").reason == "ProgressDeadlineExceeded"


async def test_each_new_replica_ready_resets_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    base = {"num_replicas": 2, "max_surge": 1, "max_unavailable": 0, "progress_deadline_s": 30.0}
    async with opened(rt) as ctl:
        await ready(ctl, rt, await ctl.deploy("a", config(**base), RC))
        goal = await ctl.deploy("a", config(**base, version="v2", start_timeout_s=1000), RC)
        began = trio.current_time()
        await trio.sleep(20)
        assert finish(rt, "v2")  # progress at 20 s: the deadline moves to 50 s
        with pytest.raises(GoalFailed, match="ProgressDeadlineExceeded"):
            await goal.wait()
        assert trio.current_time() - began == 50.0


async def test_a_failed_rollout_rolls_back_by_itself(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    base = {
        "num_replicas": 2,
        "max_surge": 1,
        "max_unavailable": 0,
        "progress_deadline_s": 30.0,
        "on_failure": "rollback",
        "start_timeout_s": 1000,
    }
    async with opened(rt) as ctl:
        await ready(ctl, rt, await ctl.deploy("a", config(**base), RC))
        v1 = running_tags(ctl)
        goal = await ctl.deploy("a", config(**base, version="v2"), RC)
        began = trio.current_time()
        with pytest.raises(GoalFailed, match=r"rolling back to revision 1 \(on_failure=rollback\)"):
            await goal.wait()
        assert trio.current_time() - began == 30.0
        await ctl.wait_until(lambda c: c.status("a").state is BackendState.HEALTHY)
        status = ctl.status("a")
        assert status.version == "v1"
        assert running_tags(ctl) == v1  # the serving replicas were never touched
        assert not rt.tags(FakeState.STARTING)  # the stuck v2 start was stopped
        last = ctl.revisions("a")[-1]
        assert (last.number, last.restores, last.automatic, last.outcome) == (
            3,
            1,
            True,
            "complete",
        )
        assert status.rollout is not None
        assert status.rollout.automatic
        kinds = [e.kind for e in status.events]
        assert "ProgressDeadlineExceeded" in kinds
        assert "RollingBack" in kinds


async def test_a_rollback_that_fails_too_halts_and_never_goes_further_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    base = {"num_replicas": 2, "max_surge": 1, "max_unavailable": 0, "on_failure": "rollback"}
    async with opened(rt) as ctl:
        for version in ("a", "b"):
            await (await ctl.deploy("a", config(**base, version=version), RC)).wait()
        b = running_tags(ctl)
        # An outage: neither c nor b can start any more. c fails, and so does the rollback to
        # b (which needs one more replica, c's count): that halts, rather than go back to a.
        rt.failing_starts = frozenset({"b", "c"})
        goal = await ctl.deploy("a", config(**{**base, "num_replicas": 3}, version="c"), RC)
        with pytest.raises(GoalFailed, match="rolling back to revision 2"):
            await goal.wait()
        await ctl.wait_until(lambda c: c.status("a").state is BackendState.DEPLOY_FAILED)
        await trio.sleep(600)
        assert [(r.number, r.version, r.outcome) for r in ctl.revisions("a")] == [
            (1, "a", "complete"),
            (2, "b", "complete"),
            (3, "c", "failed"),
            (4, "b", "failed"),
        ]
        assert "the automatic rollback failed too: halted" in (ctl.revisions("a")[3].error or "")
        assert running_tags(ctl) == b  # what served keeps serving
        assert not any(r.spec.version == "a" for r in list(rt.replicas.values())[4:])


async def test_a_health_check_failing_within_min_ready_rolls_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    base = {
        "num_replicas": 1,
        "max_surge": 1,
        "max_unavailable": 0,
        "health_check_period_s": 1.0,
        "min_ready_s": 20.0,
        "on_failure": "rollback",
    }
    async with opened(rt) as ctl:
        first = await ctl.deploy("a", config(**base), RC)
        await settle()
        finish(rt)
        # Complete only once its replica stayed healthy for min_ready_s.
        began = trio.current_time()
        await first.wait()
        assert trio.current_time() - began == 20.0
        goal = await ctl.deploy("a", config(**base, version="v2"), RC)
        await settle()
        (tag,) = finish(rt, "v2")
        ready_at = trio.current_time()
        await trio.sleep(4.5)
        rt.replicas[tag].health_error = ("RuntimeError", "leaks memory")
        with pytest.raises(GoalFailed, match=r"failed a health check.*5s after it became ready"):
            await goal.wait()
        assert trio.current_time() - ready_at == 5.0
        await settle()
        assert finish(rt, "v1")  # the rollback starts revision 1's replica again
        await ctl.wait_until(lambda c: c.status("a").state is BackendState.HEALTHY)
        assert ctl.status("a").version == "v1"
        assert summary(ctl)[1][2] == "failed"


async def test_a_failure_after_min_ready_is_not_a_failed_rollout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    base = {
        "num_replicas": 1,
        "health_check_period_s": 1.0,
        "min_ready_s": 5.0,
        "on_failure": "rollback",
    }
    async with opened(rt) as ctl:
        await (await ctl.deploy("a", config(**base), RC)).wait()
        await (await ctl.deploy("a", config(**base, version="v2"), RC)).wait()
        (tag,) = running_tags(ctl)
        rt.replicas[tag].health_error = ("RuntimeError", "later")
        await trio.sleep(10)
        status = ctl.status("a")
        assert status.version == "v2"
        assert len(ctl.revisions("a")) == 2
        assert summary(ctl)[-1] == (2, "v2", "complete", True)


async def test_history_is_trimmed_but_never_a_revision_that_runs() -> None:
    rt = FakeRuntime()
    base = {"num_replicas": 2, "revision_history_limit": 1, "max_surge": 1, "max_unavailable": 0}
    async with opened(rt) as ctl:
        await ready(ctl, rt, await ctl.deploy("a", config(**base), RC))
        await ready(ctl, rt, await ctl.deploy("a", config(**base, version="v2"), RC))
        await ready(ctl, rt, await ctl.deploy("a", config(**base, version="v3"), RC))
        assert [r.number for r in ctl.revisions("a")] == [2, 3]
        # A rollout that hangs half way: revision 4's replica runs beside revision 3's.
        await ctl.deploy("a", config(**base, version="v4"), RC)
        await settle()
        finish(rt, "v4")
        await settle()
        await ctl.deploy("a", config(**base, version="v5"), RC)
        await ctl.deploy("a", config(**{**base, "revision_history_limit": 0}, version="v6"), RC)
        await settle()
        running = {r.revision for r in ctl._backends["a"].replicas.values()}
        assert {3, 4} <= running
        numbers = [r.number for r in ctl.revisions("a")]
        assert numbers == [3, 4, 6]


async def test_a_smaller_history_limit_alone_trims_at_once() -> None:
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        for version in ("v1", "v2", "v3", "v4"):
            await (await ctl.deploy("a", config(version=version), RC)).wait()
        assert len(ctl.revisions("a")) == 4
        await (await ctl.deploy("a", config(version="v4", revision_history_limit=0), RC)).wait()
        # The current one, and the one a plain undo would go back to.
        assert [r.number for r in ctl.revisions("a")] == [3, 4]


async def test_undo_refused_when_the_code_changed_unless_forced(tmp_path: Path) -> None:
    (tmp_path / "shop.py").write_text("class App:\n    pass\n")
    rt = FakeRuntime(auto_ready=True)
    app = controller.ReplicaConfig("shop:App")
    async with controller.open_controller(
        runtime=rt, store=controller.MemoryStore(), code_path=[str(tmp_path)]
    ) as ctl:
        await (await ctl.deploy("a", config(), app)).wait()
        await (await ctl.deploy("a", config(version="v2"), app)).wait()
        first = ctl.revisions("a")[0]
        assert first.code is not None
        assert first.code.module == "shop"
        assert first.code_changed is False
        (tmp_path / "shop.py").write_text("class App:\n    changed = True\n")
        assert [r.code_changed for r in ctl.revisions("a")] == [True, True]
        with pytest.raises(controller.CodeChangedError, match="undo with force") as info:
            await ctl.undo("a")
        assert info.value.reason == "CodeChanged"
        assert len(ctl.revisions("a")) == 2  # nothing written
        goal = await ctl.undo("a", force=True)
        await goal.wait()
        last = ctl.revisions("a")[-1]
        assert (last.number, last.version, last.code_changed) == (3, "v1", False)


async def test_revisions_survive_a_restart() -> None:
    rt = FakeRuntime(auto_ready=True)
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        await (await ctl.deploy("a", config(num_replicas=2), RC)).wait()
        await (await ctl.deploy("a", config(num_replicas=2, version="v2"), RC)).wait()
        await (await ctl.undo("a", cause=Cause(message="back"))).wait()
        await ctl.pause("a")
        await ctl.deploy("a", config(num_replicas=2, version="v5"), RC)
        await settle()
        before = ctl.revisions("a")
        tags = running_tags(ctl)
    async with opened(rt, store) as ctl:
        await ctl.wait_until(lambda c: c.status("a").state is BackendState.HEALTHY)
        assert ctl.revisions("a") == before
        assert running_tags(ctl) == tags
        status = ctl.status("a")
        assert status.rollout is not None
        assert (status.rollout.revision, status.rollout.paused) == (3, True)
        assert status.rollout.pending_revision == 4
        assert {r.revision for r in ctl._backends["a"].replicas.values()} == {3}
        await (await ctl.resume("a")).wait()
        assert ctl.status("a").version == "v5"


async def test_a_store_without_revisions_gets_one_at_recovery() -> None:
    rt = FakeRuntime(auto_ready=True)
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        await (await ctl.deploy("a", config(num_replicas=1), RC)).wait()
    # As an older controller left it: no revisions key, no revision in the spec.
    items = await store.read_all()
    await store.write({"revisions/a": None})
    spec = items["spec/a"].replace('"revision":1,', "")
    await store.write({"spec/a": spec})
    async with opened(rt, store) as ctl:
        await ctl.wait_until(lambda c: c.status("a").state is BackendState.HEALTHY)
        (revision,) = ctl.revisions("a")
        assert (revision.number, revision.version, revision.outcome) == (1, "v1", "complete")
        assert "recorded at recovery" in (revision.cause.message or "")


@pytest.mark.parametrize(
    "numbers",
    [[1, 1], [2, 1], [-5], [0], [10**30], [True]],
    ids=["repeated", "down", "below", "0", "huge", "bool"],
)
async def test_a_history_whose_numbers_do_not_grow_is_refused(numbers: list[int]) -> None:
    rt = FakeRuntime(auto_ready=True)
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        await (await ctl.deploy("a", config(num_replicas=1), RC)).wait()
    items = await store.read_all()
    kept = json.loads(items["revisions/a"])
    kept["revisions"] = [{**kept["revisions"][0], "number": n} for n in numbers]
    await store.write({"revisions/a": json.dumps(kept)})
    damaged = await store.read_all()
    with pytest.raises(
        controller.CheckpointError, match=r"revision numbers must grow from 1|not a whole number"
    ):
        async with opened(rt, store):
            pass
    assert await store.read_all() == damaged


async def test_a_history_without_the_specs_revision_is_refused() -> None:
    rt = FakeRuntime(auto_ready=True)
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        for version in ("v1", "v2"):
            await (await ctl.deploy("a", config(num_replicas=1, version=version), RC)).wait()
    items = await store.read_all()
    kept = json.loads(items["revisions/a"])
    kept["revisions"] = kept["revisions"][:1]  # revision 2, which the spec runs, is gone
    await store.write({"revisions/a": json.dumps(kept)})
    with pytest.raises(controller.CheckpointError, match="lacks revision 2"):
        async with opened(rt, store):
            pass


async def test_a_lost_history_does_not_start_the_numbers_again() -> None:
    rt = FakeRuntime(auto_ready=True)
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        for version in ("v1", "v2", "v3"):
            await (await ctl.deploy("a", config(num_replicas=1, version=version), RC)).wait()
    await store.write({"revisions/a": None})
    async with opened(rt, store) as ctl:
        (revision,) = ctl.revisions("a")
        assert (revision.number, revision.version) == (3, "v3")
        await (await ctl.deploy("a", config(num_replicas=1, version="v4"), RC)).wait()
        assert [r.number for r in ctl.revisions("a")] == [3, 4]
