"""Rollouts as a user steers them: a daemon with real workers and its ingress, a bad release
undone under traffic without one failed request, and revisions that outlive a kill -9 and a
restart."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import trio

from ..daemons import (
    LIMIT_S,
    Daemon,
    app,
    free_port,
    killed_at_exit,
    manifest,
    running,
    settled,
    until,
)
from ..http_client import Traffic


async def revisions(daemon: Daemon, name: str) -> list[dict[str, Any]]:
    code, data = await daemon.http("GET", f"/api/v1/backends/{name}/revisions")
    assert code == 200, data
    found: list[dict[str, Any]] = data["revisions"]
    return found


async def test_a_bad_release_undone_under_traffic_fails_no_request(state_dir: Path) -> None:
    good, bad = state_dir / "good.toml", state_dir / "bad.toml"
    good.write_text(manifest(app=app()))
    # The bad release answers, slowly: a latency regression someone wants gone at once.
    bad.write_text(manifest(app=app(version="v2", init_kwargs={"delay_ms": 150})))
    port = free_port()
    with trio.fail_after(LIMIT_S * 3):
        async with running(
            state_dir, "--config", str(good), "--ingress-listen", f"127.0.0.1:{port}"
        ) as daemon:
            await until(daemon, "app", settled("v1"))
            result = await daemon.cli("apply", "-f", str(bad), "--wait", "--message", "faster?")
            assert result.returncode == 0, result.stderr
            await until(daemon, "app", settled("v2"))
            traffic = Traffic(port)
            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(traffic.send)
                await traffic.answered(20)
                result = await daemon.cli("rollout", "undo", "app", "--wait", "-m", "too slow")
                assert result.returncode == 0, result.stderr
                await traffic.answered(len(traffic.answers) + 20)
                traffic.stop.set()
            answers = traffic.answers
            status = await until(daemon, "app", settled("v1"))
            assert [(code, b) for code, b in answers if code != 200] == []
            assert len(answers) >= 40
            serving = {r["tag"] for r in status["replicas"]}
            assert {tag for _, tag in answers[-4:]} <= serving  # the last ones from v1
            kept = await revisions(daemon, "app")
            assert [(r["number"], r["version"], r["outcome"]) for r in kept] == [
                (1, "v1", "complete"),
                (2, "v2", "complete"),
                (3, "v1", "complete"),
            ]
            assert kept[1]["cause"]["message"] == "faster?"
            assert kept[1]["cause"]["via"] == "cli"
            assert kept[1]["cause"]["manifest"] == str(bad)
            assert (kept[2]["restores"], kept[2]["cause"]["message"]) == (1, "too slow")
            assert status["rollout"]["revision"] == 3
            history = await daemon.cli("rollout", "history", "app")
            assert history.returncode == 0, history.stderr
            lines = history.stdout.decode().splitlines()
            assert len([line for line in lines if "complete" in line]) == 3, lines
            _, metrics = await daemon.http("GET", "/metrics")
            assert 'controller_backend_revision{backend="app",kind="target"} 3.0' in metrics


async def test_revisions_outlive_a_kill_9_and_a_restart(state_dir: Path) -> None:
    # No config file: one applied at each start would be a deploy of its own.
    args = ("--no-ingress",)
    first, second = Daemon(state_dir), Daemon(state_dir)
    with trio.fail_after(LIMIT_S * 3), killed_at_exit(first, second):
        async with trio.open_nursery() as nursery:
            await first.start(nursery, *args)
            code, data = await first.http(
                "PUT", "/api/v1/backends/app", json.dumps(app(num_replicas=1)).encode()
            )
            assert code == 200, data
            await until(first, "app", settled("v1"))
            body = json.dumps(app(num_replicas=1, version="v2")).encode()
            code, data = await first.http("PUT", "/api/v1/backends/app?message=second", body)
            assert code == 200, data
            await until(first, "app", settled("v2"))
            code, data = await first.http("POST", "/api/v1/backends/app/pause", b"")
            assert code == 202, data
            third = json.dumps(app(num_replicas=1, version="v3")).encode()
            code, data = await first.http("PUT", "/api/v1/backends/app", third)
            assert code == 200, data
            before = await revisions(first, "app")
            pids = sorted(r["pid"] for r in (await first.status())["app"]["replicas"])
            assert first.process is not None
            first.process.send_signal(signal.SIGKILL)
            await first.process.wait()
            # Again, on the same state dir: nothing lost, nothing restarted.
            await second.start(nursery, *args)
            status = await until(second, "app", settled("v2"))
            assert await revisions(second, "app") == before
            assert sorted(r["pid"] for r in status["replicas"]) == pids
            assert status["rollout"]["paused"] is True
            assert status["rollout"]["pending_revision"] == 3
            assert second.process is not None
            second.process.send_signal(signal.SIGINT)  # Ctrl-C: the replicas stay
            assert await second.process.wait() == 0
            nursery.cancel_scope.cancel()
        async with running(state_dir, *args) as third_daemon:
            status = await until(third_daemon, "app", settled("v2"))
            assert sorted(r["pid"] for r in status["replicas"]) == pids
            code, data = await third_daemon.http("POST", "/api/v1/backends/app/resume", b"")
            assert code == 202, data
            await until(third_daemon, "app", settled("v3"))
            kept = await revisions(third_daemon, "app")
            assert [(r["number"], r["outcome"]) for r in kept] == [
                (1, "complete"),
                (2, "complete"),
                (3, "complete"),
            ]
            assert kept[1]["cause"] == {
                "via": "api",
                "message": "second",
                "manifest": None,
                "manifest_digest": None,
            }
