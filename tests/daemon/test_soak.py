"""A bounded soak (``nox -s reliability`` runs it for three minutes): live traffic through the
router while the backend is scaled, reconfigured and rolled at random; not one request fails."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import trio

SOAK = Path(__file__).parent.parent.parent / "bench" / "soak.py"


async def test_ten_seconds_of_changes_under_traffic_fail_no_request() -> None:
    with trio.fail_after(120):
        result = await trio.run_process(
            [sys.executable, str(SOAK), "--seconds", "10", "--clients", "2", "--seed", "7"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode()[-2000:]
    match = re.search(r"(\d+) changes, (\d+) requests served, \d+ retried, 0 failed", out)
    assert match, out
    assert int(match.group(1)) >= 3
    assert int(match.group(2)) > 1000
