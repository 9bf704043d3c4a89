"""Autoscaling as a user meets it: a daemon with real workers and its ingress, scaled to zero and
back by requests without losing one, and killed with -9 under load."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import Any

import trio

import controller

from ..daemons import LIMIT_S, Daemon, free_port, manifest, running
from ..http_client import request


def autoscaled(**scaling: Any) -> dict[str, Any]:
    return {
        "entrypoint": "http_replica:HTTPReplica",
        "num_replicas": 0,
        "version": "v1",
        "route_prefix": "/app",
        "graceful_shutdown_timeout_s": 2,
        "autoscaling": {"max_replicas": 4, "target_ongoing_requests": 2, **scaling},
    }


async def until_serving(daemon: Daemon, name: str, count: int) -> None:
    """Follow the daemon's watch until `name`'s snapshot lists `count` replicas."""
    cursor, epoch = 0, ""
    while True:
        code, data = await daemon.http(
            "GET", f"/api/v1/watch?since={cursor}&timeout_s=10&epoch={epoch}"
        )
        assert code == 200, data
        cursor, epoch = data["cursor"], data["epoch"]
        for snapshot in data["snapshots"]:
            if snapshot["name"] == name and len(snapshot["replicas"]) == count:
                return


async def test_scale_from_zero_through_the_ingress_loses_no_request(state_dir: Path) -> None:
    file = state_dir / "auto.toml"
    scaling = {"min_replicas": 0, "scale_to_zero_delay_s": 1, "downscale_stabilization_s": 0}
    file.write_text(manifest(app=autoscaled(**scaling)))
    port = free_port()
    with trio.fail_after(LIMIT_S * 2):
        async with running(
            state_dir, "--config", str(file), "--ingress-listen", f"127.0.0.1:{port}"
        ) as daemon:
            status = (await daemon.status())["app"]
            assert status["desired"] == 0
            assert status["replicas"] == []
            for _round in range(2):  # from zero, back to zero, and from zero again
                answers: list[int] = []
                async with trio.open_nursery() as nursery:
                    for _ in range(12):
                        nursery.start_soon(_get, port, answers)
                assert answers == [200] * 12
                status = (await daemon.status())["app"]
                assert 1 <= status["desired"] <= 4
                woken = [e for e in status["events"] if "(ScaleFromZero)" in e["message"]]
                assert len(woken) == _round + 1
                # Idle again: to zero after the delay.
                await until_serving(daemon, "app", 0)
                status = (await daemon.status())["app"]
                assert status["desired"] == 0
                assert status["autoscaler"]["last_change"]["reason"] == "ScaleToZero"
            _, metrics = await daemon.http("GET", "/metrics")
            assert 'controller_autoscaler_decisions_total{backend="app",direction="up"}' in metrics
            assert 'controller_autoscaler_target_replicas{backend="app"}' in metrics
            result = await daemon.cli("status")
            assert b"(auto 0-4, load" in result.stdout, result.stdout


async def test_a_daemon_killed_under_load_keeps_its_target_and_does_not_scale_down_at_once(
    state_dir: Path,
) -> None:
    file = state_dir / "auto.toml"
    scaling = {"min_replicas": 1, "target_ongoing_requests": 1, "downscale_stabilization_s": 60}
    file.write_text(manifest(app={**autoscaled(**scaling), "num_replicas": 1}))
    port = free_port()
    args = ("--config", str(file), "--ingress-listen", f"127.0.0.1:{port}")
    with trio.fail_after(LIMIT_S * 2):
        async with trio.open_nursery() as nursery:
            first = Daemon(state_dir)
            await first.start(nursery, *args)
            await until_serving(first, "app", 1)
            async with trio.open_nursery() as clients:
                # Three requests held open: three ongoing, one per replica wanted.
                for _ in range(3):
                    clients.start_soon(_hold, port)
                await until_serving(first, "app", 3)
                before = (await first.status())["app"]
                pids = sorted(r["pid"] for r in before["replicas"])
                assert before["desired"] == 3
                assert first.process is not None
                first.process.send_signal(signal.SIGKILL)
                await first.process.wait()
                # Its ingress processes outlive it; the clients give up now.
                clients.cancel_scope.cancel()
            # Again on the same state dir: no load now (the ingress reports the requests gone).
            async with running(state_dir, *args) as second:
                await until_serving(second, "app", 3)
                # What is under test is that nothing happens: three seconds of the window, in
                # which its ingress reports an idle backend (on its first snapshot, and after).
                await trio.sleep(3)
                after = (await second.status())["app"]
                assert after["desired"] == 3
                assert sorted(r["pid"] for r in after["replicas"]) == pids  # none restarted
                last = after["autoscaler"]["last"]
                assert (last["ongoing"], last["recommended"]) == (0, 1)
                assert last["reason"] == "Stabilizing"  # held by the window a restart begins
            nursery.cancel_scope.cancel()


async def _get(port: int, answers: list[int]) -> None:
    answers.append((await request(port, "/app/any")).status)


async def _hold(port: int) -> None:
    """A request the replica holds open until the test gives up on it. Sent again if it comes
    back: an ingress process that has not yet heard of the backend's route answers at once (or
    one not yet serving refuses), and a load that never came would not scale anything."""
    while True:
        with contextlib.suppress(OSError, trio.BrokenResourceError, ValueError):
            await request(port, "/app/hang")
        await trio.sleep(0.1)


async def test_a_replica_s_own_load_reaches_the_autoscaler_through_local_runtime(
    state_dir: Path,  # the fixture kills and reports workers left behind
) -> None:
    tmp_path = state_dir
    here = Path(__file__).parent.parent
    load_file = tmp_path / "load"
    runtime = controller.LocalRuntime(tmp_path / "w", pythonpath=[here])
    scaling = controller.AutoscalingConfig(
        max_replicas=4, target_ongoing_requests=2, downscale_stabilization_s=0
    )
    cfg = controller.BackendConfig(num_replicas=1, version="v1", autoscaling=scaling)
    rc = controller.ReplicaConfig("replicas:SelfReporting", init_kwargs={"path": str(load_file)})
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(
            runtime=runtime, store=controller.MemoryStore()
        ) as ctl:
            await (await ctl.deploy("own", cfg, rc)).wait()
            snapshot = ctl.snapshot("own")
            # Each replica says it holds 6 (2 are wanted per replica): 3 replicas, whose 18
            # ask for 9, bounded by max_replicas.
            load_file.write_text("6")
            while len(snapshot.replicas) != 4:
                snapshot = (await ctl.listen_for_change({"own": snapshot.snapshot_id}))["own"]
            status = ctl.status("own")
            assert status.autoscaler is not None
            assert status.autoscaler.target == 4
            # Two of them at least have said (12 asks for 6, capped at 4 too); on a busy
            # machine the third and fourth may not have said yet.
            assert status.load.self_reported in (12, 18, 24)
            load_file.write_text("0")  # idle: down to the minimum (no window here)
            snapshot = ctl.snapshot("own")
            while len(snapshot.replicas) != 1:
                snapshot = (await ctl.listen_for_change({"own": snapshot.snapshot_id}))["own"]
            await (await ctl.delete("own")).wait()
