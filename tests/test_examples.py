"""The examples run as a user runs them."""

from __future__ import annotations

import sys
from pathlib import Path

import trio

EXAMPLES = Path(__file__).parent.parent / "examples"


async def test_quickstart_runs_and_prints_each_transition(tmp_path: Path) -> None:
    with trio.fail_after(60):
        result = await trio.run_process(
            [
                sys.executable,
                str(EXAMPLES / "quickstart.py"),
                "--state-dir",
                str(tmp_path),
                "--start-delay",
                "0.01",
            ],
            capture_stdout=True,
            capture_stderr=True,
        )
    out = result.stderr.decode()
    for line in [
        "goal   completed: 2/2 replicas of version v1 running",
        "goal   completed: 4/4 replicas of version v2 running",
        "scale echo to 20 refused",
        "STOPPING (drain)",
        "watch  stats  gone",
        "goal   completed: echo deleted",
    ]:
        assert line in out, line
    assert (tmp_path / "controller.db").exists()
