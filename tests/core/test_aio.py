"""Embedding in asyncio: each way's cases run in a process of their own, since guest mode needs a
process that never imported trio_asyncio, and trio_asyncio changes asyncio process-wide."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import trio

from ..pristine import EXAMPLES

HERE = Path(__file__).parent.parent


async def run_cases(file: str, expected: int) -> None:
    with trio.fail_after(120):
        result = await trio.run_process(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / file)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=HERE.parent,
        )
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode()
    assert re.search(rf"\b{expected} passed\b", out), out


async def test_guest_mode_in_a_stock_asyncio_loop() -> None:
    await run_cases("aio_guest_cases.py", 7)


async def test_under_trio_asyncio_with_mockclock() -> None:
    pytest.importorskip("trio_asyncio")
    await run_cases("aio_trio_asyncio_cases.py", 5)


@pytest.mark.parametrize("app", ["aio_guest_app.py", "aio_trio_asyncio_app.py"])
async def test_the_asyncio_web_app_deploys_and_scales(app: str) -> None:
    pytest.importorskip("aiohttp")
    with trio.fail_after(120):
        result = await trio.run_process(
            [sys.executable, str(EXAMPLES / app), "--demo", "--port", "0"],
            capture_stderr=True,
            check=False,
        )
    log = result.stderr.decode()
    assert result.returncode == 0, log
    for line in [
        "PUT /backends/echo?replicas=2 -> 200 {'outcome': 'COMPLETED', "
        "'message': '2/2 replicas of version v1 running'}",
        "PUT /backends/echo?replicas=3 -> 200 {'outcome': 'COMPLETED', "
        "'message': '3/3 replicas of version v1 running'}",
        "GET /backends -> 200 {'echo': {'state': 'HEALTHY'",
        "DELETE /backends/echo -> 200 {'deleted': 'echo'}",
    ]:
        assert line in log, line
    if app == "aio_guest_app.py":
        assert "trio_asyncio imported: False" in log
