"""``rollout restart``: the running content again as a new revision with the code on disk now,
every replica replaced under the rollout limits; driven through FakeRuntime under MockClock."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

import controller
from controller import BackendState, Cause, GoalOutcome, RolloutError
from controller._daemon.reload import CodeWatch
from controller._model.records.revisions import describe_cause
from controller.testing import FakeRuntime, FakeState

from ..conftest import RC, config, opened, settle


def versions(rt: FakeRuntime) -> dict[str, str]:
    """Each live replica's tag and version (running or starting)."""
    live = (FakeState.READY, FakeState.STARTING)
    return {tag: r.spec.version for tag, r in rt.replicas.items() if r.state in live}


async def test_a_restart_replaces_every_replica_and_later_changes_keep_it() -> None:
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        await (await ctl.deploy("a", config(num_replicas=3), RC)).wait()
        before = set(versions(rt))
        goal = await ctl.restart("a", cause=Cause(via="cli", message="new code für Ümlaute"))
        assert await goal.wait() is GoalOutcome.COMPLETED
        after = versions(rt)
        assert len(after) == 3
        assert not set(after) & before  # every replica replaced
        generation = goal.generation
        assert set(after.values()) == {f"v1+restart.{generation}"}
        last = ctl.revisions("a")[-1]
        assert (last.number, last.restarts, last.version) == (2, 1, f"v1+restart.{generation}")
        assert last.digest == ctl.revisions("a")[0].digest  # the same content
        # Text as written: only controls are escaped (by the CLI), not other languages.
        assert describe_cause(last) == 'restart of revision 1, cli: "new code für Ümlaute"'
        assert ctl.status("a").version == f"v1+restart.{generation}"
        # A scale, and a change of user config (made in place), keep the restarted replicas.
        await (await ctl.deploy("a", config(num_replicas=4), RC)).wait()
        await (await ctl.deploy("a", config(num_replicas=4, user_config={"x": 1}), RC)).wait()
        kept = versions(rt)
        assert set(after) < set(kept)
        assert set(kept.values()) == {f"v1+restart.{generation}"}
        assert ctl.revisions("a")[-1].version == f"v1+restart.{generation}"
        # A new version is new replicas, of that version alone.
        await (await ctl.deploy("a", config(num_replicas=4, version="v2"), RC)).wait()
        assert set(versions(rt).values()) == {"v2"}


async def test_an_unversioned_restart_is_a_new_code_generation() -> None:
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        await (await ctl.deploy("a", controller.BackendConfig(num_replicas=2), RC)).wait()
        assert set(versions(rt).values()) == {"gen-1"}
        goal = await ctl.restart("a")
        await goal.wait()
        assert set(versions(rt).values()) == {f"gen-{goal.generation}"}
        tags = set(versions(rt))
        # The same config again (a re-apply) changes nothing.
        again = await ctl.deploy("a", controller.BackendConfig(num_replicas=2), RC)
        await again.wait()
        assert set(versions(rt)) == tags
        assert [r.restarts for r in ctl.revisions("a")] == [None, 1]


async def test_a_restart_keeps_to_the_surge_and_unavailability_limits() -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        goal = await ctl.deploy("a", config(num_replicas=4, max_surge=1, max_unavailable=0), RC)
        await settle()
        for tag in rt.tags(FakeState.STARTING):
            rt.finish_start(tag)
        await goal.wait()
        goal = await ctl.restart("a")
        most = 0
        while not goal.done:
            await settle()
            live = versions(rt)
            running = rt.tags(FakeState.READY)
            most = max(most, len(live))
            assert len(running) >= 4  # never fewer serving than asked (max_unavailable 0)
            for tag in rt.tags(FakeState.STARTING):
                rt.finish_start(tag)
            await settle()
        assert goal.outcome is GoalOutcome.COMPLETED
        assert most == 5  # one surge replica at a time


async def test_what_a_restart_refuses_writes_nothing() -> None:
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        with pytest.raises(controller.UnknownBackendError):
            await ctl.restart("nope")
        await (await ctl.deploy("a", config(), RC)).wait()
        await ctl.pause("a")
        with pytest.raises(RolloutError, match="paused: resume it first") as info:
            await ctl.restart("a")
        assert info.value.reason == "Paused"
        assert len(ctl.revisions("a")) == 1
        await ctl.delete("a")
        with pytest.raises((RolloutError, controller.UnknownBackendError)):
            await ctl.restart("a")


async def test_a_restart_pins_the_code_on_disk_now_and_survives_recovery(tmp_path: Path) -> None:
    (tmp_path / "shop.py").write_text("class App:\n    pass\n")
    rt = FakeRuntime(auto_ready=True)
    store = controller.MemoryStore()
    app = controller.ReplicaConfig("shop:App")

    def open_it() -> AbstractAsyncContextManager[controller.Controller]:
        return controller.open_controller(runtime=rt, store=store, code_path=[str(tmp_path)])

    async with open_it() as ctl:
        await (await ctl.deploy("a", config(num_replicas=2), app)).wait()
        (tmp_path / "shop.py").write_text("class App:\n    edited = True\n")
        assert ctl.revisions("a")[0].code_changed is True
        await (await ctl.restart("a")).wait()
        first, last = ctl.revisions("a")
        assert first.code_changed is True
        assert last.code_changed is False
        assert last.code is not None
        assert first.code is not None
        assert last.code.digest != first.code.digest
        tags = versions(rt)
    async with open_it() as ctl:
        await ctl.wait_until(lambda c: c.status("a").state is BackendState.HEALTHY)
        assert versions(rt) == tags  # recovery keeps the restarted replicas
        assert ctl.revisions("a")[-1].restarts == 1


async def test_reload_restarts_once_the_edit_has_settled_and_once_only(tmp_path: Path) -> None:
    (tmp_path / "shop.py").write_text("class App:\n    pass\n")
    rt = FakeRuntime(auto_ready=True)
    app = controller.ReplicaConfig("shop:App")
    async with controller.open_controller(
        runtime=rt, store=controller.MemoryStore(), code_path=[str(tmp_path)]
    ) as ctl:
        await (await ctl.deploy("a", config(), app)).wait()
        await (await ctl.deploy("b", config(), app)).wait()
        await ctl.pause("b")  # a paused backend is left alone
        watch = CodeWatch(ctl)
        await watch.look()
        assert len(ctl.revisions("a")) == 1  # nothing changed
        (tmp_path / "shop.py").write_text("class App:\n    edited = 1\n")
        await watch.look()
        (tmp_path / "shop.py").write_text("class App:\n    edited = 2\n")
        await watch.look()
        assert len(ctl.revisions("a")) == 1  # still being edited: not yet
        await watch.look()
        revisions = ctl.revisions("a")
        assert [(r.number, r.restarts, r.cause.via) for r in revisions] == [
            (1, None, "python"),
            (2, 1, "controller"),
        ]
        assert revisions[-1].code_changed is False
        await watch.look()
        await watch.look()
        assert len(ctl.revisions("a")) == 2  # once per edit
        assert len(ctl.revisions("b")) == 1
        (tmp_path / "shop.py").unlink()
        await watch.look()
        await watch.look()
        assert len(ctl.revisions("a")) == 2  # code gone: nothing to ship
        # A backend declared before its module was written is restarted once it is.
        await (await ctl.deploy("c", config(), controller.ReplicaConfig("later:App"))).wait()
        assert ctl.revisions("c")[0].code is None
        (tmp_path / "later.py").write_text("class App:\n    pass\n")
        await watch.look()
        await watch.look()
        assert [r.restarts for r in ctl.revisions("c")] == [None, 1]
        assert ctl.revisions("c")[-1].code is not None
