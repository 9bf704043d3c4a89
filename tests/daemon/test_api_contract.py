"""Schemathesis against a real daemon (real workers, the example backends): requests generated
from ``/openapi.json``, valid and invalid, one by one and chained (stateful), with every check
on (schemathesis's default; tests/contract/schemathesis.toml turns one off for some reads, and
says why). It must find nothing. Bounded to a few seconds; ``CONTRACT_EXAMPLES`` raises the
count for a longer run."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import trio

from ..daemons import HERE, running
from ..pristine import EXAMPLES

CONTRACT = HERE / "contract"
MAX_EXAMPLES = int(os.environ.get("CONTRACT_EXAMPLES", "25"))


async def test_schemathesis_finds_nothing(state_dir: Path) -> None:
    st = Path(sys.executable).with_name("st")
    manifest = str(EXAMPLES / "backends.toml")
    extra: tuple[str, ...] = ("--config", manifest, "--pythonpath", str(EXAMPLES))
    extra += ("--max-replicas", "6")
    # What is checked here is the API's contract, not leadership: a lease of 10 s, so that a
    # busy CI machine (the Ray tests beside it) cannot take the lease of this lone daemon away
    # mid-run. Once its shutdown found the controller closed (the daemon answered; what
    # closes a lone daemon's controller is a lease lost), every backend left undeleted.
    extra += ("--lease-duration", "10", "--lease-renew", "2")
    with trio.fail_after(600):
        async with running(state_dir, *extra) as daemon:
            env = {
                **os.environ,
                "PYTHONPATH": str(CONTRACT),
                "SCHEMATHESIS_HOOKS": "st_hooks",
                "NO_COLOR": "1",
            }
            result = await trio.run_process(
                [
                    str(st),
                    "--config-file",
                    str(CONTRACT / "schemathesis.toml"),
                    "run",
                    f"{daemon.url}/openapi.json",
                    "--header",
                    f"Authorization: Bearer {daemon.token}",
                    "--phases",
                    "examples,coverage,fuzzing,stateful",
                    "--max-examples",
                    str(MAX_EXAMPLES),
                    "--exclude-path",
                    "/api/v1/shutdown",
                    "--workers",
                    "1",
                    "--request-timeout",
                    "30",
                ],
                env=env,
                cwd=state_dir,  # where it keeps its cache: not in the repository
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            output = result.stdout.decode() + result.stderr.decode()
            assert result.returncode == 0, output[-6000:]
            assert "No issues found" in output or " passed" in output, output[-3000:]
            # It did reach the daemon: every operation it selected was tested.
            selected = re.search(r"Selected: (\d+)/\d+\s+Tested: (\d+)", output)
            assert selected is not None, output[-3000:]
            assert selected[1] == selected[2], selected[0]
            assert int(selected[1]) >= 9, selected[0]
