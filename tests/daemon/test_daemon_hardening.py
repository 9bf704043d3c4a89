"""The running daemon as a new user, then an attacker, will meet it: a disk that stops taking
writes, a replica that fails in its constructor, its logs and status across restarts, a token with
a stray newline, a shutdown that cannot finish, a body too large. Real daemon processes, real
worker processes, real clock; every wait bounded by fail_after."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from ..daemons import (
    LIMIT_S,
    Daemon,
    converged_daemon,
    manifest,
    one_line,
    running,
    trivial,
)
from ..replicas import events
from ..workers import worker_pids


async def test_a_store_that_fails_to_write_answers_503_with_its_own_error(state_dir: Path) -> None:
    body = json.dumps(trivial(1)).encode()
    with trio.fail_after(LIMIT_S):
        async with running(state_dir) as daemon:
            assert daemon.process is not None
            pid = daemon.process.pid
            # The daemon's files may grow by not one byte: every SQLite write fails (EFBIG).
            soft, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (1, hard))
            try:
                code, error, headers = await daemon.http_with_headers(
                    "PUT", "/api/v1/backends/a", body
                )
            finally:
                resource.prlimit(pid, resource.RLIMIT_FSIZE, (soft, hard))
            assert code == 503, error
            assert error["error"]["type"] == "StoreUnavailable"
            message = error["error"]["message"]
            assert "disk I/O error" in message or "disk is full" in message, message
            assert "rollback" not in message
            assert headers["retry-after"] == "5"
            assert await daemon.status() == {}  # nothing half-applied
            # Once the disk takes writes again, the same request goes through.
            assert (await daemon.http("PUT", "/api/v1/backends/a", body))[0] == 200
            assert (await daemon.cli("wait", "a")).returncode == 0


async def test_apply_is_all_or_nothing(state_dir: Path) -> None:
    file = state_dir / "backends.toml"
    with trio.fail_after(LIMIT_S):
        async with running(state_dir, "--max-replicas", "3") as daemon:
            # Each fits alone; together they do not.
            file.write_text(manifest(a=trivial(2), b=trivial(2)))
            result = await daemon.cli("apply", "-f", str(file))
            assert result.returncode == 2, result.stderr
            err = result.stderr.decode()
            assert "Nothing was applied" in err
            assert "backend 'b'" in err
            code, error = await daemon.http(
                "POST",
                "/api/v1/apply",
                json.dumps({"backends": {"a": trivial(2), "b": trivial(2)}}).encode(),
            )
            assert code == 409, error
            assert await daemon.status() == {}
            assert worker_pids(state_dir) == {}
            file.write_text(manifest(a=trivial(2), b=trivial(1)))
            assert (await daemon.cli("apply", "-f", str(file), "--wait")).returncode == 0
            assert set(await daemon.status()) == {"a", "b"}
            # A file that never ends is refused, not read for ever.
            result = await daemon.cli("apply", "-f", "/dev/zero")
            assert result.returncode == 2
            assert "the file is over 1048576 bytes" in result.stderr.decode()


async def test_replicas_never_see_the_token_or_the_state_dir(state_dir: Path) -> None:
    file = state_dir / "backends.toml"
    file.write_text(manifest(a=trivial(1)))
    secret = "s3cret-token-" + os.urandom(8).hex()
    env = {**os.environ, "CONTROLLER_TOKEN": secret, "CONTROLLER_STATE_DIR": str(state_dir)}
    with trio.fail_after(LIMIT_S):
        async with running(state_dir, "--config", str(file), env=env) as daemon:
            assert (await daemon.cli("wait", "a")).returncode == 0
            assert daemon.token == secret
            (pid,) = worker_pids(state_dir)
            environ = await trio.Path(f"/proc/{pid}/environ").read_bytes()
            assert secret.encode() not in environ
            assert b"CONTROLLER_STATE_DIR" not in environ
            assert b"CONTROLLER_TOKEN" not in environ


async def test_listening_beyond_loopback_warns_unless_allowed(state_dir: Path) -> None:
    warning = b"beyond loopback"
    with trio.fail_after(LIMIT_S):
        async with running(state_dir, listen="0.0.0.0:0") as daemon:
            assert warning in daemon.log
            assert b"--allow-remote" in daemon.log
        async with running(state_dir, "--allow-remote", listen="0.0.0.0:0") as daemon:
            assert warning not in daemon.log


async def test_a_replica_that_fails_in_init_shows_its_traceback_everywhere(
    state_dir: Path,
) -> None:
    file = state_dir / "bad.toml"
    file.write_text(manifest(broken={"entrypoint": "replicas:FailsInInit", "version": "v1"}))
    raised = 'raise ValueError("bad port")'
    with trio.fail_after(LIMIT_S):
        async with running(state_dir) as daemon:
            result = await daemon.cli("apply", "-f", str(file), "--wait")
            assert result.returncode == 1
            assert raised in result.stderr.decode()
            status = (await daemon.status())["broken"]
            assert raised in status["last_traceback"]
            assert "replicas.py" in status["last_traceback"]
            assert raised in (state_dir / "daemon.log").read_text()
            # The failed replicas are gone; their logs, named by tag, are kept.
            logs = sorted(os.listdir(state_dir / "w" / "logs"))
            assert len(logs) == 3
            assert all(re.fullmatch(r"broken#[0-9a-f]{12}\.log", name) for name in logs), logs
            result = await daemon.cli("logs", "broken")
            out = result.stdout.decode()
            assert result.returncode == 0, result.stderr
            assert out.count("ValueError: bad port") == 3
            assert "(gone)" in out
            tag = logs[0].removesuffix(".log")
            result = await daemon.cli("logs", "broken", "--replica", tag, "--tail", "1")
            assert result.stdout.decode() == "ValueError: bad port\n"


async def read_until(stream: trio.abc.ReceiveStream, seen: bytearray, text: bytes) -> None:
    while text not in seen:
        chunk = await stream.receive_some()
        if not chunk:
            raise AssertionError(f"the stream ended before {text!r}: {bytes(seen)!r}")
        seen += chunk


async def test_logs_follow_shows_what_a_replica_prints_as_it_prints_it(state_dir: Path) -> None:
    file = state_dir / "backends.toml"
    file.write_text(manifest(a={"entrypoint": "replicas:Talker", "version": "v1"}))
    with trio.fail_after(LIMIT_S):
        async with running(state_dir, "--config", str(file)) as daemon:
            assert (await daemon.cli("wait", "a")).returncode == 0
            assert (await daemon.cli("logs", "a")).stdout == b"talker up\n"
            follow = await trio.lowlevel.open_process(
                [*daemon.cli_argv(), "logs", "a", "--follow"], stdout=subprocess.PIPE
            )
            try:
                assert follow.stdout is not None
                seen = bytearray()
                await read_until(follow.stdout, seen, b"talker up\n")
                body = json.dumps(
                    {"entrypoint": "replicas:Talker", "version": "v1", "user_config": {"n": 7}}
                ).encode()
                assert (await daemon.http("PUT", "/api/v1/backends/a", body))[0] == 200
                await read_until(follow.stdout, seen, b"talker says {'n': 7}\n")
                # Once the backend is deleted, all it wrote has been shown: the follow ends.
                assert (await daemon.cli("delete", "a", "--wait")).returncode == 0
                assert await follow.wait() == 0
            finally:
                if follow.returncode is None:
                    follow.kill()
                    await follow.wait()


def only(values: Sequence[Any]) -> Any:
    assert len(values) == 1, values
    return values[0]


async def test_status_shows_pids_ages_and_events_that_survive_a_restart(state_dir: Path) -> None:
    with trio.fail_after(LIMIT_S * 2):
        async with trio.open_nursery() as nursery:
            first = await converged_daemon(nursery, state_dir, 2)
            before = (await first.status())["a"]
            assert {r["pid"] for r in before["replicas"]} == set(worker_pids(state_dir))
            assert all(r["node"] == socket.gethostname() for r in before["replicas"])
            iso = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
            assert all(re.fullmatch(iso, r["created_at"]) for r in before["replicas"])
            assert all(re.fullmatch(iso, e["time"]) for e in before["events"])
            table = (await first.cli("status", "a")).stdout.decode()
            assert re.search(r"TAG +STATE +VERSION +ADDRESS +PID +NODE +AGE", table), table
            assert re.search(r"\d+s ago  Deploy", table), table
            assert await first.stop(signal.SIGTERM) == 0

        async with running(state_dir) as second:
            assert (await second.cli("wait", "a")).returncode == 0
            after = (await second.status())["a"]
            deploy = only([e for e in before["events"] if e["kind"] == "Deploy"])
            assert deploy in after["events"]  # kept across the restart, time and all
            assert after["events"][-2]["kind"] == "Recovered"
            created = {r["tag"]: r["created_at"] for r in before["replicas"]}
            assert {r["tag"]: r["created_at"] for r in after["replicas"]} == created
            # A worker of the first daemon (not a child of this one) killed with SIGKILL.
            _, change = await second.http("GET", "/api/v1/watch?timeout_s=0")
            victim = after["replicas"][0]
            os.kill(victim["pid"], signal.SIGKILL)
            query = f"/api/v1/watch?since={change['cursor']}&timeout_s=30"
            assert (await second.http("GET", query))[0] == 200  # it left the snapshot
            status = (await second.status())["a"]
            assert status["last_error"] == "died: worker process killed by SIGKILL"
            assert (await second.cli("wait", "a")).returncode == 0


async def test_workers_never_import_from_the_daemon_s_working_directory(
    state_dir: Path, tmp_path: Path
) -> None:
    # Anyone who can write where the daemon was started could otherwise plant a `controller`
    # package there, and have every worker run it.
    planted = tmp_path / "controller"
    planted.mkdir()
    (planted / "__init__.py").write_text("")
    marker = tmp_path / "ran"
    (planted / "worker.py").write_text(f"open({str(marker)!r}, 'w').write('planted')\n")
    file = state_dir / "backends.toml"
    file.write_text(manifest(a=trivial(1)))
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            daemon = Daemon(state_dir, python_flags=("-P",))  # as the `controller` script is
            await daemon.start(nursery, "--config", str(file), cwd=tmp_path)
            assert (await daemon.cli("wait", "a")).returncode == 0
            assert not marker.exists()
            result = await daemon.cli("shutdown")
            assert result.returncode == 0, result.stderr
            assert daemon.process is not None
            assert await daemon.process.wait() == 0


async def test_a_stale_address_file_is_not_trusted(state_dir: Path) -> None:
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            daemon = Daemon(state_dir)
            await daemon.start(nursery)
            assert daemon.process is not None
            daemon.process.send_signal(signal.SIGKILL)
            await daemon.process.wait()
        assert (state_dir / "daemon.json").exists()  # left behind by the killed daemon
        # Whoever takes that port now must not be sent the token.
        result = await daemon.cli("status")
        assert result.returncode == 1
        assert "its daemon.json is stale" in result.stderr.decode()


async def test_a_token_with_a_stray_newline_works_for_everyone(state_dir: Path) -> None:
    env = {**os.environ, "CONTROLLER_TOKEN": "tok-with-newline\n"}
    with trio.fail_after(LIMIT_S):
        async with running(state_dir, env=env) as daemon:
            assert daemon.token == "tok-with-newline"
            result = await trio.run_process(
                [*daemon.cli_argv(), "status"], capture_stdout=True, env=env, check=False
            )
            assert result.returncode == 0
            lines = result.stdout.decode().splitlines()
            assert lines[0] == "no backends"
            assert lines[1].startswith("leader: this daemon, ")
            assert lines[2].startswith("ingress: 1/1 processes serving on http://127.0.0.1:")
            assert len(lines) == 3


def _slow_drains(state_dir: Path, *, drain_s: float, grace_s: float) -> Path:
    """A manifest of one backend `a` whose replica takes `drain_s` to drain."""
    file = state_dir / "backends.toml"
    slow = {
        "entrypoint": "replicas:Recorder",
        "init_kwargs": {"path": str(state_dir / "rec.jsonl"), "drain_s": drain_s},
        "version": "v1",
        "graceful_shutdown_timeout_s": grace_s,
    }
    file.write_text(manifest(a=slow))
    return file


async def test_shutdown_takes_no_more_changes_and_fails_cleanly_when_the_store_does(
    state_dir: Path,
) -> None:
    file = _slow_drains(state_dir, drain_s=3, grace_s=30)
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            daemon = Daemon(state_dir)
            await daemon.start(nursery, "--config", str(file))
            assert (await daemon.cli("wait", "a")).returncode == 0
            assert daemon.process is not None
            pid = daemon.process.pid
            # The store cannot be written: the shutdown is refused, and nothing changes.
            soft, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (1, hard))
            try:
                code, error = await daemon.http("POST", "/api/v1/shutdown", b"")
            finally:
                resource.prlimit(pid, resource.RLIMIT_FSIZE, (soft, hard))
            assert code == 503, error
            assert (await daemon.status())["a"]["state"] == "HEALTHY"
            # Now it goes through, and while it drains, no change is taken.
            code, reply = await daemon.http("POST", "/api/v1/shutdown?wait=false", b"")
            assert (code, reply) == (202, {"shutting_down": True, "deleting": ["a"]})
            body = json.dumps(trivial(1)).encode()
            code, error = await daemon.http("PUT", "/api/v1/backends/b", body)
            assert (code, error["error"]["type"]) == (503, "ShuttingDown")
            code, error = await daemon.http("DELETE", "/api/v1/backends/a")
            assert (code, error["error"]["type"]) == (503, "ShuttingDown")
            # But a forced delete is taken: it cuts short the drain the shutdown waits for.
            code, _ = await daemon.http("DELETE", "/api/v1/backends/a?force=true")
            assert code == 202
            assert await daemon.process.wait() == 0
        assert worker_pids(state_dir) == {}
        assert [e["what"] for e in events(str(state_dir / "rec.jsonl"))].count("drained") == 0


async def test_shutdown_says_so_when_the_daemon_stops_before_its_deletes(state_dir: Path) -> None:
    file = _slow_drains(state_dir, drain_s=30, grace_s=60)
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            daemon = Daemon(state_dir)
            await daemon.start(nursery, "--config", str(file))
            assert (await daemon.cli("wait", "a")).returncode == 0
            shutdown = await trio.lowlevel.open_process(
                [*daemon.cli_argv(), "shutdown"], stderr=subprocess.PIPE
            )
            assert shutdown.stderr is not None
            try:
                await daemon.logged(b"shutdown asked")
                assert daemon.process is not None
                daemon.process.send_signal(signal.SIGTERM)  # stopped mid-drain
                assert await daemon.process.wait() == 0
                assert await shutdown.wait() == 1
                err = await shutdown.stderr.receive_some()
            finally:
                with trio.CancelScope(shield=True):  # a failed test's too: not the next one's
                    if shutdown.returncode is None:
                        shutdown.kill()
                    await shutdown.wait()
                    await shutdown.stderr.aclose()
            # It answers before it goes (it stops leading first), naming what is left.
            assert b"the controller stopped before a were deleted" in err
            assert b"the next `controller run` finishes the deletes" in err
        # The next start goes on with the delete (forced here, not to wait for the drain).
        async with running(state_dir) as again:
            assert (await again.status())["a"]["state"] == "DELETING"
            assert (await again.cli("delete", "a", "--force", "--wait")).returncode == 0


# -- the fourth round: restarts that forgot what the last daemon knew, and the CLI's edges --


async def test_a_restart_lists_every_replica_at_once_and_retries_no_failed_config(
    state_dir: Path,
) -> None:
    rec = state_dir / "rec.jsonl"
    file = state_dir / "backends.toml"

    def backend(user_config: dict[str, Any]) -> dict[str, Any]:
        return {
            "entrypoint": "replicas:Recorder",
            "init_kwargs": {"path": str(rec)},
            "num_replicas": 2,
            "version": "v1",
            "user_config": user_config,
            "graceful_shutdown_timeout_s": 2,
        }

    def bad_reconfigures() -> int:
        return sum(1 for e in events(str(rec)) if e.get("config") == {"fail": True})

    file.write_text(manifest(a=backend({"n": 1})))
    with trio.fail_after(LIMIT_S * 2):
        async with trio.open_nursery() as nursery:
            first = Daemon(state_dir)
            await first.start(nursery, "--config", str(file))
            assert (await first.cli("wait", "a")).returncode == 0
            file.write_text(manifest(a=backend({"fail": True})))
            result = await first.cli("apply", "-f", str(file), "--wait")
            assert result.returncode == 1, result.stdout
            assert bad_reconfigures() == 1
            _, before = await first.http("GET", "/api/v1/watch?timeout_s=0")
            addresses = {r["address"] for r in only(before["snapshots"])["replicas"]}
            assert len(addresses) == 2
            assert await first.stop(signal.SIGKILL) == -signal.SIGKILL

            second = Daemon(state_dir)
            await second.start(nursery)  # no --config: nothing is asked anew
            # Its first answer is complete, and lists both replicas, at their addresses.
            _, after = await second.http("GET", "/api/v1/watch?timeout_s=0")
            assert after["complete"]
            assert {r["address"] for r in only(after["snapshots"])["replicas"]} == addresses
            assert (await second.cli("wait", "a")).returncode == 1  # still DEPLOY_FAILED
            status = (await second.status())["a"]
            assert (status["state"], status["reason"]) == ("DEPLOY_FAILED", "ReconfigureFailed")
            assert status["ready"] == 2
            assert bad_reconfigures() == 1  # not handed to any replica again
            assert (await second.cli("shutdown")).returncode == 0
            assert await second.process.wait() == 0  # type: ignore[union-attr]


async def test_the_cli_never_shows_a_traceback_for_deep_files_or_closed_pipes(
    state_dir: Path,
) -> None:
    deep = state_dir / "deep.toml"
    deep.write_text(
        "[backends.a]\nentrypoint = 'm:C'\ninit_kwargs = { x = " + "[" * 500 + "]" * 500 + " }\n"
    )
    deep_json = state_dir / "deep.json"
    deep_json.write_text(
        '{"backends": {"a": {"entrypoint": "m:C", "user_config": ' + "[" * 900 + "]" * 900 + "}}}"
    )
    with trio.fail_after(LIMIT_S):
        async with running(state_dir) as daemon:
            for file, says in ((deep, "nested too deeply"), (deep_json, "at most 64 deep")):
                result = await daemon.cli("apply", "-f", str(file))
                assert result.returncode == 2, result.stderr
                assert says in result.stderr.decode()
                assert "Traceback" not in result.stderr.decode()
            code, reply = await daemon.http(
                "PUT",
                "/api/v1/backends/a",
                json.dumps(
                    {"entrypoint": "m:C", "user_config": json.loads("[" * 900 + "]" * 900)}
                ).encode(),
            )
            assert code == 422, reply
            assert (await daemon.status()) == {}
            # A reader that goes away (`| head`): no traceback, only a non-zero exit.
            process = await trio.lowlevel.open_process(
                [*daemon.cli_argv(), "status"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            assert process.stdout is not None
            assert process.stderr is not None
            await process.stdout.aclose()
            errors = b"".join([chunk async for chunk in process.stderr])
            await process.wait()
            assert errors == b"", errors


async def test_a_url_that_is_not_one_is_said_so(state_dir: Path) -> None:
    with trio.fail_after(LIMIT_S):
        result = await trio.run_process(
            [sys.executable, "-m", "controller", "--url", "notaurl", "status"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 1
    assert one_line(result.stderr) == (
        "error: --url 'notaurl' is not a URL; the daemon's is http://HOST:PORT"
    )


async def test_apply_wait_says_when_a_later_change_superseded_it(state_dir: Path) -> None:
    file = state_dir / "backends.toml"
    slow = {
        "entrypoint": "replicas:SlowInit",
        "init_kwargs": {"seconds": 3},
        "num_replicas": 1,
        "version": "v8",
    }
    file.write_text(manifest(a=slow))
    later = state_dir / "later.toml"
    later.write_text(manifest(a={**slow, "version": "v9", "init_kwargs": {"seconds": 0}}))
    with trio.fail_after(LIMIT_S):
        async with running(state_dir) as daemon:
            async with trio.open_nursery() as nursery:
                first: list[subprocess.CompletedProcess[bytes]] = []

                async def wait_for_v8() -> None:
                    first.append(await daemon.cli("apply", "-f", str(file), "--wait"))

                nursery.start_soon(wait_for_v8)
                await daemon.logged(b"deploy generation 1")
                assert (await daemon.cli("apply", "-f", str(later), "--wait")).returncode == 0
            (result,) = first
            assert result.returncode == 1
            assert b"superseded by generation 2" in result.stdout


async def test_a_body_too_large_sent_whole_before_reading_gets_its_413(state_dir: Path) -> None:
    # As urllib and most scripts send: the whole body, and only then the answer is read. The
    # daemon refuses it unread; were the connection closed with the body unread, it would be
    # reset, and the client would see that instead of the 413.
    body = b"x" * (4 << 20)
    with trio.fail_after(LIMIT_S):
        async with running(state_dir) as daemon:
            host, port = daemon.url.removeprefix("http://").rsplit(":", 1)
            for _ in range(3):
                async with await trio.open_tcp_stream(host, int(port)) as stream:
                    await stream.send_all(
                        b"PUT /api/v1/backends/a HTTP/1.1\r\nHost: h\r\n"
                        b"Authorization: Bearer " + daemon.token.encode() + b"\r\n"
                        b"Content-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n" % len(body) + body
                    )
                    answer = b""
                    while chunk := await stream.receive_some(65536):
                        answer += chunk
                        if b"TooLarge" in answer:
                            break
                assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
                assert b"TooLarge" in answer
