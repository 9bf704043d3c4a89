"""A benchmark leaves no process behind, even when it crashes or is stopped midway
(``bench/reaper.py``): a benchmark starts what a daemon starts, workers in sessions of their
own whose parent is gone, and those outlive a run that fails."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import trio

BENCH = Path(__file__).parent.parent.parent / "bench"

# A "benchmark": it starts a process that starts a grandchild in a session of its own (as a
# daemon starts a worker) and is then killed -9, orphaning it, as a crashed daemon would. It
# prints the grandchild's pid and, once the test has seen it alive, fails or waits to be
# stopped, as told. It waits for the signal on a wakeup fd, not in time.sleep(): a SIGTERM that
# came just before the sleep began left it asleep for the whole 600 s (a Python handler runs
# between bytecodes, and the sleep's call was no longer interrupted): once in 30 runs beside
# two CPU hogs.
SCRIPT = """
import os, select, signal, subprocess, sys
sys.path.insert(0, {bench!r})
import reaper

reaper.leave_nothing()
woken, wake = os.pipe()
os.set_blocking(wake, False)
signal.set_wakeup_fd(wake)  # a signal writes a byte there, whenever it comes
middle = subprocess.Popen(
    [sys.executable, "-c",
     "import subprocess, sys, time; "
     "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
     "start_new_session=True); print(p.pid, flush=True); time.sleep(600)"],
    stdout=subprocess.PIPE,
)
orphan = int(middle.stdout.readline())
middle.kill()
middle.wait()
print(orphan, flush=True)
sys.stdin.readline()  # the test has seen the orphan alive
if sys.argv[1] == "crash":
    raise RuntimeError("the benchmark failed midway")
select.select([woken], [], [], 600)  # its handler runs next, and ends the script
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != b"Z"


@pytest.mark.parametrize("how", ["crash", "sigterm"])
async def test_a_benchmark_that_fails_or_is_stopped_leaves_no_process(how: str) -> None:
    code = SCRIPT.format(bench=str(BENCH))
    with trio.fail_after(30):
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", code, how], stdin=-1, stdout=-1, stderr=-1
        )
        assert process.stdin is not None
        assert process.stdout is not None
        assert process.stderr is not None
        got = b""
        while not got.endswith(b"\n"):
            chunk = await process.stdout.receive_some(100)
            assert chunk, "the script ended before it said its orphan's pid"
            got += chunk
        orphan = int(got)
        try:
            # Its parent is gone; it lives on, adopted by the benchmark, not by init.
            assert _alive(orphan)
            await process.stdin.send_all(b"go\n")
            if how == "sigterm":
                process.send_signal(signal.SIGTERM)
            status = await process.wait()
            err = await process.stderr.receive_some(65536)
            assert status != 0
            assert b"reaper: killed 1 process(es) left behind" in err, err
            assert not _alive(orphan)
        finally:
            if _alive(orphan):
                os.kill(orphan, signal.SIGKILL)
            if process.returncode is None:
                process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
                for pipe in (process.stdin, process.stdout, process.stderr):
                    await pipe.aclose()  # so that none outlives the test
