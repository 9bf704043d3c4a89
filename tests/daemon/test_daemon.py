"""The daemon end to end: a real `controller run` process on a loopback port, driven by the CLI
and by an HTTP client; real worker processes; real clock, every wait bounded by fail_after."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import trio
from prometheus_client.parser import text_string_to_metric_families

from ..daemons import LIMIT_S, Daemon, manifest, running, trivial
from ..workers import worker_pids


async def test_apply_scale_roll_prune_and_delete_through_the_cli(state_dir: Path) -> None:
    file = state_dir / "backends.toml"
    with trio.fail_after(LIMIT_S * 2):
        async with running(state_dir) as daemon:
            file.write_text(manifest(a=trivial(2), b=trivial(1)))
            result = await daemon.cli("apply", "-f", str(file), "--wait")
            out = result.stdout.decode()
            assert result.returncode == 0, result.stderr
            assert "backend/a configured (generation 1)" in out
            assert "backend/a: 2/2 ready, HEALTHY" in out
            assert out.rstrip().endswith("done")
            assert len(worker_pids(state_dir)) == 3

            # The same file again changes nothing.
            result = await daemon.cli("apply", "-f", str(file))
            assert "backend/a unchanged (generation 1)" in result.stdout.decode()

            # Scale and roll a, prune b.
            file.write_text(manifest(a=trivial(3, "v2")))
            result = await daemon.cli("apply", "-f", str(file), "--prune", "--wait")
            out = result.stdout.decode()
            assert result.returncode == 0, result.stderr
            assert "backend/b deleted (pruned)" in out
            assert "backend/b: deleted" in out
            status = await daemon.status()
            assert set(status) == {"a"}
            assert status["a"]["counts_by_version"] == {"v2": {"RUNNING": 3}}

            table = (await daemon.cli("status")).stdout.decode()
            assert table.splitlines()[0].split()[:4] == ["NAME", "STATE", "READY", "REPLICAS"]
            assert "a     HEALTHY  3/3    v2: 3 RUNNING" in table
            detail = json.loads((await daemon.cli("status", "a", "--json")).stdout)
            assert detail["generation"] == 2

            result = await daemon.cli("delete", "a", "--wait")
            assert result.returncode == 0, result.stderr
            assert "backend/a: deleted" in result.stdout.decode()
            assert await daemon.status() == {}
            assert worker_pids(state_dir) == {}


async def test_wait_exits_non_zero_on_deploy_failed(state_dir: Path) -> None:
    file = state_dir / "bad.toml"
    file.write_text(manifest(broken={"entrypoint": "replicas:FailsInInit", "version": "v1"}))
    with trio.fail_after(LIMIT_S):
        async with running(state_dir) as daemon:
            result = await daemon.cli("apply", "-f", str(file), "--wait")
            assert result.returncode == 1
            out = result.stdout.decode()
            assert "DEPLOY_FAILED" in out
            assert "ValueError: bad port" in out
            result = await daemon.cli("wait", "broken")
            assert result.returncode == 1


async def test_every_endpoint_but_healthz_needs_the_token(state_dir: Path) -> None:
    with trio.fail_after(LIMIT_S):
        async with running(state_dir) as daemon:
            assert (state_dir / "token").stat().st_mode & 0o777 == 0o600
            assert await daemon.http("GET", "/healthz", token=None) == (200, {"ok": True})
            body = json.dumps(trivial(1)).encode()
            for token in (None, "wrong"):
                for method, path, data in [
                    ("GET", "/api/v1/backends", None),
                    ("PUT", "/api/v1/backends/a", body),
                    ("DELETE", "/api/v1/backends/a", None),
                    ("POST", "/api/v1/shutdown", b"{}"),
                    ("GET", "/metrics", None),
                    ("GET", "/openapi.json", None),
                ]:
                    code, error = await daemon.http(method, path, data, token=token)
                    assert code == 401, (method, path, token)
                    assert error["error"]["type"] == "Unauthorized"
            assert await daemon.status() == {}  # nothing was deployed, nothing shut down
            code, spec = await daemon.http("GET", "/openapi.json")
            assert code == 200
            assert "/api/v1/watch" in spec["paths"]


async def test_bad_files_and_bodies_are_rejected_and_change_nothing(state_dir: Path) -> None:
    file = state_dir / "backends.toml"
    with trio.fail_after(LIMIT_S):
        async with running(state_dir) as daemon:
            file.write_text(manifest(a=trivial(1)))
            assert (await daemon.cli("apply", "-f", str(file), "--wait")).returncode == 0
            before = await daemon.status()

            file.write_text(
                manifest(
                    a=trivial(-1, typo=1),
                    b={"num_replicas": "two", "max_surge": 0, "max_unavailable": 0},
                )
            )
            result = await daemon.cli("apply", "-f", str(file))
            assert result.returncode == 2
            err = result.stderr.decode()
            assert f"in {file}; nothing was applied" in err
            for expected in [
                "backend 'a': typo: unknown field",
                "backend 'a': num_replicas: must be a whole number from 0 to 1000000 (got -1)",
                "backend 'b': entrypoint: is required",
                "backend 'b': num_replicas: must be a whole number from 0 to 1000000 (got 'two')",
            ]:
                assert expected in err, expected
            file.write_text("[backends.a\nnum_replicas = 1")
            result = await daemon.cli("apply", "-f", str(file))
            assert result.returncode == 2
            assert "not valid TOML" in result.stderr.decode()

            rejected = [
                ("PUT", "/api/v1/backends/a", b"x" * (2 << 20), 413, "TooLarge"),
                ("PUT", "/api/v1/backends/a", b'{"entrypoint": ', 400, "MalformedJSON"),
                ("PUT", "/api/v1/backends/a", b"[" * 100_000, 400, "MalformedJSON"),
                ("PUT", "/api/v1/backends/a", b'{"entrypoint": "m:C", "x": 1}', 422, "Invalid"),
                ("PUT", "/api/v1/backends/a", b'{"num_replicas": 1}', 422, "Invalid"),
                ("PUT", "/api/v1/backends/a b", b'{"entrypoint": "m:C"}', 422, "Invalid"),
                ("POST", "/api/v1/apply", b'{"backends": {"a": 1}}', 422, "Invalid"),
                ("POST", "/api/v1/apply", b'{"backends": {}, "prune": "yes"}', 422, "Invalid"),
                ("GET", "/api/v1/watch?since=x", None, 400, "BadQuery"),
                ("GET", "/api/v1/backends/nope", None, 404, "UnknownBackend"),
                ("DELETE", "/api/v1/backends/nope", None, 404, "UnknownBackend"),
                ("GET", "/api/v1/nothing", None, 404, "NotFound"),
            ]
            for method, path, body, code, kind in rejected:
                got, error = await daemon.http(method, path.replace(" ", "%20"), body)
                assert got == code, (method, path, error)
                assert error["error"]["type"].startswith(kind), (path, error)
            assert await daemon.status() == before


async def test_sigterm_then_restart_adopts_every_replica(state_dir: Path) -> None:
    file = state_dir / "backends.toml"
    file.write_text(manifest(a=trivial(2)))
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            first = Daemon(state_dir)
            await first.start(nursery, "--config", str(file))
            assert (await first.cli("wait", "a")).returncode == 0
            pids = worker_pids(state_dir)
            tags = {r["tag"] for r in (await first.status())["a"]["replicas"]}
            assert await first.stop(signal.SIGTERM) == 0
            assert not (state_dir / "daemon.json").exists()
            assert worker_pids(state_dir) == pids  # the replicas outlive the daemon

        async with running(state_dir) as second:
            assert (await second.cli("wait", "a")).returncode == 0
            assert {r["tag"] for r in (await second.status())["a"]["replicas"]} == tags
            assert worker_pids(state_dir) == pids  # adopted: none restarted
            assert b"adopting 2 replicas" in second.log


async def test_a_restart_with_the_same_config_keeps_a_scale_and_a_rollout(
    state_dir: Path,
) -> None:
    # A newcomer's story: the Quickstart's daemon, `scale`, a rollout to v1b by the API, Ctrl-C,
    # the same command again. Nothing is deployed, nothing restarted; `apply --dry-run` of an
    # edited file then shows the one field it would change.
    file = state_dir / "backends.toml"
    file.write_text(manifest(a=trivial(2)))
    with trio.fail_after(LIMIT_S * 2):
        async with trio.open_nursery() as nursery:
            first = Daemon(state_dir)
            await first.start(nursery, "--config", str(file))
            assert (await first.cli("scale", "a", "3", "--wait")).returncode == 0
            body = json.dumps(trivial(3, "v1b")).encode()
            assert (await first.http("PUT", "/api/v1/backends/a", body))[0] == 200
            assert (await first.cli("wait", "a")).returncode == 0
            before = (await first.status())["a"]
            pids = worker_pids(state_dir)
            assert await first.stop(signal.SIGINT) == 0

        async with running(state_dir, "--config", str(file)) as second:
            assert (await second.cli("wait", "a")).returncode == 0
            after = (await second.status())["a"]
            assert after["generation"] == before["generation"]
            assert after["counts_by_version"] == {"v1b": {"RUNNING": 3}}
            assert worker_pids(state_dir) == pids  # adopted: none restarted
            assert b"deploy generation" not in second.log

            file.write_text(manifest(a=trivial(2, graceful_shutdown_timeout_s=5)))
            result = await second.cli("apply", "-f", str(file), "--dry-run")
            assert result.returncode == 0, result.stderr
            assert result.stdout.decode().splitlines() == [
                "backend/a changed (dry run)",
                "  graceful_shutdown_timeout_s: 2.0 -> 5.0",
            ]
            assert (await second.status())["a"]["generation"] == before["generation"]


async def test_metrics_parse_and_count_what_happened(state_dir: Path) -> None:
    file = state_dir / "backends.toml"
    file.write_text(manifest(a=trivial(2), b=trivial(1, "v7")))
    with trio.fail_after(LIMIT_S):
        async with running(state_dir, "--config", str(file)) as daemon:
            assert (await daemon.cli("wait", "a")).returncode == 0
            assert (await daemon.cli("wait", "b")).returncode == 0
            code, text = await daemon.http("GET", "/metrics")
            assert code == 200
            samples = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
            }
            replicas = "controller_replicas"
            assert samples[(replicas, (("backend", "a"), ("state", "RUNNING"), ("version", "v1")))]
            assert samples[(replicas, (("backend", "b"), ("state", "RUNNING"), ("version", "v7")))]
            assert samples[("controller_replica_start_seconds_count", (("outcome", "ready"),))]
            assert samples[("controller_checkpoint_write_seconds_count", ())] >= 4
            assert samples[("controller_events_handled_total", (("backend", "a"),))] >= 2
            assert ("controller_event_to_action_seconds_count", ()) in samples


async def test_a_bad_config_at_start_stops_before_anything(state_dir: Path) -> None:
    file = state_dir / "bad.toml"
    file.write_text(manifest(a={"entrypoint": "nope", "num_replicas": -2}))
    with trio.fail_after(LIMIT_S):
        result = await trio.run_process(
            [*Daemon(state_dir).cli_argv(), "run", "--config", str(file)],
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 2
    err = result.stderr.decode()
    assert "2 problems" in err
    assert "backend 'a': entrypoint:" in err
    assert not (state_dir / "controller.db").exists()
    assert not (state_dir / "token").exists()


async def test_a_config_that_breaks_a_rule_merged_with_the_live_values_stops_the_start(
    state_dir: Path,
) -> None:
    # Alone the file is fine; merged with what the API changed since (max_surge 0), it asks
    # max_unavailable 0 too, which no rollout could keep. The start says so and stops (exit 2,
    # as for a bad file), and the replicas run on untouched.
    file = state_dir / "backends.toml"
    file.write_text(manifest(a=trivial(1)))
    with trio.fail_after(LIMIT_S * 2):
        async with trio.open_nursery() as nursery:
            first = Daemon(state_dir)
            await first.start(nursery, "--config", str(file))
            assert (await first.cli("wait", "a")).returncode == 0
            body = json.dumps(trivial(1, max_surge=0, max_unavailable=1)).encode()
            assert (await first.http("PUT", "/api/v1/backends/a", body))[0] == 200
            assert (await first.cli("wait", "a")).returncode == 0
            pids = worker_pids(state_dir)
            assert await first.stop(signal.SIGINT) == 0
        file.write_text(manifest(a=trivial(1, max_unavailable=0)))
        here = str(Path(__file__).parent.parent)
        argv = [*Daemon(state_dir).cli_argv(), "run", "--listen", "127.0.0.1:0", "--no-ingress"]
        result = await trio.run_process(
            [*argv, "--pythonpath", here, "--config", str(file)],
            capture_stderr=True,
            check=False,
        )
        assert result.returncode == 2, result.stderr
        err = result.stderr.decode()
        assert "1 problem in" in err
        assert "backend 'a': " in err
        assert "may not both be 0" in err
        assert worker_pids(state_dir) == pids  # untouched, for the next start to adopt
        async with running(state_dir) as third:  # it adopts them (and shuts down at the end)
            assert (await third.cli("wait", "a")).returncode == 0
            assert worker_pids(state_dir) == pids


async def test_json_logs_one_object_per_line(state_dir: Path) -> None:
    file = state_dir / "backends.toml"
    file.write_text(manifest(a=trivial(1)))
    with trio.fail_after(LIMIT_S):
        async with running(state_dir, "--config", str(file), "--log-format", "json") as daemon:
            assert (await daemon.cli("wait", "a")).returncode == 0
            lines = [json.loads(line) for line in daemon.log.decode().splitlines()]
    messages = [line["message"] for line in lines]
    assert any(m.startswith("listening on http://127.0.0.1:") for m in messages)
    assert any("RUNNING at" in m for m in messages)
    assert {"time", "level", "logger", "message"} <= set(lines[0])
