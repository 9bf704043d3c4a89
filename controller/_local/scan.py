"""Which worker processes of a runtime directory are alive, as the OS says (``/proc``): what a
LocalRuntime lists and adopts. A worker whose pid file cannot be read is neither adopted nor
stopped, and said once (a transient fault, or one for a person to look at)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import final

from .._procfs import scan_workers
from .process import WORKER_MODULE
from .zygote import ZYGOTE_MODULE

logger = logging.getLogger("controller")


@final
class WorkerScan:
    """Scans `runtime_dir` for its workers (blocking: run it in a thread)."""

    def __init__(self, runtime_dir: Path, fork_server_pid: Callable[[], int | None]):
        self.runtime_dir = runtime_dir
        self._fork_server_pid = fork_server_pid
        self._told: set[int] = set()

    def __call__(self) -> dict[str, set[int]]:
        """The pids of each tag's live workers."""
        unreadable: dict[int, str] = {}
        found = scan_workers(self.runtime_dir, WORKER_MODULE, ZYGOTE_MODULE, unreadable)
        for pid, why in unreadable.items():
            if pid not in self._told:
                # Not adopted (its tag is unknown) and not stopped (it may be a transient fault,
                # and a stop on a guess could be an outage): said once, for a person to look.
                self._told.add(pid)
                logger.warning(
                    "worker pid %d of %s is neither adopted nor stopped: %s; stop it if it "
                    "should not run (kill %d)",
                    pid,
                    self.runtime_dir,
                    why,
                    pid,
                )
        # Our own fork server has a forked worker's command line: never take it for one (a pid
        # file naming it would have to be stale and its start time a match, but still).
        zygote = self._fork_server_pid()
        if zygote is not None:
            for pids in found.values():
                pids.discard(zygote)
        return {tag: pids for tag, pids in found.items() if pids}
