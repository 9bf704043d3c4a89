"""RayRuntime and RayKVStore against a real local Ray cluster of two nodes, started here.

Real clock (Ray's calls are real I/O), every wait bounded by fail_after.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

import controller
import controller.testing
from controller import GoalOutcome
from controller._ports.wrap import RuntimeWrapper

from ..replicas import events

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from controller.ray import RayKVStore, RayRuntime  # noqa: E402
from controller.ray import _runtime as ray_runtime  # noqa: E402

from ..ray_cluster import local_cluster  # noqa: E402

HERE = Path(__file__).parent.parent
#: Generous: a Ray worker process takes a while to start on a busy machine (beside a CPU hog
#: and another test run, two actor starts took past 60 s).
LIMIT_S = 120
FAST_RESTARTS = controller.RestartPolicy(initial_delay_s=0.1, max_delay_s=0.2, jitter=0)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Two nodes on this machine, 2 CPUs and one "slot" each, so that placement is per node."""
    node = {"num_cpus": 2, "resources": {"slot": 1}}
    with local_cluster(node, [node]) as ray_cluster:
        yield ray_cluster


_namespaces = iter(range(10**6))


class Harness:
    def __init__(self, record: Path):
        self.namespace = f"test{os.getpid()}-{next(_namespaces)}"
        self.record = str(record)
        self.runtime = RayRuntime(namespace=self.namespace, pythonpath=[HERE])
        self.store = RayKVStore(self.namespace)

    def recorder(self, **kwargs: object) -> controller.ReplicaConfig:
        return controller.ReplicaConfig(
            "replicas:BlockingRecorder", init_kwargs={"path": self.record, **kwargs}
        )


@pytest.fixture
async def harness(cluster: Cluster, tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(tmp_path / "events.jsonl")
    yield h
    leftover = await h.runtime.list_replicas()
    for tag in leftover:
        ray.kill(ray.get_actor(tag, namespace=h.namespace), no_restart=True)
    assert leftover == [], "a test left actors behind"


def cfg(**kwargs: object) -> controller.BackendConfig:
    kwargs.setdefault("version", "v1")
    return controller.BackendConfig(**kwargs)


async def serving_other_than(
    ctl: controller.Controller, name: str, count: int, old: set[str]
) -> controller.BackendSnapshot:
    """The first snapshot of `name` with `count` replicas, none of them in `old`."""
    snapshot = ctl.snapshot(name)
    while len(snapshot.replicas) != count or {r.tag for r in snapshot.replicas} & old:
        snapshot = (await ctl.listen_for_change({name: snapshot.snapshot_id}))[name]
    return snapshot


def pids(record: str, what: str = "init") -> list[int]:
    return [e["pid"] for e in events(record) if e["what"] == what]


async def test_start_ready_reconfigure_and_delete(harness: Harness) -> None:
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            goal = await ctl.deploy(
                "a", cfg(num_replicas=2, user_config={"n": 1}), harness.recorder()
            )
            assert await goal.wait() is GoalOutcome.COMPLETED
            replicas = ctl.status("a").replicas
            assert sorted(await harness.runtime.list_replicas()) == sorted(r.tag for r in replicas)
            assert all(r.address and r.address.startswith("127.0.0.1:") for r in replicas)
            started = pids(harness.record)
            assert len(set(started)) == 2  # two actors, two processes
            recorded = [e["config"] for e in events(harness.record) if e["what"] == "reconfigure"]
            assert recorded == [{"n": 1}] * 2  # applied before the replicas counted as ready

            goal = await ctl.deploy(
                "a", cfg(num_replicas=2, user_config={"n": 2}), harness.recorder()
            )
            assert await goal.wait() is GoalOutcome.COMPLETED
            assert {r.tag for r in ctl.status("a").replicas} == {r.tag for r in replicas}
            reconfigured = [e for e in events(harness.record) if e["what"] == "reconfigure"][2:]
            assert sorted(e["pid"] for e in reconfigured) == sorted(started)  # in place
            assert [e["config"] for e in reconfigured] == [{"n": 2}] * 2

            await (await ctl.delete("a")).wait()
            assert await harness.runtime.list_replicas() == []
            assert sorted(pids(harness.record, "drained")) == sorted(pids(harness.record, "drain"))


async def test_a_failing_health_check_replaces_the_replica(harness: Harness) -> None:
    config = cfg(health_check_period_s=0.2, health_check_failure_threshold=2)
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            await (await ctl.deploy("a", config, harness.recorder())).wait()
            [old] = ctl.status("a").replicas
            [pid] = pids(harness.record)
            await trio.Path(f"{harness.record}.sick.{pid}").touch()
            snapshot = await serving_other_than(ctl, "a", 1, {old.tag})
            assert pids(harness.record)[1:] != [pid]  # a new actor process
            assert await harness.runtime.list_replicas() == [snapshot.replicas[0].tag]
            await (await ctl.delete("a")).wait()


async def test_a_wave_of_checks_is_one_call_and_says_each_actors_outcome(
    harness: Harness,
) -> None:
    rt = harness.runtime
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(rt.serve, lambda tag, reason: None)
            for tag in ("w#1", "w#2"):
                spec = controller.ReplicaSpec(tag, "w", "v1", harness.recorder(), None, {})
                await rt.start_replica(spec)
            sick = pids(harness.record)[1]
            await trio.Path(f"{harness.record}.sick.{sick}").touch()
            got: list[tuple[str, Exception | None]] = []
            await rt.check_health_replicas(["w#1", "w#2", "gone#1"], got.extend)
            outcome = dict(got)
            assert len(got) == 3
            # The actor of the second pid is sick, whichever tag it has; the other passes.
            failed = [tag for tag in ("w#1", "w#2") if outcome[tag] is not None]
            assert len(failed) == 1
            assert isinstance(outcome[failed[0]], controller.ReplicaError)
            assert isinstance(outcome["gone#1"], controller.ReplicaGoneError)
            for tag in ("w#1", "w#2"):
                await rt.kill_replica(tag)
            nursery.cancel_scope.cancel()


async def test_an_actor_killed_from_outside_is_replaced(harness: Harness) -> None:
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            await (await ctl.deploy("a", cfg(num_replicas=2), harness.recorder())).wait()
            victim = ctl.status("a").replicas[0].tag
            ray.kill(ray.get_actor(victim, namespace=harness.namespace), no_restart=True)
            snapshot = await serving_other_than(ctl, "a", 2, {victim})
            assert sorted(await harness.runtime.list_replicas()) == sorted(
                r.tag for r in snapshot.replicas
            )
            assert len(pids(harness.record)) == 3
            assert "actor died" in ctl.status("a").events[-1].message or any(
                "actor died" in e.message for e in ctl.status("a").events
            )
            await (await ctl.delete("a")).wait()


async def test_drain_honoured(harness: Harness) -> None:
    config = cfg(graceful_shutdown_timeout_s=10)
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            await (await ctl.deploy("a", config, harness.recorder(drain_s=0.5))).wait()
            await (await ctl.delete("a")).wait()
            whats = [e["what"] for e in events(harness.record)]
            assert whats[-2:] == ["drain", "drained"]
            assert await harness.runtime.list_replicas() == []


async def test_drain_ignored_is_killed_at_the_deadline(harness: Harness) -> None:
    config = cfg(graceful_shutdown_timeout_s=1)
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            await (await ctl.deploy("a", config, harness.recorder(drain_s=600))).wait()
            started = time.monotonic()
            await (await ctl.delete("a")).wait()
            took = time.monotonic() - started
            # Killed at its 1 s deadline, not after the 600 s it would drain (the margin is for
            # a machine at load 20: Ray's kill is a round trip through its GCS).
            assert 1.0 <= took < 30.0
            whats = [e["what"] for e in events(harness.record)]
            assert "drain" in whats
            assert "drained" not in whats
            assert await harness.runtime.list_replicas() == []


async def test_an_infeasible_deploy_fails_fast_and_leaves_nothing(harness: Harness) -> None:
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            # Two nodes with one slot each: two slots in all, but not on one node.
            with pytest.raises(controller.InfeasibleError) as caught:
                await ctl.deploy("a", cfg(resources={"slot": 2}), harness.recorder())
            message = str(caught.value)
            assert "needing {'slot': 2.0} and a replica slot each" in message
            # What each node has, and how many replicas it holds at all.
            each = r"\{'slot': 1\.0, 'replica_slots': \d+\.0\}"
            assert re.search(rf"2 nodes \({each}, {each}", message), message
            with pytest.raises(controller.InfeasibleError):
                await ctl.deploy(
                    "b", cfg(num_replicas=3, resources={"slot": 1}), harness.recorder()
                )
            assert ctl.status().backends == ()
            assert await harness.runtime.list_replicas() == []
            assert await harness.store.read_all() == {}
            # One per node fits, and then a third does not.
            await (
                await ctl.deploy(
                    "c", cfg(num_replicas=2, resources={"slot": 1}), harness.recorder()
                )
            ).wait()
            with pytest.raises(controller.InfeasibleError):
                await ctl.deploy("d", cfg(resources={"slot": 1}), harness.recorder())
            await (await ctl.delete("c")).wait()


async def test_a_replica_pending_past_its_start_timeout_is_killed_and_reported(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = harness.runtime

    async def unbounded() -> None:
        """Claims unlimited capacity, so that Ray is asked for what it cannot place."""
        await trio.lowlevel.checkpoint()

    async def anywhere(*args: object) -> str:
        """A node chosen on a view that is out of date: Ray is left to place it, and cannot."""
        await trio.lowlevel.checkpoint()
        return "stale"

    monkeypatch.setattr(runtime, "capacity", unbounded)
    monkeypatch.setattr(runtime._nodes, "choose", anywhere)
    monkeypatch.setattr(ray_runtime, "placement_options", lambda node: {})
    config = cfg(resources={"slot": 2}, start_timeout_s=0.5)
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(
            runtime=runtime, store=harness.store, restart_policy=FAST_RESTARTS
        ) as ctl:
            goal = await ctl.deploy("a", config, harness.recorder())
            with pytest.raises(controller.GoalFailed, match="ReplicaStartTimeout"):
                await goal.wait()
            assert ctl.status("a").state is controller.BackendState.DEPLOY_FAILED
            # What the failed starts left is killed: nothing is left pending in Ray.
            await ctl.wait_until(lambda c: not c.status("a").replicas)
            assert await runtime.list_replicas() == []
            await (await ctl.delete("a")).wait()


T = TypeVar("T")


class StrayKills(RuntimeWrapper):
    """Tells when a kill of a replica no intent names (``stray#...``) has finished."""

    def __init__(self, inner: controller.Runtime) -> None:
        super().__init__(inner)
        self.killed = trio.Event()

    async def around(self, op: str, tag: str | None, work: Callable[[], Awaitable[T]]) -> T:
        result = await work()
        if op == "kill" and tag is not None and tag.startswith("stray#"):
            self.killed.set()
        return result


async def test_a_second_driver_adopts_the_first_ones_replicas(
    harness: Harness, cluster: Cluster
) -> None:
    with trio.fail_after(LIMIT_S):
        result = await trio.run_process(
            [
                sys.executable,
                str(HERE / "ray_driver.py"),
                "adopt",
                cluster.address,
                harness.namespace,
                harness.record,
            ],
            capture_stdout=True,
            capture_stderr=True,
        )
        made = json.loads(result.stdout.decode().strip().splitlines()[-1])
        assert sorted(await harness.runtime.list_replicas()) == sorted([*made["tags"], "stray#0"])
        started = pids(harness.record)
        runtime = StrayKills(harness.runtime)
        async with controller.open_controller(runtime=runtime, store=harness.store) as ctl:
            # Listed at once, as they may be serving; then adopted, not restarted.
            assert sorted(r.tag for r in ctl.snapshot("a").replicas) == made["tags"]
            await ctl.wait_until(
                lambda c: {r.state.value for r in c.status("a").replicas} == {"RUNNING"}
            )
            assert pids(harness.record) == started  # none restarted
            await runtime.killed.wait()
            assert sorted(await harness.runtime.list_replicas()) == made["tags"]  # stray killed
            await (await ctl.delete("a")).wait()


async def test_kv_store_round_trip_and_a_journal_left_by_a_crash(harness: Harness) -> None:
    from ray.experimental import internal_kv

    store = harness.store
    assert await store.read_all() == {}
    await store.write({"a": "1", "b": "2"})
    await store.write({"a": None, "c": "é"})
    assert await store.read_all() == {"b": "2", "c": "é"}
    assert await RayKVStore(harness.namespace + "-other").read_all() == {}
    # A crash after the journal was put but before the batch was applied: the reader finishes it.
    internal_kv._internal_kv_put(
        b"journal", json.dumps({"b": None, "d": "4"}), namespace=harness.namespace
    )
    assert await RayKVStore(harness.namespace).read_all() == {"c": "é", "d": "4"}
    assert await store.read_all() == {"c": "é", "d": "4"}


async def test_waiting_on_a_ref_takes_no_thread_and_is_cancellable(cluster: Cluster) -> None:
    import asyncio
    import threading

    from controller.ray._await import wait_ref

    @ray.remote(num_cpus=0)
    class Waiter:
        async def forever(self) -> None:
            await asyncio.Event().wait()

    assert await wait_ref(ray.put(5)) == 5
    threads = threading.active_count()
    with trio.fail_after(LIMIT_S):
        waiter = Waiter.remote()  # type: ignore[attr-defined]
        ref = waiter.forever.remote()
        with trio.move_on_after(0.5) as waited:
            await wait_ref(ref, cancel_remote=True)
        assert waited.cancelled_caught
        assert threading.active_count() == threads
        # The remote call was cancelled too, not left waiting in the actor.
        with pytest.raises(ray.exceptions.TaskCancelledError):
            await wait_ref(ref)
        ray.kill(waiter)


async def test_a_driver_killed_mid_rollout_is_taken_over(
    harness: Harness, cluster: Cluster
) -> None:
    import subprocess

    # Eight actors start in turn here (three of v1, a v2 killed mid-start, three more of v2
    # at 2 s each): about 40 s beside a full test run and a CPU hog, and past 60 s when the
    # other run's Ray tests start actors at the same time. The bound is for a hang.
    with trio.fail_after(LIMIT_S * 2):
        driver = await trio.lowlevel.open_process(
            [
                sys.executable,
                str(HERE / "ray_driver.py"),
                "rollout",
                cluster.address,
                harness.namespace,
                harness.record,
            ],
            stdout=subprocess.PIPE,
        )
        assert driver.stdout is not None
        try:
            said = b""
            async for chunk in driver.stdout:
                said += chunk
                if b"rolling" in said:
                    break
        finally:
            # Here as planned, and also when the wait above fails: not left to the next test.
            with trio.CancelScope(shield=True):
                driver.kill()  # kill -9, mid-rollout
                code = await driver.wait()
                await driver.stdout.aclose()
        assert code == -9
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            # The user asks again for what the dead driver was rolling out: the same spec, so
            # the recovered backend's own goal, reached once the rollout is done.
            v2 = controller.ReplicaConfig("replicas:SlowInit", init_kwargs={"seconds": 2})
            goal = await ctl.deploy("a", cfg(num_replicas=3, version="v2", max_surge=1), v2)
            assert goal.generation == 2  # not a new deploy: the intent was already stored
            assert await goal.wait() is GoalOutcome.COMPLETED
            status = ctl.status("a")
            assert status.counts_by_version == {("v2", controller.ReplicaState.RUNNING): 3}
            live = await harness.runtime.list_replicas()
            assert sorted(live) == sorted(r.tag for r in status.replicas)  # no orphan, no v1
            await (await ctl.delete("a")).wait()


async def test_the_daemon_on_ray_keeps_its_replicas_across_a_restart(
    harness: Harness, cluster: Cluster
) -> None:
    from ..daemons import Daemon, manifest, running

    state = Path(tempfile.mkdtemp(prefix="dr", dir="/tmp"))
    file = state / "backends.toml"
    file.write_text(manifest(a={"entrypoint": "replicas:Trivial", "num_replicas": 2}))
    ray_args = ["--runtime", "ray", "--store", "ray", "--ray-address", cluster.address]
    ray_args += ["--namespace", harness.namespace]
    # A lease longer than the default 2 s: on a starved machine a late renewal must not make
    # this daemon stand by (test_standby_ray says why).
    ray_args += ["--lease-duration", "5", "--lease-renew", "1"]
    first: Daemon | None = None
    try:
        with trio.fail_after(LIMIT_S):
            async with trio.open_nursery() as nursery:
                first = Daemon(state)
                await first.start(nursery, *ray_args)
                result = await first.cli("apply", "-f", str(file), "--wait")
                assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
                tags = {r["tag"] for r in (await first.status())["a"]["replicas"]}
                assert await first.stop() == 0  # SIGTERM: the actors live on in the cluster
                assert sorted(await harness.runtime.list_replicas()) == sorted(tags)
            async with running(state, *ray_args) as second:
                assert (await second.cli("wait", "a")).returncode == 0
                assert {r["tag"] for r in (await second.status())["a"]["replicas"]} == tags
        assert await harness.runtime.list_replicas() == []  # shutdown drained them
    except BaseException:
        if first is not None:  # what the first daemon said, shown with the failure
            print(first.log.decode(errors="replace")[-6000:])
        raise
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.mark.parametrize(
    "check",
    [*controller.testing.CONFORMANCE_CHECKS, *controller.testing.FENCING_CHECKS],
    ids=lambda c: c.__name__,
)
async def test_ray_runtime_conforms(
    harness: Harness, check: Callable[[controller.testing.Subject], Awaitable[None]]
) -> None:
    async def crash(runtime: controller.Runtime, tag: str) -> None:
        handle = await trio.to_thread.run_sync(
            lambda: ray.get_actor(tag, namespace=harness.namespace)
        )
        await trio.to_thread.run_sync(lambda: ray.kill(handle, no_restart=True))

    subject = controller.testing.Subject(
        runtime=lambda: RayRuntime(namespace=harness.namespace, pythonpath=[HERE]),
        store=harness.store,
        replica=harness.recorder(),
        ignores_drain=harness.recorder(drain_s=600),
        crash=crash,
    )
    with trio.fail_after(LIMIT_S):
        await check(subject)


def test_the_kv_store_retries_ray_s_failures_but_not_its_own_bugs() -> None:
    from ray.exceptions import RaySystemError

    from controller.ray._kv_store import _as_store_error

    def lost() -> None:
        # Ray's exceptions carry no type hints.
        raise RaySystemError("lost the connection to the control store")  # type: ignore[no-untyped-call]

    def bug() -> None:
        raise KeyError("a bug of ours")

    with pytest.raises(controller.StoreError, match="lost the connection"):
        _as_store_error("writing", lost)
    with pytest.raises(KeyError):  # not a StoreError: a retry would fail the same, for ever
        _as_store_error("writing", bug)


async def test_code_is_served_by_its_actor_through_an_ingress(harness: Harness) -> None:
    """A function backend on Ray: each actor serves HTTP on its replica's address (the trio
    loop of the actor runs the server), an ingress that follows the controller routes to them,
    the served counts reach status, and a delete drains them."""
    from controller.ingress import ControllerSource, Ingress, open_listener

    from ..http_client import request

    with trio.fail_after(LIMIT_S):
        async with (
            controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl,
            trio.open_nursery() as nursery,
        ):
            config = cfg(num_replicas=2, route_prefix="/c")
            counting = controller.ReplicaConfig("serving_apps:Counting")
            assert await (await ctl.deploy("c", config, counting)).wait() is GoalOutcome.COMPLETED
            for replica in ctl.status("c").replicas:
                assert replica.address is not None
                host, _, port = replica.address.rpartition(":")
                assert (await request(int(port), "/c/x", host=host)).json()["tag"] == replica.tag
            ingress = Ingress(ControllerSource(ctl))
            await nursery.start(ingress.run)
            listener = await open_listener("127.0.0.1", 0)
            await nursery.start(ingress.serve, [listener])
            port = listener.socket.getsockname()[1]
            tags = {(await request(port, "/c/x")).json()["tag"] for _ in range(20)}
            assert tags == {r.tag for r in ctl.status("c").replicas}
            await ctl.wait_until(lambda c: sum(c.status("c").load.served.values()) == 22)
            await (await ctl.delete("c")).wait()
            assert await harness.runtime.list_replicas() == []
            nursery.cancel_scope.cancel()


async def test_a_multiplexed_backend_on_ray_routes_by_model_and_reports_its_models(
    harness: Harness,
) -> None:
    """@controller.multiplexed in Ray actors: a burst for a model is one load on one actor, the
    requests that follow land there, and the models reach status through the actor's load."""
    from controller.ingress import ControllerSource, Ingress, open_listener

    from ..http_client import request

    with trio.fail_after(LIMIT_S):
        async with (
            controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl,
            trio.open_nursery() as nursery,
        ):
            config = cfg(num_replicas=2, route_prefix="/m")
            code = controller.ReplicaConfig("serving_apps:MultiModel")
            assert await (await ctl.deploy("m", config, code)).wait() is GoalOutcome.COMPLETED
            ingress = Ingress(ControllerSource(ctl))
            await nursery.start(ingress.run)
            listener = await open_listener("127.0.0.1", 0)
            await nursery.start(ingress.serve, [listener])
            port = listener.socket.getsockname()[1]
            answers: list[dict[str, Any]] = []

            async def one(model: str) -> None:
                answer = await request(port, "/m", headers=[("x-model-id", model)])
                answers.append(answer.json())

            async with trio.open_nursery() as clients:
                for _ in range(8):
                    clients.start_soon(one, "a")
            assert len({a["replica"] for a in answers}) == 1
            assert max(a["loads"].count("a") for a in answers) == 1
            home = answers[0]["replica"]
            await one("b")
            assert answers[-1]["replica"] != home  # the replica with room for a model
            await ctl.wait_until(
                lambda c: (
                    {t: s.models for t, s in c.status("m").load.models.items()}
                    == {home: ("a",), answers[-1]["replica"]: ("b",)}
                )
            )
            await (await ctl.delete("m")).wait()
            nursery.cancel_scope.cancel()


async def test_replicas_on_ray_call_each_other_through_handles(
    harness: Harness, cluster: Cluster
) -> None:
    """A daemon on Ray: its actors follow the routes with the route token, A calls B through a
    handle, and a deadline on A's request cancels B's handler in its actor; the two as one
    application, changed and undone as one."""
    from ..daemons import free_port, manifest, running
    from ..http_client import request

    state = Path(tempfile.mkdtemp(prefix="dh", dir="/tmp"))
    file = state / "backends.toml"
    link = {"entrypoint": "handle_apps:Link", "num_replicas": 1, "version": "v1"}

    def write(version: str) -> None:
        both = manifest(
            a={**link, "version": version, "init_kwargs": {"then": "b"}, "route_prefix": "/a"},
            b={**link, "version": version, "route_prefix": "/b"},
        )
        file.write_text(both + '[applications.ab]\nentry = "a"\nbackends = ["b"]\n')

    write("v1")
    port = free_port()
    ray_args = ["--runtime", "ray", "--store", "ray", "--ray-address", cluster.address]
    ray_args += ["--namespace", harness.namespace, "--ingress-listen", f"127.0.0.1:{port}"]
    ray_args += ["--pythonpath", str(HERE), "--lease-duration", "5", "--lease-renew", "1"]
    try:
        # Three rollouts of two backends of Ray actors: at load 25 (two suites beside two CPU
        # hogs) they took more than 120 s. A bound on a hang, not on speed.
        with trio.fail_after(LIMIT_S * 3):
            async with running(state, *ray_args) as daemon:
                result = await daemon.cli("apply", "-f", str(file), "--wait")
                assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
                answer = (await request(port, "/a/go?s=0")).json()
                assert (answer["via"], answer["then"]["at"]) == ("a", "b")
                late = await request(port, "/a/go?s=10", headers=[("x-request-timeout-ms", "500")])
                assert late.status == 504
                counts = (await request(port, "/b/stats?until=cancelled&n=1")).json()
                assert counts == {"inside": 0, "cancelled": 1}
                write("v2")
                assert (await daemon.cli("apply", "-f", str(file), "--wait")).returncode == 0
                undone = await daemon.cli("rollout", "undo", "ab", "--wait")
                assert undone.returncode == 0, undone.stdout.decode() + undone.stderr.decode()
                versions = {n: s["version"] for n, s in (await daemon.status()).items()}
                assert versions == {"a": "v1", "b": "v1"}
                answer = (await request(port, "/a/go?s=0")).json()
                assert (answer["version"], answer["then"]["version"]) == ("v1", "v1")
        assert await harness.runtime.list_replicas() == []
    finally:
        shutil.rmtree(state, ignore_errors=True)
