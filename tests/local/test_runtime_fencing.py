"""Fencing at the runtime (``Runtime.fence``): a replica refuses drain, reconfigure, health check
and kill from an epoch lower than the highest that has commanded it, and nothing of a refused
command takes effect.

LocalRuntime with real worker processes and the real clock, every wait bounded by fail_after;
FakeRuntime (two views over the same replicas, as an old leader and a new one) under MockClock.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
import trio.testing

import controller
import controller.testing
from controller import FencedError, ReplicaGoneError
from controller._local.layout import socket_path
from controller._local.wire import LineStream
from controller.testing import FakeRuntime, FakeState

from ..workers import LIMIT_S, Harness, WaitsForTheForkServer, worker_pids

T = TypeVar("T")


def _events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _spec(tag: str, replica: controller.ReplicaConfig) -> controller.ReplicaSpec:
    return controller.ReplicaSpec(
        tag=tag,
        backend=tag.partition("#")[0],
        version="v1",
        replica_config=replica,
        user_config=None,
        resources={},
    )


class Deaths:
    """A death listener that keeps what it hears."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.heard = trio.Event()

    def __call__(self, tag: str, reason: str) -> None:
        self.seen.append((tag, reason))
        self.heard.set()


def _ignore(tag: str, reason: str) -> None:
    pass


def _alive(pid: int) -> bool:
    try:
        state = next(
            line.split()[1]
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith("State:")
        )
    except FileNotFoundError:
        return False
    return state != "Z"


# -- LocalRuntime --


async def test_a_stale_leader_is_refused_and_the_worker_serves_on(harness: Harness) -> None:
    record = Path(harness.record)
    stale, leader, unfenced = harness.local(), harness.local(), harness.local()
    stale_deaths = Deaths()
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(stale.serve, stale_deaths)
            await nursery.start(leader.serve, _ignore)
            await nursery.start(unfenced.serve, _ignore)
            stale.fence(1)
            pid = (await stale.start_replica(_spec("a#1", harness.recorder()))).pid
            assert pid is not None
            leader.fence(2)
            assert await leader.list_replicas() == ["a#1"]
            assert (await leader.adopt_replica("a#1")).pid == pid
            files = sorted(p.name for p in harness.workdir.iterdir())

            for runtime, epoch in ((stale, 1), (unfenced, 0)):
                await _all_refused(runtime, epoch, "a#1")
                # Nothing of it took effect: the same worker serves, its files are all there.
                assert _alive(pid)
                assert sorted(p.name for p in harness.workdir.iterdir()) == files
                await leader.check_health_replica("a#1")
            assert [e["what"] for e in _events(record)] == ["init"]
            assert stale_deaths.seen == []

            await leader.reconfigure_replica("a#1", {"by": 2})
            await leader.drain_replica("a#1")
            await leader.kill_replica("a#1")
            assert not _alive(pid)
            assert await leader.list_replicas() == []
            assert [e["what"] for e in _events(record)] == [
                "init",
                "reconfigure",
                "drain",
                "drained",
            ]
            assert _events(record)[1]["config"] == {"by": 2}
            # The stale runtime, which still watched the worker, hears of its end as a death.
            await stale_deaths.heard.wait()
            assert [tag for tag, _ in stale_deaths.seen] == ["a#1"]
            nursery.cancel_scope.cancel()


async def _all_refused(runtime: controller.Runtime, epoch: int, tag: str) -> None:
    """Each command of `runtime` (at `epoch`) on `tag` is refused for epoch 2's."""
    calls: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        ("drain", lambda: runtime.drain_replica(tag)),
        ("reconfigure", lambda: runtime.reconfigure_replica(tag, {"by": epoch})),
        ("health check", lambda: runtime.check_health_replica(tag)),
        ("kill", lambda: runtime.kill_replica(tag)),
        ("adoption", lambda: runtime.adopt_replica(tag)),
    ]
    for what, call in calls:
        with pytest.raises(FencedError) as refused:
            await call()
        assert (refused.value.what, refused.value.epoch, refused.value.newer) == (
            f"{what} of replica {tag}",
            epoch,
            2,
        )


async def test_a_start_from_a_lower_epoch_than_the_dir_was_fenced_at_is_refused(
    harness: Harness,
) -> None:
    stale, leader = harness.local(), harness.local()
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(stale.serve, _ignore)
            await nursery.start(leader.serve, _ignore)
            stale.fence(1)
            leader.fence(3)
            stale.fence(2)  # too late: the directory was fenced at 3 already
            assert (harness.workdir / "fence").read_text() == "3"
            with pytest.raises(FencedError) as refused:
                await stale.start_replica(_spec("a#1", harness.recorder()))
            assert (refused.value.what, refused.value.epoch, refused.value.newer) == (
                "start of replica a#1",
                2,
                3,
            )
            assert await leader.list_replicas() == []
            assert list(harness.workdir.glob("*.spec.json")) == []
            # The leader starts; its worker starts at its epoch, which a fence of 2 cannot beat.
            await leader.start_replica(_spec("a#2", harness.recorder()))
            with pytest.raises(FencedError):
                await stale.kill_replica("a#2")
            await leader.kill_replica("a#2")
            nursery.cancel_scope.cancel()


async def test_a_kill_refused_by_a_worker_it_never_held_leaves_its_files(
    harness: Harness,
) -> None:
    # A stale runtime that never started nor adopted the worker finds it by its tag (a stop
    # that a restarted controller finishes): refused, it closes what it opened and removes
    # nothing.
    leader = harness.local()
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(leader.serve, _ignore)
            leader.fence(5)
            pid = (await leader.start_replica(_spec("a#1", harness.recorder()))).pid
            assert pid is not None
            files = sorted(p.name for p in harness.workdir.iterdir())
            stale = harness.local()
            stale.fence(4)
            with pytest.raises(FencedError):
                await stale.kill_replica("a#1")
            assert _alive(pid)
            assert sorted(p.name for p in harness.workdir.iterdir()) == files
            assert stale._workers == {}
            await leader.check_health_replica("a#1")
            await leader.kill_replica("a#1")
            nursery.cancel_scope.cancel()


async def test_a_worker_that_does_not_answer_is_killed_by_signal(harness: Harness) -> None:
    # A stopped (or hung) worker can check nothing: the kill falls back to signals once it has
    # not answered within term_timeout_s, as kills did before fencing.
    leader = harness.local(term_timeout_s=0.5)
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(leader.serve, _ignore)
            leader.fence(1)
            pid = (await leader.start_replica(_spec("a#1", harness.recorder()))).pid
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            t0 = trio.current_time()
            await leader.kill_replica("a#1")
            assert trio.current_time() - t0 >= 2 * 0.5  # no answer, then SIGTERM, then SIGKILL
            assert not _alive(pid)
            assert await leader.list_replicas() == []
            nursery.cancel_scope.cancel()


async def test_a_worker_that_accepted_a_stop_takes_no_adoption_and_ends_itself(
    harness: Harness,
) -> None:
    # The stop is accepted, and its runtime vanishes before it signals: a newer leader cannot
    # adopt the worker, which ends itself after the stop's grace_s.
    stale = harness.local()
    deaths = Deaths()
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(stale.serve, deaths)
            stale.fence(1)
            pid = (await stale.start_replica(_spec("a#1", harness.recorder()))).pid
            assert pid is not None
            lines = LineStream(await trio.open_unix_socket(socket_path(stale.runtime_dir, "a#1")))
            await lines.send({"op": "stop", "epoch": 1, "grace_s": 0.5})
            assert (await lines.receive()) == {"ok": True, "pid": pid}
            await lines.aclose()
            leader = harness.local()
            await nursery.start(leader.serve, _ignore)
            leader.fence(2)
            with pytest.raises(ReplicaGoneError, match="accepted a stop"):
                await leader.adopt_replica("a#1")
            with pytest.raises(ReplicaGoneError, match="accepted a stop"):
                await stale.drain_replica("a#1")
            # Signalled by no one: its death is its own, heard by the runtime that holds it.
            await deaths.heard.wait()
            assert deaths.seen == [("a#1", "worker process killed by SIGKILL")]
            assert not _alive(pid)
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("forked", [False, True], ids=["spawned", "forked"])
@pytest.mark.parametrize("check", controller.testing.FENCING_CHECKS, ids=lambda c: c.__name__)
async def test_local_runtime_passes_the_fencing_checks(
    harness: Harness, forked: bool, check: Callable[[controller.testing.Subject], Awaitable[None]]
) -> None:
    def runtime() -> controller.Runtime:
        local = harness.local(fork_server=forked)
        return WaitsForTheForkServer(local) if forked else local

    async def crash(runtime: controller.Runtime, tag: str) -> None:
        raise AssertionError("the fencing checks crash nothing")

    subject = controller.testing.Subject(
        runtime=runtime,
        store=harness.store,
        replica=harness.recorder(),
        ignores_drain=harness.recorder(drain_s=600),
        crash=crash,
    )
    with trio.fail_after(LIMIT_S):
        await check(subject)
    assert [e["what"] for e in _events(Path(harness.record))] == [
        "init",
        "reconfigure",
        "drain",
        "drained",
    ]
    assert worker_pids(harness.workdir) == {}


# -- FakeRuntime --

RC = controller.ReplicaConfig("m:C")


async def test_fake_views_fence_as_workers_do(autojump_clock: trio.testing.MockClock) -> None:
    rt = FakeRuntime(auto_ready=True)
    stale, leader, unfenced = rt, rt.view(), rt.view()
    async with trio.open_nursery() as nursery:
        for runtime in (stale, leader, unfenced):
            await nursery.start(runtime.serve, _ignore)
        stale.fence(1)
        await stale.start_replica(_spec("a#1", RC))
        assert rt.replicas["a#1"].epoch == 1
        leader.fence(2)
        assert await leader.list_replicas() == ["a#1"]
        await leader.adopt_replica("a#1")
        assert rt.replicas["a#1"].epoch == 2
        before = list(rt.history)

        for runtime, epoch in ((stale, 1), (unfenced, 0)):
            with pytest.raises(FencedError) as refused:
                await runtime.drain_replica("a#1")
            assert (refused.value.epoch, refused.value.newer) == (epoch, 2)
            with pytest.raises(FencedError):
                await runtime.reconfigure_replica("a#1", {"by": epoch})
            with pytest.raises(FencedError):
                await runtime.check_health_replica("a#1")
            with pytest.raises(FencedError):
                await runtime.kill_replica("a#1")
            with pytest.raises(FencedError):
                await runtime.adopt_replica("a#1")
        replica = rt.replicas["a#1"]
        assert (replica.state, replica.epoch, replica.user_config) == (FakeState.READY, 2, None)
        assert (replica.drain_requested_at, replica.killed_at, replica.health_checks) == (
            None,
            None,
            [],
        )
        assert replica.reconfigure_calls == 0
        assert leader.fenced == rt.fenced == unfenced.fenced
        assert rt.fenced == [
            (op, "a#1", epoch)
            for epoch in (1, 0)
            for op in ("drain", "reconfigure", "check_health", "kill", "adopt")
        ]
        assert all("fenced" in what for _, _, what in rt.history[len(before) :])

        # The leader's commands work; a start from the stale epoch is refused.
        await leader.reconfigure_replica("a#1", {"by": 2})
        await leader.drain_replica("a#1")
        await leader.kill_replica("a#1")
        assert (replica.user_config, replica.state) == ({"by": 2}, FakeState.DEAD)
        with pytest.raises(FencedError) as refused:
            await stale.start_replica(_spec("a#2", RC))
        assert (refused.value.what, refused.value.newer) == ("start of replica a#2", 2)
        assert rt.fenced[-1] == ("start", "a#2", 1)
        assert "a#2" not in rt.replicas
        nursery.cancel_scope.cancel()


async def test_fake_deaths_are_told_to_every_serving_view(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=False)
    view = rt.view()
    view.auto_ready = True  # the settings are shared
    assert rt.auto_ready
    first, second = Deaths(), Deaths()
    async with trio.open_nursery() as nursery:
        await nursery.start(rt.serve, first)
        await nursery.start(view.serve, second)
        await view.start_replica(_spec("a#1", RC))
        assert rt.tags() == ["a#1"]
        assert rt.start_calls == 1
        rt.crash("a#1", "boom")
        assert first.seen == second.seen == [("a#1", "boom")]
        nursery.cancel_scope.cancel()


async def test_two_controllers_over_fake_views(autojump_clock: trio.testing.MockClock) -> None:
    # An old leader's controller and a new one's, at once, over the same replicas and store:
    # the new one adopts, and the old one's runtime is refused from then on.
    rt = FakeRuntime(auto_ready=True)
    store = controller.MemoryStore()
    new = rt.view()
    config = controller.BackendConfig(num_replicas=2, health_check_period_s=0)
    rt.fence(1)
    async with controller.open_controller(runtime=rt, store=store) as old_ctl:
        await (await old_ctl.deploy("a", config, RC)).wait()
        tags = sorted(rt.tags())
        assert [rt.replicas[t].epoch for t in tags] == [1, 1]
        new.fence(2)
        async with controller.open_controller(runtime=new, store=store) as new_ctl:
            await new_ctl.wait_until(
                lambda c: [r.state.value for r in c.status("a").replicas] == ["RUNNING"] * 2
            )
            assert [rt.replicas[t].epoch for t in tags] == [2, 2]
            assert rt.start_calls == 2  # adopted, none started
            with pytest.raises(FencedError):
                await rt.kill_replica(tags[0])
            assert rt.fenced == [("kill", tags[0], 1)]
            assert sorted(rt.tags()) == tags
    for tag in tags:  # closing either controller left the replicas running
        await new.kill_replica(tag)
    assert rt.tags() == []
    assert rt.fenced == [("kill", tags[0], 1)]


@pytest.mark.parametrize("check", controller.testing.FENCING_CHECKS, ids=lambda c: c.__name__)
async def test_fake_runtime_passes_the_fencing_checks(
    check: Callable[[controller.testing.Subject], Awaitable[None]],
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)

    async def crash(runtime: controller.Runtime, tag: str) -> None:
        raise AssertionError("the fencing checks crash nothing")

    subject = controller.testing.Subject(
        runtime=rt.view,
        store=controller.MemoryStore(),
        replica=RC,
        ignores_drain=RC,
        crash=crash,
    )
    await check(subject)
    assert rt.tags() == []
    assert [op for op, _, _ in rt.fenced] == ["drain", "reconfigure", "kill"] * 2


async def test_a_drain_asked_again_runs_once(harness: Harness) -> None:
    """Found by an outside attack: a leader that took over a stop under way asked the worker to
    drain again, and the replica's drain ran twice at once. A second ask now waits for the
    drain under way (which runs in the worker, whoever asked and whether they are still there)."""
    record = Path(harness.record)
    runtime = harness.local()
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(runtime.serve, _ignore)
            runtime.fence(2)
            await runtime.start_replica(_spec("a#1", harness.recorder(drain_s=0.5)))
            async with trio.open_nursery() as drains:
                for _ in range(2):  # the old leader's ask, and the new one's
                    drains.start_soon(runtime.drain_replica, "a#1")
            assert [e["what"] for e in _events(record)] == ["init", "drain", "drained"]
            await runtime.kill_replica("a#1")
            nursery.cancel_scope.cancel()
