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

from ..workers import worker_pids

ROOT = Path(__file__).parent.parent.parent
EXAMPLES = ROOT / "examples"


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
