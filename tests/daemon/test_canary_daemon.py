"""Canary releases as a user runs them: a daemon with real workers and its ingress in processes
of its own, real traffic, and the controller judging each revision on what the ingress counted.
A bad release is aborted at its first step, a healthy one promoted through every step at the
weights asked, a slow one stopped by the latency gate, a sticky client kept on one revision, a
daemon killed mid-canary resumed at the same step, and promote and abort from the CLI."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from ..daemons import LIMIT_S, Daemon, app, free_port, manifest, running, settled, until
from ..documents import page
from ..http_client import THINK_S, get_from, request
from ..pristine import EXAMPLES, EXAMPLES_ROOT


def canary_app(version: str = "v1", **fields: Any) -> dict[str, Any]:
    block = {"steps": [{"weight": 2, "pause_s": 120}], "min_requests": 20}
    block.update(fields.pop("canary", {}))
    return app(version=version, num_replicas=2, canary=block, **fields)


class Load:
    """Requests through the ingress by a few tasks, each answer kept with the version that
    served it (a 5xx names none: only the bad release answers them). `think_s`: each task's
    pause after an answer, for a test whose steps wait on their pauses rather than on counts
    (without, the tasks send as fast as the machine answers)."""

    def __init__(self, port: int, path: str = "/app/any", think_s: float = 0.0) -> None:
        self.port, self.path, self.think_s = port, path, think_s
        self.versions: dict[str, str] = {}
        self.answers: list[tuple[int, str]] = []
        self.stop = trio.Event()
        self.mark = 0
        self._grew = trio.Event()

    async def send(self, headers: list[tuple[str, str]] | None = None) -> None:
        while not self.stop.is_set():
            answer = await request(self.port, self.path, headers=headers)
            tag = answer.json()["replica"] if answer.status == 200 else ""
            self.answers.append((answer.status, tag))
            self._grew.set()
            self._grew = trio.Event()
            await trio.sleep(self.think_s)  # a checkpoint, at the least

    def start(self, nursery: trio.Nursery, tasks: int) -> None:
        for _ in range(tasks):
            nursery.start_soon(self.send)

    async def answered(self, count: int) -> None:
        """Wait until `count` requests in all have been answered."""
        while len(self.answers) < count:
            await self._grew.wait()

    def since_mark(self) -> list[tuple[int, str]]:
        return self.answers[self.mark :]


@asynccontextmanager
async def v1_serving(state_dir: Path, **fields: Any) -> AsyncIterator[tuple[Daemon, int, Path]]:
    """A daemon with its ingress on a port of its own, serving `app` at v1 (`fields` on top of
    ``canary_app``'s) from a manifest file; the file is yours to change."""
    path = state_dir / "app.toml"
    path.write_text(manifest(app=canary_app(**fields)))
    port = free_port()
    with trio.fail_after(LIMIT_S * 3):
        async with running(
            state_dir, "--config", str(path), "--ingress-listen", f"127.0.0.1:{port}"
        ) as daemon:
            await until(daemon, "app", settled("v1"))
            yield daemon, port, path


async def tags_by_version(daemon: Daemon) -> dict[str, str]:
    status = (await daemon.status())["app"]
    return {r["tag"]: r["version"] for r in status["replicas"]}


def step_numbers(events: list[dict[str, Any]], kind: str) -> list[tuple[int, int]]:
    """(canary, stable) requests each step's event counted."""
    out = []
    for event in events:
        if event["kind"] == kind:
            found = re.search(r"canary (\d+) requests.*stable (\d+) requests", event["message"])
            assert found is not None, event
            out.append((int(found[1]), int(found[2])))
    return out


async def test_a_bad_release_is_aborted_at_its_first_step(state_dir: Path) -> None:
    async with v1_serving(state_dir) as (daemon, port, path):
        load = Load(port)
        async with trio.open_nursery() as nursery:
            load.start(nursery, 4)
            # Every fifth request answers 500: a fifth of what the canary gets.
            path.write_text(manifest(app=canary_app("v2", init_kwargs={"error_every": 5})))
            result = await daemon.cli("apply", "-f", str(path))
            assert result.returncode == 0, result.stderr
            await until(daemon, "app", lambda s: "v2" in {r["version"] for r in s["replicas"]})
            serving = await tags_by_version(daemon)
            # Back on the stable revision alone: the canary's revision failed, rolled back.
            status = await until(
                daemon, "app", lambda s: s["rollout"]["revision"] == 3 and settled("v1")(s)
            )
            during = list(load.answers)
            load.mark = len(load.answers)
            await load.answered(load.mark + 200)
            load.stop.set()
        stable = sum(1 for code, tag in during if code == 200 and serving.get(tag) == "v1")
        failed = [code for code, _ in during if code != 200]
        # At 2%, the stable revision served nearly everything during the step; the few 500s
        # are the canary's, before the abort; none after it.
        assert stable >= 0.95 * len(during), (stable, len(during))
        assert all(code == 500 for code in failed)
        assert [code for code, _ in load.since_mark() if code != 200] == []
        revision = (await daemon.http("GET", "/api/v1/backends/app/revisions"))[1]["revisions"]
        assert [(r["number"], r["outcome"]) for r in revision] == [
            (1, "complete"),
            (2, "failed"),
            (3, "complete"),
        ]
        assert revision[1]["canary_of"] == 1
        assert "error rate" in revision[1]["error"], revision[1]["error"]
        assert "step 1 of 1 (2%)" in revision[1]["error"]
        assert status["rollout"]["automatic"] is True
        history = await daemon.cli("rollout", "history", "app")
        assert b"error rate" in history.stdout + history.stderr


async def test_a_healthy_release_is_promoted_at_the_weights_asked(state_dir: Path) -> None:
    steps = [{"weight": 10, "pause_s": 2}, {"weight": 50, "pause_s": 2}]
    block = {"steps": steps, "min_requests": 100, "p99_slack_s": 0.5}
    async with v1_serving(state_dir, canary=block) as (daemon, port, path):
        load = Load(port)
        async with trio.open_nursery() as nursery:
            load.start(nursery, 4)
            path.write_text(manifest(app=canary_app("v2", canary=block)))
            result = await daemon.cli("apply", "-f", str(path), "--wait", "--timeout", "60")
            assert result.returncode == 0, result.stderr
            load.stop.set()
        out = result.stdout.decode()
        assert "canary revision 2 (stable 1): step 1/2 at 10%" in out, out
        status = await until(daemon, "app", settled("v2"))
        assert [code for code, _ in load.answers if code != 200] == []
        counted = step_numbers(status["events"], "CanaryStepPassed")
        counted += step_numbers(status["events"], "CanaryPromoted")
        shares = [c / (c + s) for c, s in counted]
        assert len(shares) == 2, status["events"]
        assert abs(shares[0] - 0.10) < 0.05, shares
        assert abs(shares[1] - 0.50) < 0.08, shares
        assert status["rollout"]["outcome"] == "complete"


async def test_a_slow_release_is_stopped_by_the_latency_gate(state_dir: Path) -> None:
    block = {"steps": [{"weight": 30, "pause_s": 60}]}
    async with v1_serving(state_dir, init_kwargs={"delay_ms": 40}, canary=block) as (
        daemon,
        port,
        path,
    ):
        load = Load(port)
        async with trio.open_nursery() as nursery:
            load.start(nursery, 6)
            slow = canary_app("v2", init_kwargs={"delay_ms": 80}, canary=block)
            path.write_text(manifest(app=slow))
            result = await daemon.cli("apply", "-f", str(path), "--wait", "--timeout", "60")
            assert result.returncode == 1
            load.stop.set()
        await until(daemon, "app", lambda s: s["rollout"]["revision"] == 3 and settled("v1")(s))
        kept = (await daemon.http("GET", "/api/v1/backends/app/revisions"))[1]["revisions"]
        assert "p99" in kept[1]["error"], kept[1]["error"]
        assert [code for code, _ in load.answers if code != 200] == []


async def test_a_sticky_client_stays_on_one_revision(state_dir: Path) -> None:
    block = {
        "steps": [{"weight": 50, "pause_s": 600}],
        # Not a test of the latency gate: a busy machine's slow answers must not abort it.
        "p99_slack_s": 5,
        "sticky_header": "X-User",
        "force_header": "X-Revision",
    }
    async with v1_serving(state_dir, canary=block) as (daemon, port, path):
        path.write_text(manifest(app=canary_app("v2", canary=block)))
        result = await daemon.cli("apply", "-f", str(path))
        assert result.returncode == 0, result.stderr
        await until(
            daemon, "app", lambda s: (s["rollout"]["canary"] or {}).get("phase") == "judging"
        )
        versions = await tags_by_version(daemon)
        # Clients that hang up before the answer: not errors of the canary's (checked below).
        for _ in range(10):
            with trio.move_on_after(0.05):
                await request(port, "/app/slow?ms=300", headers=[("X-Revision", "canary")])
        seen: dict[str, set[str]] = {}
        for user in range(40):
            for _ in range(4):
                answer = await request(port, "/app/any", headers=[("X-User", f"user-{user}")])
                assert answer.status == 200
                seen.setdefault(f"user-{user}", set()).add(versions[answer.json()["replica"]])
        assert all(len(v) == 1 for v in seen.values()), seen
        on_canary = sum(1 for v in seen.values() if v == {"v2"})
        assert 8 <= on_canary <= 32, on_canary  # about half of 40
        # Without the header: a draw each time, so both revisions answer.
        drawn = set()
        for _ in range(60):
            answer = await request(port, "/app/any")
            drawn.add(versions[answer.json()["replica"]])
        assert drawn == {"v1", "v2"}
        # The forcing header wins over the sticky one.
        for side, version in (("canary", "v2"), ("stable", "v1")):
            for user in range(10):
                headers = [("X-User", f"user-{user}"), ("X-Revision", side)]
                answer = await request(port, "/app/any", headers=headers)
                assert versions[answer.json()["replica"]] == version
        _, metrics = await daemon.http("GET", "/metrics")
        assert 'controller_canary_weight_percent{backend="app",revision="2"} 50.0' in metrics
        # The hang-ups at the start (reported within 0.1 s, long before now) were no errors.
        status = await until(
            daemon, "app", lambda s: s["rollout"]["canary"]["canary"]["requests"] > 0
        )
        assert status["rollout"]["canary"]["canary"]["errors"] == 0


async def test_a_daemon_killed_mid_canary_resumes_the_step_and_the_cli_steers(
    state_dir: Path,
) -> None:
    steps = [{"weight": 10, "pause_s": 0}, {"weight": 50, "pause_s": 3600}]
    # Not a test of the gates: a busy machine's slow answers must not abort it (p99_slack_s).
    fields: dict[str, Any] = {"canary": {"steps": steps, "min_requests": 20, "p99_slack_s": 5}}
    good = state_dir / "good.toml"
    good.write_text(manifest(app=canary_app(**fields)))
    port = free_port()
    first, second = Daemon(state_dir), Daemon(state_dir)
    args = ("--config", str(good), "--ingress-listen", f"127.0.0.1:{port}")
    with trio.fail_after(LIMIT_S * 4):
        async with trio.open_nursery() as nursery:
            try:
                await first.start(nursery, *args)
                await until(first, "app", settled("v1"))
                good.write_text(manifest(app=canary_app("v2", **fields)))
                result = await first.cli("apply", "-f", str(good))
                assert result.returncode == 0, result.stderr
                load = Load(port)
                nursery.start_soon(load.send)
                await until(first, "app", lambda s: (s["rollout"]["canary"] or {}).get("step") == 2)
                load.stop.set()
                assert first.process is not None
                first.process.send_signal(signal.SIGKILL)
                await first.process.wait()
                await second.start(nursery, *args[2:])  # no config: a restart, not a deploy
                status = await until(
                    second, "app", lambda s: (s["rollout"]["canary"] or {}).get("step") == 2
                )
                canary = status["rollout"]["canary"]
                assert (canary["weight"], canary["revision"], canary["stable_revision"]) == (
                    50,
                    2,
                    1,
                )
                shown = await second.cli("rollout", "abort", "app")
                assert shown.returncode == 0, shown.stderr
                assert b"aborted at step 2 of 2" in shown.stdout
                await until(
                    second, "app", lambda s: s["rollout"]["revision"] == 3 and settled("v1")(s)
                )
                again = await second.cli("rollout", "promote", "app")
                assert again.returncode != 0
                assert b"no canary release being judged" in again.stderr
                result = await second.cli("shutdown")
                assert result.returncode == 0, result.stderr
                assert second.process is not None
                assert await second.process.wait() == 0
            finally:
                for daemon in (first, second):
                    if daemon.process is not None and daemon.process.returncode is None:
                        daemon.process.send_signal(signal.SIGKILL)
            nursery.cancel_scope.cancel()


def readme_commands() -> list[str]:
    """The ``$ controller ...`` commands of the canary example (docs/canary.md), in order."""
    section = page("canary.md")
    (block,) = re.findall(r"```console\n(.*?)```", section, re.DOTALL)
    return [line[2:] for line in block.splitlines() if line.startswith("$ controller ")]


async def _from(
    source: str, port: int, path: str, headers: tuple[tuple[str, str], ...] = ()
) -> tuple[int, str]:
    """A GET from the loopback address `source`: its status, and the replica that answered
    ("" if none said)."""
    said = "".join(f"{k}: {v}\r\n" for k, v in headers)
    answer = await get_from(source, port, path, said)
    body = answer.partition(b"\r\n\r\n")[2]
    replica = json.loads(body)["replica"] if answer[9:12] == b"200" and body else ""
    return int(answer[9:12]), replica


async def _steered(state_dir: Path, release: dict[str, Any], side: str) -> list[dict[str, Any]]:
    """The fourth attack's canary steering, run against `release`: six clients (each an
    address) send plain requests while one address finds sticky values that land on the
    `side` revision (the answers name the replica) and sends requests the app fails with
    those alone. The backend's revisions once the canary ended, either way."""
    block = release["canary"]
    async with v1_serving(state_dir, canary=block) as (daemon, port, path):
        path.write_text(manifest(app=release))
        assert (await daemon.cli("apply", "-f", str(path))).returncode == 0
        await until(
            daemon, "app", lambda s: (s["rollout"]["canary"] or {}).get("phase") == "judging"
        )
        versions = await tags_by_version(daemon)
        wanted = "v2" if side == "canary" else "v1"
        values = []
        for user in range(40):
            _, tag = await _from("127.0.0.66", port, "/app/any", (("X-User", f"u{user}"),))
            if versions.get(tag) == wanted:
                values.append(f"u{user}")
        assert values, "no sticky value lands there"

        async def client(source: str) -> None:
            while True:
                await _from(source, port, "/app/any")
                await trio.sleep(THINK_S)

        async def attacker() -> None:
            while True:
                for value in values:
                    await _from("127.0.0.66", port, "/app/fail", (("X-User", value),))
                    await trio.sleep(THINK_S)

        async with trio.open_nursery() as nursery:
            for n in range(6):
                nursery.start_soon(client, f"127.0.0.{11 + n}")
            for _ in range(3):
                nursery.start_soon(attacker)
            await until(
                daemon,
                "app",
                lambda s: settled("v2")(s) or (s["rollout"]["revision"] == 3 and settled("v1")(s)),
            )
            nursery.cancel_scope.cancel()
        revisions = (await daemon.http("GET", "/api/v1/backends/app/revisions"))[1]["revisions"]
        return list(revisions)


def _sticky_release(**fields: Any) -> dict[str, Any]:
    # One step of half the traffic: its numbers come within a few seconds. Not a test of the
    # latency gate: a busy machine's slow answers must not decide it.
    block = {
        "steps": [{"weight": 50, "pause_s": 3}],
        "min_requests": 60,
        "p99_slack_s": 5,
        "sticky_header": "X-User",
    }
    return canary_app("v2", canary=block, **fields)


async def test_one_client_failing_the_canary_does_not_abort_an_identical_release(
    state_dir: Path,
) -> None:
    revisions = await _steered(state_dir, _sticky_release(), "canary")
    assert [(r["number"], r["outcome"]) for r in revisions] == [(1, "complete"), (2, "complete")]


async def test_one_client_failing_the_stable_does_not_hide_a_failing_release(
    state_dir: Path,
) -> None:
    # A fifth of what the canary answers fails, whoever sends it.
    release = _sticky_release(init_kwargs={"error_every": 5})
    revisions = await _steered(state_dir, release, "stable")
    assert [(r["number"], r["outcome"]) for r in revisions] == [
        (1, "complete"),
        (2, "failed"),
        (3, "complete"),
    ]
    assert "error rate" in revisions[1]["error"], revisions[1]["error"]
    assert "without 127.0.0.66" in revisions[1]["error"], revisions[1]["error"]


async def test_the_readme_canary_example_runs_as_written(state_dir: Path) -> None:
    examples = EXAMPLES
    port = free_port()
    commands = readme_commands()
    assert [c.split()[1:3] for c in commands] == [
        ["apply", "-f"],
        ["rollout", "history"],
        ["apply", "-f"],
    ]
    with trio.fail_after(LIMIT_S * 6):
        async with running(
            state_dir,
            "--config",
            str(examples / "backends.toml"),
            "--pythonpath",
            str(examples),
            "--ingress-listen",
            f"127.0.0.1:{port}",
        ) as daemon:
            await until(daemon, "echo", settled("v1"))
            # Its steps pause 10 s each: the paced load still brings each step's numbers.
            load = Load(port, "/echo", THINK_S)
            said = []
            async with trio.open_nursery() as nursery:
                load.start(nursery, 4)
                for command in commands:
                    args = [
                        str(EXAMPLES_ROOT / a) if a.startswith("examples/") else a
                        for a in command.split()[1:]
                    ]
                    result = await daemon.cli(*args)
                    said.append((result.returncode, (result.stdout + result.stderr).decode()))
                load.stop.set()
            (bad, bad_out), (_, history), (fixed, fixed_out) = said
            assert bad == 1, bad_out
            assert "error rate" in bad_out, bad_out
            assert "the canary is aborted" in bad_out
            assert "failed: echo" in bad_out
            assert "automatic rollback to revision 1" in history, history
            assert fixed == 0, fixed_out
            assert "step 3/3 at 50%" in fixed_out, fixed_out
            assert fixed_out.rstrip().endswith("done")
            # The bad release's failures are the few of its step: none once it was aborted.
            failed = [i for i, (code, _) in enumerate(load.answers) if code != 200]
            assert 0 < len(failed) < 0.05 * len(load.answers), (len(failed), len(load.answers))
            print("\n".join(f"$ {c}\n{out}" for c, (_, out) in zip(commands, said, strict=True)))
