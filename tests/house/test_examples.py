"""The examples run as a user runs them: real worker processes, real HTTP traffic."""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import trio

from ..pristine import EXAMPLES
from ..workers import worker_pids

ROOT = Path(__file__).parent.parent.parent


def assert_every_step_served(out: str) -> None:
    """The tour's log: every goal reached, and traffic served through each change."""
    for line in [
        "goal   completed: 2/2 replicas of version v1 running",
        "goal   completed: 4/4 replicas of version v1 running",
        "a replica now says 'hey'",
        "goal   completed: 4/4 replicas of version v2 running",
        "goal   completed: 1/1 replica of version v2 running",
        "traffic stopped: 0 requests failed in all",
        "goal   completed: echo deleted",
    ]:
        assert line in out, line
    # Traffic really flowed, and through the scale-down too.
    served = [int(n) for n in re.findall(r"requests: (\d+) ok, 0 failed", out)]
    assert len(served) >= 5
    assert all(n > 0 for n in served)


async def test_quickstart_serves_every_request_through_every_change() -> None:
    state = Path(tempfile.mkdtemp(prefix="qs", dir="/tmp"))  # short: Unix socket paths
    try:
        with trio.fail_after(120):
            result = await trio.run_process(
                [
                    sys.executable,
                    str(EXAMPLES / "quickstart.py"),
                    "--state-dir",
                    str(state),
                    "--clients",
                    "2",
                ],
                capture_stdout=True,
                capture_stderr=True,
            )
        out = result.stderr.decode()
        assert_every_step_served(out)
        assert "STOPPING (drain)" in out
        assert worker_pids(state) == {}
    finally:
        shutil.rmtree(state, ignore_errors=True)


async def test_ray_quickstart_serves_every_request_through_every_change() -> None:
    pytest.importorskip("ray")
    with trio.fail_after(180):
        result = await trio.run_process(
            [sys.executable, str(EXAMPLES / "ray_quickstart.py"), "--clients", "2"],
            capture_stdout=True,
            capture_stderr=True,
            env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        )
    assert_every_step_served(result.stderr.decode())


#: The README's worked rollout example: its ``console`` blocks, under this heading.


def test_the_tests_run_the_committed_examples_when_the_reader_has_edited_them(
    tmp_path: Path,
) -> None:
    """Found by a newcomer: the README invites edits of examples/backends.toml and
    examples/echo_replica.py, and the tests read both from the working tree, so following it
    broke the test command. In a clone with those edits, the tests' examples are the commit's."""
    import subprocess

    clone = tmp_path / "clone"
    subprocess.run(
        ["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)],
        check=True,
        timeout=120,
    )
    committed = (clone / "examples" / "backends.toml").read_text()
    (clone / "examples" / "backends.toml").write_text(committed + "\n# the reader's edit\n")
    (clone / "examples" / "echo_replica.py").write_text("raise SystemExit('edited')\n")
    probe = (
        "from tests.pristine import EXAMPLES, NOTICE; "
        "print(EXAMPLES); print((EXAMPLES / 'backends.toml').read_text() == "
        f"{committed!r}); print(NOTICE)"
    )
    env = {**os.environ, "PYTHONPATH": str(clone)}
    env.pop("CONTROLLER_TEST_EXAMPLES", None)

    def probed() -> list[str]:
        result = subprocess.run(
            [sys.executable, "-c", probe],
            cwd=clone,
            env=env,
            capture_output=True,
            check=True,
            timeout=60,
        )
        return result.stdout.decode().splitlines()

    said = probed()
    assert said[0] != str(clone / "examples"), said
    assert said[1] == "True", said
    assert "examples/ has local edits" in said[2], said
    assert "raise SystemExit" not in (Path(said[0]) / "echo_replica.py").read_text()
    # Asked for, the edits are what runs.
    env["CONTROLLER_TEST_EXAMPLES"] = "worktree"
    said = probed()
    assert said[0] == str(clone / "examples"), said
