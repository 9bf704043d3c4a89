"""Shipping edited code through a real daemon, as a newcomer does: edit the replica's module,
`apply` says the code changed and how to ship it, `rollout restart --wait` replaces every
worker, and the ingress then answers with the new code. Real processes, bounded waits."""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import trio

from ..daemons import LIMIT_S, running, until
from ..pristine import EXAMPLES
from ..workers import worker_pids


async def _get(url: str) -> dict[str, Any]:
    def call() -> dict[str, Any]:
        with urllib.request.urlopen(url, timeout=30) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer

    return await trio.to_thread.run_sync(call)


def user_code(tmp_path: Path) -> tuple[Path, Path]:
    """A user's own code directory: the README's echo replica and a manifest for it."""
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(EXAMPLES / "echo_replica.py", code / "echo_replica.py")
    file = code / "backends.toml"
    file.write_text(
        "[backends.echo]\n"
        'entrypoint = "echo_replica:Echo"\n'
        'route_prefix = "/echo"\n'
        "num_replicas = 2\n"
        'version = "v1"\n'
        "max_surge = 1\n"
        "max_unavailable = 0\n"
        "graceful_shutdown_timeout_s = 5\n"
    )
    return code, file


def edit(code: Path) -> None:
    source = (code / "echo_replica.py").read_text()
    edited = source.replace('"pid": os.getpid()}', '"pid": os.getpid(), "edited": True}')
    assert edited != source
    (code / "echo_replica.py").write_text(edited)


async def test_edited_code_is_named_by_apply_and_status_and_shipped_by_restart(
    state_dir: Path, tmp_path: Path
) -> None:
    code, file = user_code(tmp_path)
    with trio.fail_after(LIMIT_S * 2):
        async with running(state_dir, "--pythonpath", str(code), "--config", str(file)) as daemon:
            assert (await daemon.cli("wait", "echo")).returncode == 0
            url = daemon.ingress_url + "/echo"
            assert "edited" not in await _get(url)
            pids = worker_pids(state_dir)

            edit(code)

            result = await daemon.cli("apply", "-f", str(file))
            assert result.returncode == 0, result.stderr
            assert result.stdout.decode().splitlines() == [
                "backend/echo unchanged (generation 1)",
                "  code changed on disk since its revision was made: its replicas run the old "
                "code until `controller rollout restart echo` ships it",
            ]
            status = await daemon.cli("status", "echo")
            assert "`controller rollout restart echo` ships it" in status.stdout.decode()
            assert "edited" not in await _get(url)  # nothing restarted by itself

            result = await daemon.cli("rollout", "restart", "echo", "-m", "ship it", "--wait")
            assert result.returncode == 0, result.stderr
            out = result.stdout.decode()
            assert out.startswith("backend/echo restarting: revision 2 runs the same content")
            assert "backend/echo: 2/2 ready, HEALTHY" in out
            assert not set(worker_pids(state_dir)) & set(pids)  # every worker replaced
            assert (await _get(url))["edited"] is True
            versions = (await daemon.status())["echo"]["counts_by_version"]
            assert versions == {"v1+restart.2": {"RUNNING": 2}}

            history = (await daemon.cli("rollout", "history", "echo")).stdout.decode()
            assert 'restart of revision 1, cli: "ship it"' in history
            result = await daemon.cli("apply", "-f", str(file))
            assert result.stdout.decode().splitlines() == ["backend/echo unchanged (generation 2)"]


async def test_run_reload_ships_an_edit_by_itself(state_dir: Path, tmp_path: Path) -> None:
    code, file = user_code(tmp_path)
    args = ("--pythonpath", str(code), "--config", str(file), "--reload")
    with trio.fail_after(LIMIT_S * 2):
        async with running(state_dir, *args) as daemon:
            assert (await daemon.cli("wait", "echo")).returncode == 0
            pids = worker_pids(state_dir)
            edit(code)
            await daemon.logged(b"--reload: the code of backend echo changed on disk")
            assert (await daemon.cli("wait", "echo")).returncode == 0
            assert not set(worker_pids(state_dir)) & set(pids)
            assert (await _get(daemon.ingress_url + "/echo"))["edited"] is True
            history = (await daemon.cli("rollout", "history", "echo")).stdout.decode()
            assert 'restart of revision 1, controller: "--reload: the code changed on disk"' in (
                history
            )


async def test_a_release_directory_switched_by_its_symlink_is_what_a_restart_ships(
    state_dir: Path, tmp_path: Path
) -> None:
    # The `current -> releases/N` layout: the daemon is given the link, not a release.
    first, file = user_code(tmp_path)
    second = tmp_path / "release-2"
    shutil.copytree(first, second)
    edit(second)
    current = tmp_path / "current"
    current.symlink_to(first)
    with trio.fail_after(LIMIT_S * 2):
        async with running(
            state_dir, "--pythonpath", str(current), "--config", str(file)
        ) as daemon:
            assert (await daemon.cli("wait", "echo")).returncode == 0
            url = daemon.ingress_url + "/echo"
            assert "edited" not in await _get(url)
            switched = tmp_path / "current.new"
            switched.symlink_to(second)
            switched.rename(current)  # atomically, as a deploy script does
            status = (await daemon.cli("status", "echo")).stdout.decode()
            assert "`controller rollout restart echo` ships it" in status
            result = await daemon.cli("rollout", "restart", "echo", "--wait")
            assert result.returncode == 0, result.stderr
            assert (await _get(url))["edited"] is True
            history = (await daemon.cli("rollout", "history", "echo")).stdout.decode()
            assert "CHANGED" not in history.splitlines()[-1]  # the restart pinned what runs


async def test_reload_never_leaves_a_revision_pinning_code_its_replicas_do_not_run(
    state_dir: Path, tmp_path: Path
) -> None:
    """Found by the fourth attack: an edit saved in two writes, the second landing as the
    restart of the first began, left a revision recorded complete with the digest of the first
    while its replicas ran the second. The next look finds the code on disk unlike the pin and
    restarts once more: the revision that ends up running pins what its replicas run."""
    code, file = user_code(tmp_path)
    args = ("--pythonpath", str(code), "--config", str(file), "--reload")
    module = code / "echo_replica.py"
    source = module.read_text()

    def saved(mark: int) -> None:
        module.write_text(
            source.replace('"pid": os.getpid()}', f'"pid": os.getpid(), "edited": {mark}}}')
        )

    with trio.fail_after(LIMIT_S * 2):
        async with running(state_dir, *args) as daemon:
            assert (await daemon.cli("wait", "echo")).returncode == 0
            saved(1)
            await daemon.logged(b"--reload: the code of backend echo changed on disk")
            saved(2)  # as the restart of the first write begins
            cursor = 0
            while True:
                status = await until(daemon, "echo", settled_on_any_version)
                answer, revisions = await daemon.http("GET", "/api/v1/backends/echo/revisions")
                assert answer == 200
                last = revisions["revisions"][-1]
                running_now = status["version"] == last["version"]
                if running_now and last["code_changed"] is False:
                    break  # the revision that runs pins what is on disk
                answer, data = await daemon.http("GET", f"/api/v1/watch?since={cursor}&timeout_s=1")
                cursor = data["cursor"]
            assert (await _get(daemon.ingress_url + "/echo"))["edited"] == 2
            assert (await daemon.cli("wait", "echo")).returncode == 0


def settled_on_any_version(status: dict[str, Any]) -> bool:
    return bool(
        status["state"] == "HEALTHY"
        and status["replicas"]
        and all(r["version"] == status["version"] for r in status["replicas"])
    )
