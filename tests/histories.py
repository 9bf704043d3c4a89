"""Random histories' steps and the checks after each (tests/core/test_histories.py, and
tests/core/test_fencing.py with leader changes interleaved): hypothesis draws each step from the
state so far, and runs it against FakeRuntime under MockClock."""

from __future__ import annotations

import contextlib

import attrs
import trio
import trio.testing
from hypothesis import strategies as st

import controller
from controller._backend.replica_set import entry_of
from controller._model.decisions.census import Census
from controller._model.records.checkpoint import join_replicas
from controller._model.records.replica_state import SERVING_STATES
from controller.testing import FakeRuntime, FakeState

from .conftest import RC

OPS = st.sampled_from(
    [
        "deploy",
        "deploy",
        "delete",
        "finish_starts",
        "finish_drains",
        "crash",
        "unhealthy",
        "sleep",
        "restart",
    ]
)


def backend_config(data: st.DataObject) -> controller.BackendConfig:
    return controller.BackendConfig(
        num_replicas=data.draw(st.integers(0, 6), label="num_replicas"),
        version=data.draw(st.sampled_from(["v1", "v2", "v3"]), label="version"),
        user_config=data.draw(st.integers(0, 2), label="user_config"),
        start_timeout_s=30,
        graceful_shutdown_timeout_s=data.draw(st.sampled_from([0, 5]), label="grace"),
        health_check_period_s=data.draw(st.sampled_from([0, 10]), label="health"),
        health_check_failure_threshold=1,
        max_surge=data.draw(st.sampled_from([0, 1, 0.5]), label="surge"),
        max_unavailable=data.draw(st.sampled_from([1, 0.25]), label="unavailable"),
    )


def check_agreement(ctl: controller.Controller, rt: FakeRuntime) -> None:
    """At a quiet moment: what the controller holds is what the runtime has, nothing more."""
    shown = {r.tag: r for b in ctl.status().backends for r in b.replicas}
    live = {tag for tag, r in rt.replicas.items() if r.state is not FakeState.DEAD}
    orphans = live - set(shown)
    assert not orphans, f"live in the runtime, unknown to the controller: {orphans}"
    for tag, replica in shown.items():
        if replica.state in (controller.ReplicaState.RUNNING, controller.ReplicaState.UPDATING):
            assert rt.replicas[tag].state is FakeState.READY, (tag, rt.replicas[tag].state)
    serving = {r.tag for b in ctl.status().backends for r in ctl.snapshot(b.name).replicas}
    dead = {tag for tag in serving if rt.replicas[tag].state is FakeState.DEAD}
    assert not dead, f"the watch routes to dead replicas: {dead}"
    # The chart's cheap counts are what the full status says.
    counted = {n.name: (n.desired, n.ready) for n in ctl.numbers()}
    assert counted == {
        b.name: (b.desired_replicas, sum(1 for r in b.replicas if r.state in SERVING_STATES))
        for b in ctl.status().backends
    }
    # A listing's summary is the full status less its replicas and events.
    for full in ctl.status().backends:
        summary = ctl.summary(full.name)
        assert not summary.replicas
        assert not summary.events
        assert dict(summary.counts_by_version) == dict(full.counts_by_version)
        assert not summary.failed_starts
        whole = attrs.evolve(
            summary,
            replicas=full.replicas,
            events=full.events,
            failed_starts=full.failed_starts,
            tally=None,
        )
        assert whole == full
    # What each backend keeps counted as its replicas change is what counting them gives.
    for backend in ctl._backends.values():
        kept = backend._set
        assert dict(kept.census.items()) == dict(Census.of(kept.by_tag.values()).items())
        assert kept.unhealthy == sum(not r.healthy for r in kept.by_tag.values())
        # The checkpoint its pages make is what encoding every replica anew makes.
        fresh = ",".join(entry_of(r) for r in kept.by_tag.values())
        made = join_replicas(kept.name, fresh, kept.failed, kept.autoscale(), kept.rollout())
        assert kept.record_text() == made
        listed = [
            r.tag
            for r in kept.by_tag.values()
            if r.view is not None and r.healthy and r.state is not controller.ReplicaState.STOPPING
        ]
        assert sorted(r.tag for r in kept.serving) == sorted(listed)
        # Each listed replica knows its place in the list, and only those do.
        assert {r.tag: r.listed_at for r in kept.by_tag.values() if r.listed_at is not None} == {
            r.tag: i for i, r in enumerate(kept.serving)
        }


async def quiet(ctl: controller.Controller, rt: FakeRuntime, latest: dict[str, object]) -> None:
    """End the history: starts and drains answer at once, health recovers, and the user deploys
    (or deletes) once more what they last asked for. Everything must converge."""
    rt.auto_ready = rt.auto_drain = True
    for tag in rt.tags(FakeState.STARTING):
        rt.finish_start(tag)
    for tag in rt.tags(FakeState.DRAINING):
        rt.finish_drain(tag)
    for replica in rt.replicas.values():
        replica.health_error = None
    goals = []
    for name, cfg in latest.items():
        if cfg is None:
            with contextlib.suppress(controller.UnknownBackendError):  # gone already
                goals.append(await ctl.delete(name))
        else:
            assert isinstance(cfg, controller.BackendConfig)
            goals.append(await ctl.deploy(name, cfg, RC))
    for goal in goals:
        assert await goal.wait() is controller.GoalOutcome.COMPLETED
    # A goal reached earlier stays reached when replicas die later (the same spec again returns
    # that goal): full strength comes back by replacement, which the watch shows.
    for backend in ctl.status().backends:
        want = backend.backend_config.num_replicas
        snapshot = ctl.snapshot(backend.name)
        while len(snapshot.replicas) != want:
            snapshot = (await ctl.listen_for_change({backend.name: snapshot.snapshot_id}))[
                backend.name
            ]
    await trio.testing.wait_all_tasks_blocked()
    check_agreement(ctl, rt)
    shown = {r.tag for b in ctl.status().backends for r in b.replicas}
    assert shown == set(rt.tags(FakeState.READY))
    for backend in ctl.status().backends:
        want = backend.backend_config.num_replicas
        assert backend.counts == ({controller.ReplicaState.RUNNING: want} if want else {})
        assert backend.goal_done


async def step(
    data: st.DataObject, ctl: controller.Controller, rt: FakeRuntime, latest: dict[str, object]
) -> None:
    op = data.draw(OPS, label="op")
    name = data.draw(st.sampled_from(["a", "b"]), label="backend")
    if op == "deploy":
        cfg = backend_config(data)
        await ctl.deploy(name, cfg, RC)
        latest[name] = cfg
    elif op == "delete" and latest.get(name) is not None:
        await ctl.delete(name, force=data.draw(st.booleans(), label="force"))
        latest[name] = None
    elif op == "finish_starts":
        for tag in rt.tags(FakeState.STARTING):
            fate = data.draw(st.sampled_from(["ready", "fail", "hang"]), label="start")
            if fate == "ready":
                rt.finish_start(tag)
            elif fate == "fail":
                rt.fail_start(tag, "ValueError", "bad luck")
    elif op == "finish_drains":
        for tag in rt.tags(FakeState.DRAINING):
            if data.draw(st.booleans(), label="drain done"):
                rt.finish_drain(tag)
    elif op == "crash" and rt.tags(FakeState.READY):
        rt.crash(data.draw(st.sampled_from(rt.tags(FakeState.READY)), label="crash"))
    elif op == "unhealthy" and rt.tags(FakeState.READY):
        tag = data.draw(st.sampled_from(rt.tags(FakeState.READY)), label="unhealthy")
        rt.replicas[tag].health_error = ("RuntimeError", "sick")
    elif op == "sleep":
        await trio.sleep(data.draw(st.sampled_from([0.5, 3, 11, 31, 120]), label="sleep"))
