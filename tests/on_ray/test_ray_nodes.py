"""A Ray cluster of four nodes on this machine (``ray.cluster_utils.Cluster``), each with a
custom resource and a zone label so that placement is visible: spread, per-node caps and
labels hold; a node drained under traffic through an ingress fails no request and never leaves
fewer replicas serving than the budget allows; a node whose raylet is killed under traffic has
its replicas replaced on the others, with the failed requests counted.

Ray declares a node dead after its health checks fail: set to 0.5 s x 3 here (the default is
3 s x 5, about 15 s), so that a loss is seen within seconds, as a tuned cluster would."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import controller
from controller.ingress import ControllerSource, Ingress, IngressConfig, open_listener

from ..daemons import Daemon, deploy, running, until
from ..daemons import settled as settled_version
from ..http_client import Conn, request

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Ray tests run on Linux")

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from controller.ray import RayKVStore, RayRuntime  # noqa: E402

from ..ray_cluster import local_cluster  # noqa: E402

HERE = str(Path(__file__).parent.parent)
LIMIT_S = 180
RC = controller.ReplicaConfig("http_replica:HTTPReplica")
FAST_DEATH = {
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
    "health_check_initial_delay_ms": 0,
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    head = {
        "num_cpus": 1,
        "resources": {"node0": 100},
        "labels": {"zone": "a"},
        "_system_config": FAST_DEATH,
    }
    more = [
        {"num_cpus": 1, "resources": {"node1": 100}, "labels": {"zone": "a"}},
        {"num_cpus": 1, "resources": {"node2": 100}, "labels": {"zone": "b"}},
        {"num_cpus": 1, "resources": {"node3": 100}, "labels": {"zone": "b"}},
    ]
    with local_cluster(head, more) as ray_cluster:
        yield ray_cluster


_namespaces = iter(range(10**6))


def cfg(**kwargs: object) -> controller.BackendConfig:
    kwargs.setdefault("version", "v1")
    kwargs.setdefault("health_check_period_s", 1.0)
    kwargs.setdefault("graceful_shutdown_timeout_s", 5)
    return controller.BackendConfig(**kwargs)


@asynccontextmanager
async def opened() -> AsyncIterator[tuple[controller.Controller, RayRuntime]]:
    namespace = f"nodes{os.getpid()}-{next(_namespaces)}"
    runtime = RayRuntime(namespace=namespace, pythonpath=[HERE])
    async with controller.open_controller(runtime=runtime, store=RayKVStore(namespace)) as ctl:
        try:
            yield ctl, runtime
        finally:
            for status in ctl.status().backends:
                await ctl.delete(status.name, force=True)
            with trio.move_on_after(60):
                await ctl.wait_until(lambda c: not c.status().backends)
    assert await runtime_left(runtime) == []


async def runtime_left(runtime: RayRuntime) -> list[str]:
    return list(await runtime.list_replicas())


def nodes_of(ctl: controller.Controller, name: str) -> Counter[str]:
    return Counter(
        r.node
        for r in ctl.status(name).replicas
        if r.node is not None and r.state is controller.ReplicaState.RUNNING
    )


def zone_of(cluster: Cluster) -> dict[str, str]:
    return {n["NodeID"]: n["Labels"].get("zone", "") for n in ray.nodes() if n["Alive"]}


def serving(ctl: controller.Controller, name: str) -> int:
    return len(ctl.snapshot(name).replicas)


async def test_spread_caps_labels_and_pack_hold_on_real_nodes(cluster: Cluster) -> None:
    with trio.fail_after(LIMIT_S):
        async with opened() as (ctl, runtime):
            await (await ctl.deploy("spread", cfg(num_replicas=4), RC)).wait()
            assert sorted(nodes_of(ctl, "spread").values()) == [1, 1, 1, 1]
            # Where the actor says it runs (its own runtime context), not only our choice.
            listed = {n.id for n in await runtime.nodes()}
            assert set(nodes_of(ctl, "spread")) == listed
            with pytest.raises(controller.InfeasibleError, match="max_replicas_per_node=1"):
                await ctl.deploy("spread", cfg(num_replicas=5, max_replicas_per_node=1), RC)
            zones = zone_of(cluster)
            await (
                await ctl.deploy("zoned", cfg(num_replicas=3, node_labels={"zone": "b"}), RC)
            ).wait()
            assert {zones[n] for n in nodes_of(ctl, "zoned")} == {"b"}
            assert sorted(nodes_of(ctl, "zoned").values()) == [1, 2]
            await (await ctl.deploy("packed", cfg(num_replicas=3, placement="pack"), RC)).wait()
            assert list(nodes_of(ctl, "packed").values()) == [3]
            # A node named by a custom resource: resources select nodes as labels do.
            await (await ctl.deploy("on2", cfg(num_replicas=2, resources={"node2": 1}), RC)).wait()
            assert len(nodes_of(ctl, "on2")) == 1


class Traffic:
    """Clients looping GETs through an ingress, counting answers by status (-1: the
    connection failed)."""

    def __init__(self, port: int, path: str):
        self.port, self.path = port, path
        self.counts: Counter[int] = Counter()
        self.stop = trio.Event()
        self._wanted: tuple[int, trio.Event] | None = None

    async def answered(self, more: int) -> None:
        """Wait until `more` requests more have been answered 200."""
        done = trio.Event()
        self._wanted = (self.counts[200] + more, done)
        await done.wait()

    async def client(self) -> None:
        conn = await Conn.open(self.port)
        try:
            while not self.stop.is_set():
                try:
                    self.counts[(await conn.request(self.path)).status] += 1
                    if self._wanted is not None and self.counts[200] >= self._wanted[0]:
                        self._wanted[1].set()
                except ConnectionError:
                    self.counts[-1] += 1
                    await conn.aclose()
                    conn = await Conn.open(self.port)
                await trio.sleep(0.01)
        finally:
            await conn.aclose()


@asynccontextmanager
async def traffic(ctl: controller.Controller, path: str) -> AsyncIterator[Traffic]:
    async with trio.open_nursery() as nursery:
        ingress = Ingress(ControllerSource(ctl), IngressConfig())
        await nursery.start(ingress.run)
        listener = await open_listener("127.0.0.1", 0)
        await nursery.start(ingress.serve, [listener])
        flow = Traffic(listener.socket.getsockname()[1], path)
        for _ in range(4):
            nursery.start_soon(flow.client)
        try:
            yield flow
        finally:
            flow.stop.set()
            nursery.cancel_scope.cancel()


async def test_a_drain_under_traffic_fails_nothing_and_keeps_the_budget(cluster: Cluster) -> None:
    with trio.fail_after(LIMIT_S):
        async with opened() as (ctl, _):
            # Checks every 10 s, not every second: a check still in flight at the next period
            # counts as failed and takes its replica out of the snapshot, which a loaded
            # machine's Ray calls can make happen; what this test bounds is the drain's own
            # budget. (At load 11 it once saw 2 of 4 serving, with one replica on the drained
            # node: something besides the drain took one out. Its events were not kept; the
            # assertion now shows them.)
            config = cfg(
                num_replicas=4, route_prefix="/web", max_unavailable=0, health_check_period_s=10
            )
            await (await ctl.deploy("web", config, RC)).wait()
            target = next(iter(nodes_of(ctl, "web")))
            lowest = 4

            def record(c: controller.Controller) -> bool:
                nonlocal lowest
                lowest = min(lowest, serving(c, "web"))
                return False

            async with traffic(ctl, "/web/x") as flow, trio.open_nursery() as watching:
                watching.start_soon(ctl.wait_until, record)
                await flow.answered(20)
                row = await ctl.drain_node(target[:12])  # a prefix names it
                assert row.id == target
                assert row.replicas == {"web": 1}
                await ctl.wait_until(
                    lambda c: all(r.node != target for r in c.status("web").replicas)
                )
                assert {r.id: r.state for r in await ctl.nodes()}[target] == "drained"
                await ctl.wait_until(lambda c: serving(c, "web") == 4)
                await flow.answered(20)  # and traffic still flows after
                watching.cancel_scope.cancel()
            assert set(flow.counts) == {200}, flow.counts
            # max_unavailable=0: a replacement served before each stop.
            assert lowest >= 4, [(e.kind, e.message) for e in ctl.status("web").events]
            assert target not in nodes_of(ctl, "web")
            # Nothing new lands on a drained node, until it is uncordoned.
            await (await ctl.deploy("web", cfg(num_replicas=6, route_prefix="/web"), RC)).wait()
            assert target not in nodes_of(ctl, "web")
            assert (await ctl.uncordon_node(target)).state == "ready"


async def test_a_daemon_runs_an_ingress_on_each_node_that_needs_one(
    cluster: Cluster, tmp_path: Path
) -> None:
    """``controller run --runtime ray --node-ingress 0``: an ingress on the head and on each
    node with a replica of a routed backend; traffic enters through any of them; they follow
    the replicas as they move (a drain), and a shutdown stops them all."""
    namespace = f"nodes{os.getpid()}-{next(_namespaces)}"
    ray_args = ("--runtime", "ray", "--store", "ray", "--ray-address", cluster.address)
    # Not a test of leadership: a lease longer than the default 2 s, as a starved machine (two
    # CPU hogs beside the suite) delayed a renewal by 1.5 s, and the daemon stood down in the
    # middle of its shutdown.
    lease = ("--lease-duration", "10", "--lease-renew", "2")
    extra = (*ray_args, *lease, "--namespace", namespace, "--no-ingress", "--node-ingress", "0")
    head = ray.get_runtime_context().get_node_id()

    async def entrances(daemon: Daemon) -> dict[str, dict[str, Any]]:
        code, data = await daemon.http("GET", "/api/v1/ingress")
        assert code == 200, data
        return {e["node"]: e for e in data["nodes"]}

    async def settled(daemon: Daemon, nodes: set[str]) -> dict[str, dict[str, Any]]:
        """The ingresses once each of `nodes` has one serving (each start is logged)."""
        for node in nodes:
            await daemon.logged(f"ingress on node {node[:12]} serving on".encode())
        found = await entrances(daemon)
        assert set(found) == nodes, (found, nodes)
        assert all(e["state"] == "serving" for e in found.values()), found
        return found

    logs_before = ingress_logs()
    with trio.fail_after(LIMIT_S * 2):
        async with trio.open_nursery() as outer, running(tmp_path / "d", *extra) as daemon:
            await deploy(daemon, "web", num_replicas=2, route_prefix="/web", version="v1")
            status = await until(daemon, "web", settled_version("v1"))
            holding = {r["node"] for r in status["replicas"]}
            assert len(holding) == 2  # spread
            found = await settled(daemon, holding | {head})
            for entry in found.values():
                host, _, port = entry["address"].rpartition(":")
                answer = await request(int(port), "/web/x", host=host)
                assert answer.status == 200, (entry, answer.status)
                assert answer.json()["replica"].startswith("web#")
            listed = await daemon.cli("node", "list")
            assert listed.returncode == 0, listed.stderr
            assert found[head]["address"] in listed.stdout.decode()
            shown = await daemon.cli("status")
            assert b"node ingresses: " in shown.stdout
            # A drained node keeps no ingress (unless it is the head): it follows the replicas.
            away = next(iter(holding - {head}))
            drained = await daemon.cli("node", "drain", away, "--wait", "--timeout", "60")
            assert drained.returncode == 0, drained.stderr
            status = await until(daemon, "web", settled_version("v1"))
            now = {r["node"] for r in status["replicas"]}
            assert away not in now
            await daemon.logged(f"ingress on node {away[:12]} stopped".encode())
            await settled(daemon, now | {head})
            assert (await daemon.cli("node", "uncordon", away)).returncode == 0
            # `controller logs` on Ray: each replica's actor reads its own output, on its node.
            talker = {"entrypoint": "replicas:Talker", "num_replicas": 2, "version": "v1"}
            code, data = await daemon.http(
                "PUT", "/api/v1/backends/talk", json.dumps({**talker, "user_config": 7}).encode()
            )
            assert code == 200, data
            await until(daemon, "talk", settled_version("v1"))
            logs = await daemon.cli("logs", "talk")
            assert logs.returncode == 0, logs.stderr
            assert logs.stdout.count(b"talker says 7") == 2, logs.stdout
            # Stopped (SIGTERM) and started again on the same port: the node ingresses run on
            # through the restart, and the new daemon adopts the same processes.
            before = {n: e["pid"] for n, e in (await entrances(daemon)).items()}
            port = daemon.url.rpartition(":")[2]
            assert await daemon.stop() == 0
            serving = f"ingress on node {head[:12]} serving on".encode()
            times = daemon.log.count(serving)
            await daemon.start(outer, *extra, listen=f"127.0.0.1:{port}")
            await daemon.logged_times(serving, times + 1)
            adopted = {n: e["pid"] for n, e in (await entrances(daemon)).items()}
            assert adopted[head] == before[head]
        gone = [
            e for e in ray.util.list_named_actors(True) if e["namespace"] == f"{namespace}-ingress"
        ]
        assert gone == []  # the shutdown stopped every node's ingress
        # And left nothing of them or of the store running or on the nodes' disks (the fourth
        # attack found the fencing actor and every node ingress's log left behind).
        assert ingress_logs() - logs_before == set()
        fences = [
            e for e in ray.util.list_named_actors(True) if e["namespace"] == "controller-fences"
        ]
        assert namespace not in {e["name"] for e in fences}, fences
        assert "its fencing actor is removed" in daemon.log.decode()


def ingress_logs() -> set[Path]:
    """The node ingresses' log files on this machine (every node of the test cluster is)."""
    return set(Path(tempfile.gettempdir()).glob("controller-ingress-*.log"))


async def test_a_replica_s_own_load_reaches_the_autoscaler_on_ray(
    cluster: Cluster, tmp_path: Path
) -> None:
    load_file = tmp_path / "load"
    scaling = controller.AutoscalingConfig(
        max_replicas=4, target_ongoing_requests=2, downscale_stabilization_s=0
    )
    config = cfg(num_replicas=1, autoscaling=scaling)
    rc = controller.ReplicaConfig("replicas:SelfReporting", init_kwargs={"path": str(load_file)})
    with trio.fail_after(LIMIT_S):
        async with opened() as (ctl, _):
            await (await ctl.deploy("own", config, rc)).wait()
            # Each replica says it holds 6 (2 are wanted per replica): 3, 9 wanted, then 4.
            load_file.write_text("6")
            snapshot = ctl.snapshot("own")
            while len(snapshot.replicas) != 4:
                snapshot = (await ctl.listen_for_change({"own": snapshot.snapshot_id}))["own"]
            # Two replicas' 12 already asks for 4, so the third and fourth may not have said
            # yet: wait for all four to be heard rather than guess how many were.
            await ctl.wait_until(lambda c: c.status("own").load.self_reported == 24)
            assert len(nodes_of(ctl, "own")) == 4  # and spread
            load_file.write_text("0")  # idle: down to the minimum
            while len(snapshot.replicas) != 1:
                snapshot = (await ctl.listen_for_change({"own": snapshot.snapshot_id}))["own"]


async def test_a_lost_node_s_replicas_serve_again_on_the_others(cluster: Cluster) -> None:
    victim = next(iter(cluster.worker_nodes))
    with trio.fail_after(LIMIT_S):
        async with opened() as (ctl, _):
            config = cfg(num_replicas=4, route_prefix="/lost", max_unavailable=0)
            await (await ctl.deploy("lost", config, RC)).wait()
            assert nodes_of(ctl, "lost")[victim.node_id] == 1
            async with traffic(ctl, "/lost/x") as flow:
                await flow.answered(20)
                raylet = victim.all_processes["raylet"][0].process
                killed_at = time.monotonic()
                os.kill(raylet.pid, signal.SIGKILL)
                raylet.wait()  # reaped, as init would: else its workers live on
                await ctl.wait_until(
                    lambda c: (
                        victim.node_id not in nodes_of(c, "lost")
                        and sum(nodes_of(c, "lost").values()) == 4
                    )
                )
                back_s = time.monotonic() - killed_at
                await flow.answered(20)
            failed = flow.counts.total() - flow.counts[200]
            print(f"node lost: back at full strength in {back_s:.2f}s; {failed} of "
                  f"{flow.counts.total()} requests failed {dict(flow.counts)}")  # fmt: skip
            # Timed for the record, and bounded only generously: a machine at load 25 took 55 s
            # to start the replacements (Ray saw the node dead within 1.5 s, FAST_DEATH). That
            # the loss was taken as the node's, not waited out as crashes, the events say below.
            assert back_s < LIMIT_S / 2
            assert failed <= 20, flow.counts
            rows = {r.id: r.state for r in await ctl.nodes()}
            assert rows[victim.node_id] == "dead"
            # Gone with its node, not crashed: its replacement waited out no backoff.
            kinds = [e.kind for e in ctl.status("lost").events]
            assert "NodeLost" in kinds
            assert "Died" not in kinds
    cluster.worker_nodes.discard(victim)  # gone: not one to shut down


async def test_ray_s_own_drain_notice_moves_replicas_off_the_node(cluster: Cluster) -> None:
    """A drain the cluster announces (``DrainNode``, as the autoscaler or a preemption sends
    it) is taken as ``controller node drain`` is. Last in this module: Ray cannot take a drain
    back, and the node stays out of use."""
    from ray.core.generated import autoscaler_pb2

    gcs = ray._private.worker.global_worker.gcs_client
    with trio.fail_after(LIMIT_S):
        async with opened() as (ctl, _):
            await (await ctl.deploy("pre", cfg(num_replicas=3, max_unavailable=0), RC)).wait()
            head = ray.get_runtime_context().get_node_id()
            target = next(n for n in nodes_of(ctl, "pre") if n != head)
            deadline_ms = int(time.time() * 1000) + 120_000
            accepted, said = gcs.drain_node(
                target,
                autoscaler_pb2.DRAIN_NODE_REASON_PREEMPTION,  # type: ignore[attr-defined]
                "x",
                deadline_ms,
            )
            assert accepted, said
            await ctl.wait_until(
                lambda c: (
                    sum(nodes_of(c, "pre").values()) == 3
                    and all(r.node != target for r in c.status("pre").replicas)
                )
            )
            row = {r.id: r for r in await ctl.nodes()}[target]
            # Ray may end a drained node once it is idle: it reads dead then.
            assert row.state in ("drained", "dead"), row
            if row.state == "drained":
                assert row.notice
                assert row.deadline == pytest.approx(deadline_ms / 1000, abs=1)
