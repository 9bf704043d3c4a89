"""Nodes through FakeRuntime under MockClock: placement by each backend's rules, drains (make
before break, within the disruption budget, with a deadline), a node's loss and Ray-style drain
notices, and the cordons kept across a restart."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import controller
from controller import InfeasibleError, ReplicaState
from controller.testing import FakeRuntime, FakeState

from ..asgi import api
from ..conftest import RC, config, opened, settle
from ..daemons import Daemon, running, trivial, until


async def deploy_trivial(daemon: Daemon, name: str, fields: dict[str, Any]) -> None:
    code, data = await daemon.http("PUT", f"/api/v1/backends/{name}", json.dumps(fields).encode())
    assert code == 200, data


NODES = {"n1": {"zone": "a"}, "n2": {"zone": "a"}, "n3": {"zone": "b"}}


def cluster(**kwargs: object) -> FakeRuntime:
    return FakeRuntime(auto_ready=True, nodes=NODES, max_replicas=8, **kwargs)  # type: ignore[arg-type]


def spread(rt: FakeRuntime, backend: str) -> dict[str, int]:
    live = [rt.replicas[t] for t in rt.tags(FakeState.READY, backend=backend)]
    return dict(sorted(Counter(r.node for r in live if r.node is not None).items()))


def available(ctl: controller.Controller, name: str) -> int:
    return sum(
        1 for r in ctl.status(name).replicas if r.state is ReplicaState.RUNNING and r.healthy
    )


async def test_replicas_spread_over_nodes_by_default(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = cluster()
    async with opened(rt) as ctl:
        await (await ctl.deploy("api", config(num_replicas=6), RC)).wait()
        assert spread(rt, "api") == {"n1": 2, "n2": 2, "n3": 2}
        status = {r.tag: r.node for r in ctl.status("api").replicas}
        assert set(status.values()) == {"n1", "n2", "n3"}  # the status says where


async def test_pack_fills_one_node_first_and_a_scale_down_empties_whole_nodes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = cluster()
    async with opened(rt) as ctl:
        await (await ctl.deploy("api", config(num_replicas=10, placement="pack"), RC)).wait()
        assert spread(rt, "api") == {"n1": 8, "n2": 2}
        await (await ctl.deploy("api", config(num_replicas=8, placement="pack"), RC)).wait()
        await settle()
        assert spread(rt, "api") == {"n1": 8}  # n2 empty, for the autoscaler to remove


async def test_a_spread_scale_down_keeps_the_backend_spread(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = cluster()
    async with opened(rt) as ctl:
        await (await ctl.deploy("api", config(num_replicas=6), RC)).wait()
        await (await ctl.deploy("api", config(num_replicas=3), RC)).wait()
        await settle()
        assert spread(rt, "api") == {"n1": 1, "n2": 1, "n3": 1}


async def test_a_per_node_limit_and_labels_hold_and_a_count_beyond_them_is_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = cluster()
    async with opened(rt) as ctl:
        capped = config(num_replicas=3, max_replicas_per_node=1)
        await (await ctl.deploy("one-each", capped, RC)).wait()
        assert spread(rt, "one-each") == {"n1": 1, "n2": 1, "n3": 1}
        with pytest.raises(InfeasibleError, match=r"max_replicas_per_node=1 allows no more"):
            await ctl.deploy("one-each", config(num_replicas=4, max_replicas_per_node=1), RC)
        assert ctl.status("one-each").generation == 1  # nothing written
        zone_a = config(num_replicas=4, node_labels={"zone": "a"})
        await (await ctl.deploy("zoned", zone_a, RC)).wait()
        assert spread(rt, "zoned") == {"n1": 2, "n2": 2}
        too_many = config(num_replicas=3, node_labels={"zone": "b"}, max_replicas_per_node=2)
        with pytest.raises(InfeasibleError, match=r"1 of 3 nodes admit the backend"):
            await ctl.deploy("zoned-b", too_many, RC)


async def test_a_drain_makes_before_it_breaks_and_keeps_the_node_empty(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = cluster(auto_drain=False)
    async with opened(rt) as ctl:
        cfg = config(num_replicas=4, max_unavailable=0, graceful_shutdown_timeout_s=5)
        await (await ctl.deploy("api", cfg, RC)).wait()
        assert spread(rt, "api") == {"n1": 2, "n2": 1, "n3": 1}
        on_n1 = rt.on_node("n1", backend="api")
        lowest = 4

        def record(ctl: controller.Controller) -> bool:
            nonlocal lowest
            lowest = min(lowest, available(ctl, "api"))
            return False  # after every pass, for as long as the drain goes

        async def watch() -> None:
            await ctl.wait_until(record)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            row = await ctl.drain_node("n1")
            assert row.state == "draining"
            assert row.replicas == {"api": 2}
            assert "n1" in rt.cordoned
            await settle()
            # Replacements first: none of n1's replicas was asked to drain before they served.
            new = [t for t in rt.tags(FakeState.READY, backend="api") if t not in on_n1]
            assert len(new) == 4
            assert all(rt.replicas[t].node != "n1" for t in new)
            for tag in on_n1:
                assert rt.replicas[tag].drain_requested_at is not None
                rt.finish_drain(tag)
            await settle()
            nursery.cancel_scope.cancel()
        assert lowest >= 4  # max_unavailable=0: never fewer than 4 serving
        assert rt.on_node("n1") == []
        rows = {r.id: r for r in await ctl.nodes()}
        assert rows["n1"].state == "drained"
        assert rows["n1"].replicas == {}
        # Nothing new lands on a drained node: a scale-up goes elsewhere.
        await (await ctl.deploy("api", config(num_replicas=6, max_unavailable=0), RC)).wait()
        assert rt.on_node("n1") == []
        with pytest.raises(InfeasibleError, match=r"Not counted: 1 node cordoned or drained \(n1;"):
            await ctl.deploy("big", config(num_replicas=11), RC)  # 16 slots on n2, n3 less 6
        row = await ctl.uncordon_node("n1")
        assert row.state == "ready"
        assert "n1" not in rt.cordoned


async def test_a_drain_past_its_deadline_stops_what_is_left(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(nodes={"n1": {}, "n2": {}}, max_replicas=2)
    async with opened(rt) as ctl:
        goal = await ctl.deploy("api", config(num_replicas=4, max_unavailable=0), RC)
        await settle()
        for tag in rt.tags(FakeState.STARTING):
            rt.finish_start(tag)
        await goal.wait()
        # No room elsewhere: the replacements cannot start, and make-before-break waits...
        start = trio.current_time()
        await ctl.drain_node("n1", deadline_s=30)
        await settle()
        assert len(rt.on_node("n1")) == 2
        # ...until the deadline, when what is left stops.
        await rt.wait_until(lambda rt: not rt.on_node("n1"))
        assert trio.current_time() - start == pytest.approx(30, abs=0.5)


async def test_a_lost_node_s_replicas_are_replaced_on_the_others(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = cluster()
    async with opened(rt) as ctl:
        await (await ctl.deploy("api", config(num_replicas=6), RC)).wait()
        gone = {t for t in rt.tags(FakeState.READY, backend="api") if rt.replicas[t].node == "n2"}
        rt.lose_node("n2")
        await settle()
        # Its replicas left the choice at once, and their replacements serve (no backoff).
        serving = {r.tag for r in ctl.status("api").replicas if r.state is ReplicaState.RUNNING}
        assert len(gone) == 2
        assert not gone & serving
        assert available(ctl, "api") == 6
        assert spread(rt, "api") == {"n1": 3, "n3": 3}
        rows = {r.id: r.state for r in await ctl.nodes()}
        assert rows == {"n1": "ready", "n2": "dead", "n3": "ready"}


async def test_a_lost_node_s_ten_replicas_are_replaced_at_once_not_after_a_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Found by an outside attack: each replica a lost node took counted as a crash, so 10 of
    # them put the backend at the 60 s cap of the crash loop's backoff before its replacements.
    rt = FakeRuntime(auto_ready=True, nodes={"n1": {}, "n2": {}}, max_replicas=20)
    async with opened(rt) as ctl:
        await (await ctl.deploy("api", config(num_replicas=20), RC)).wait()
        assert spread(rt, "api") == {"n1": 10, "n2": 10}
        lost = trio.current_time()
        rt.lose_node("n2")
        await rt.wait_until(lambda rt: len(rt.tags(FakeState.READY, backend="api")) == 20)
        # Replaced as soon as the controller heard: no time passed on the (virtual) clock.
        assert trio.current_time() == lost
        status = ctl.status("api")
        assert status.last_error is None  # not a failure of the backend's
        kinds = [e.kind for e in status.events]
        assert kinds.count("NodeLost") == 10
        assert "Died" not in kinds


async def test_replicas_that_really_crash_still_back_off_beside_a_lost_node(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The other side of the rule: crashes of the replicas' own still back off (the first
    # after 1 s, shortened by up to 20 % jitter), node or no node.
    rt = FakeRuntime(auto_ready=True, nodes={"n1": {}, "n2": {}}, max_replicas=20)
    async with opened(rt) as ctl:
        await (await ctl.deploy("api", config(num_replicas=4), RC)).wait()
        crashed = trio.current_time()
        on_n1 = [t for t in rt.tags(FakeState.READY, backend="api") if rt.replicas[t].node == "n1"]
        for tag in on_n1:
            rt.crash(tag)
        await rt.wait_until(lambda rt: len(rt.tags(FakeState.READY, backend="api")) == 4)
        assert trio.current_time() - crashed >= 0.8
        assert "Died" in [e.kind for e in ctl.status("api").events]


async def test_the_cluster_s_own_drain_notice_moves_replicas_off(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = cluster()
    async with opened(rt) as ctl:
        await (await ctl.deploy("api", config(num_replicas=3), RC)).wait()
        rt.notice_drain("n3")
        await rt.wait_until(lambda rt: not rt.on_node("n3"))
        await settle()
        assert available(ctl, "api") == 3
        row = {r.id: r for r in await ctl.nodes()}["n3"]
        assert (row.state, row.notice) == ("drained", True)


async def test_a_drain_outlives_a_controller_restart(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = cluster()
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        await (await ctl.deploy("api", config(num_replicas=3), RC)).wait()
        await ctl.cordon_node("n2")
    rt.cordon(frozenset())  # as a fresh runtime would be
    async with opened(rt, store) as ctl:
        await settle()
        assert rt.cordoned == {"n2"}
        assert {r.id: r.state for r in await ctl.nodes()}["n2"] == "cordoned"
        await (await ctl.deploy("api", config(num_replicas=5), RC)).wait()
        assert spread(rt, "api")["n2"] == 1  # cordoned, not drained: the one there stays


async def test_naming_a_node_wrongly_is_a_clear_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with opened(cluster()) as ctl:
        with pytest.raises(controller.UnknownNodeError, match=r"no node 'n9' \(its nodes: n1, n2"):
            await ctl.drain_node("n9")
        with pytest.raises(controller.UnknownNodeError, match="ambiguous"):
            await ctl.drain_node("n")
        with pytest.raises(controller.ConfigError, match="node id"):
            await ctl.drain_node("../etc")
        with pytest.raises(controller.ConfigError, match="deadline_s"):
            await ctl.drain_node("n1", deadline_s=-1)
        row = await ctl.drain_node("n1"[:2])  # a unique prefix (the whole id here)
        assert row.id == "n1"
    async with opened(FakeRuntime()) as ctl:
        assert await ctl.nodes() == []  # no nodes given: none to list


async def test_a_cap_added_later_counts_the_replicas_already_there(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with opened(cluster()) as ctl:
        await (await ctl.deploy("api", config(num_replicas=3), RC)).wait()
        with pytest.raises(InfeasibleError, match="max_replicas_per_node=1 allows no more"):
            await ctl.deploy("api", config(num_replicas=4, max_replicas_per_node=1), RC)


async def test_a_local_daemon_lists_its_machine_and_a_cordon_stops_new_starts(
    state_dir: Path,
) -> None:
    """LocalRuntime has one node, this machine: `controller node list` shows it with its
    replicas; cordoned, it starts nothing (said as Unschedulable) until uncordoned."""
    with trio.fail_after(120):
        async with running(state_dir / "d") as daemon:
            await deploy_trivial(daemon, "t", trivial(2))
            await until(daemon, "t", lambda s: s["ready"] == 2)  # the PUT does not wait
            listed = await daemon.cli("node", "list", "--json")
            assert listed.returncode == 0, listed.stderr
            (machine,) = json.loads(listed.stdout)
            assert machine["replicas"] == {"t": 2}
            assert machine["state"] == "ready"
            cordoned = await daemon.cli("node", "cordon", "127.0.0.1")  # named by its address
            assert cordoned.returncode == 0, cordoned.stderr
            await deploy_trivial(daemon, "t", trivial(3))
            status = await until(daemon, "t", lambda s: "Unschedulable" in str(s["last_error"]))
            assert status["ready"] == 2
            # Refused starts backed off longer each time; uncordoned, the next start goes at
            # once, not after what is left of the backoff (found by a loaded run: over a
            # minute, past this test's deadline).
            began = trio.current_time()
            assert (await daemon.cli("node", "uncordon", machine["id"])).returncode == 0
            status = await until(daemon, "t", lambda s: s["ready"] == 3)
            print(f"3 ready {trio.current_time() - began:.2f} s after the uncordon")
            # Found by an outside attack: healthy again, the status still said "2 failed to
            # start: Unschedulable ... cordoned". A mended failure is history (the events).
            status = await until(daemon, "t", lambda s: s["state"] == "HEALTHY")
            assert "failed to start" not in status["message"], status["message"]
            assert status["last_error"] is None


async def test_the_node_api_takes_only_what_it_documents(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Found by a trial: a cordon took a body of unknown fields, a cordon of a node being
    drained ended its drain, and times were numbers where the API's other times are ISO."""
    async with opened(cluster()) as ctl:
        call = api(ctl)
        bogus = b'{"bogus": 5}'
        for verb in ("cordon", "uncordon"):
            status, _, body = await call("POST", f"/api/v1/nodes/n1/{verb}", bogus)
            assert status == 422, (verb, body)
        assert (await call("POST", "/api/v1/nodes/n1/drain", bogus))[0] == 422
        assert rt_cordoned(ctl) == set()  # nothing was written
        status, _, body = await call("POST", "/api/v1/nodes/n2/drain", b'{"deadline_s": 60}')
        assert status == 202, body
        drained = json.loads(body)
        assert drained["deadline"].endswith("Z")
        assert drained["since"].endswith("Z")
        status, _, body = await call("POST", "/api/v1/nodes/n2/cordon")
        assert json.loads(body)["state"] in ("draining", "drained")  # the drain goes on
        listed = json.loads((await call("GET", "/api/v1/nodes"))[2])["nodes"]
        assert {n["id"]: n["state"] for n in listed}["n2"] in ("draining", "drained")


def rt_cordoned(ctl: controller.Controller) -> set[str]:
    return set(ctl._nodes._cordons)


async def test_a_start_refused_for_want_of_a_node_goes_at_once_when_one_is_uncordoned(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Found by a loaded run of the suite: each start refused while every node was cordoned
    (Unschedulable) backed off longer, and once one was uncordoned the replacement waited out
    what was left of the backoff. A change of the nodes now ends it, as a scheduler places a
    pending pod at once; a crash loop's backoff is left as it is (test_failures.py)."""
    rt = cluster()
    async with opened(rt) as ctl:
        await (await ctl.deploy("api", config(num_replicas=3), RC)).wait()
        for node in NODES:
            await ctl.cordon_node(node)
        rt.crash(rt.tags(FakeState.READY, backend="api")[0])
        await trio.sleep(120)  # refusals in a row: the backoff is at its longest now
        assert available(ctl, "api") == 2
        assert "Unschedulable" in str(ctl.status("api").last_error)
        began = trio.current_time()
        await ctl.uncordon_node("n1")
        await ctl.wait_until(lambda c: available(c, "api") == 3)
        assert trio.current_time() - began < 1  # virtual time: the backoff was 30 s or more
