"""One slot of the daemon's ingress processes: how the daemon sees its process, and how it starts
one (on the listening socket of the process it replaces, if any) and records it for the next
daemon to adopt. What a process is started with and what makes it adoptable (`FleetOptions`)
are kept together, so that the two cannot drift apart."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import Literal, final

import attrs
import trio

from .._files import write_private
from .._procfs import describe_exit, start_time
from .ingress_records import (
    MODULE,
    Handle,
    Record,
    open_log,
    reap,
    take_listeners,
)
from .statedir import ORPHAN_TIMEOUT_S, StateDir

logger = logging.getLogger("controller.daemon")

#: How long a new process may take to serve (import, first answer of the watch).
START_TIMEOUT_S = 30.0

State = Literal["starting", "serving", "restarting", "stopping"]


@attrs.frozen
class FleetOptions:
    listen: str
    """``HOST:PORT``; port 0: any free one (chosen once, then kept by the processes)."""
    workers: int
    access_log: bool = False
    log_format: str = "human"
    orphan_timeout_s: float = ORPHAN_TIMEOUT_S
    """How long a process outlives its daemon (``ingress_process``)."""

    def digest(self) -> str:
        """What a process must have been started with to be adopted (its address aside)."""
        from .. import __version__

        what = json.dumps(
            [self.access_log, self.log_format, self.orphan_timeout_s, __version__, sys.executable]
        )
        return hashlib.sha256(what.encode()).hexdigest()[:16]


@final
@attrs.define(eq=False)
class Member:
    """One slot's process as the daemon sees it (written by that slot's supervisor alone)."""

    slot: int
    pid: int | None = None
    state: State = "starting"
    since: float = attrs.field(factory=time.time)
    """When it entered its state (wall clock)."""
    restarts: int = 0
    last_exit: str | None = None
    adopted: bool = False
    """It was started by an earlier daemon."""


@final
@attrs.frozen
class Launcher:
    """Starts the processes of one daemon's slots, and writes the record of each."""

    state: StateDir
    options: FleetOptions
    env: Mapping[str, str]
    digest: str
    """`options.digest()`, written in each record."""
    stopping: Callable[[], bool]
    """Whether the fleet is stopping: a process it starts then is told to stop at once (it
    would wait for routes from an API that is closing)."""

    async def spawn(
        self, member: Member, address: str, heir: Record | None, shared: int | None = None
    ) -> Handle | None:
        """A new process for `member`'s slot, serving `address` (on `heir`'s listening socket,
        taken over; else on the daemon's `shared` listening socket, if it holds one), once it
        serves; None if it ended first (its end in `member.last_exit`)."""
        options = self.options
        argv = [
            sys.executable,
            "-P",
            "-m",
            MODULE,
            "--state-dir",
            str(self.state),
            "--slot",
            str(member.slot),
            "--listen",
            address,
            "--log-format",
            options.log_format,
            "--orphan-timeout",
            f"{options.orphan_timeout_s:g}",
        ]
        if options.access_log:
            argv.append("--access-log")
        member.state, member.since = "starting", time.time()
        inherited = [] if heir is None else await take_listeners(self.state, heir)
        if not inherited and shared is not None:
            inherited = [os.dup(shared)]
        if heir is not None and inherited:
            logger.info(
                "ingress process %d takes over the listening socket of pid %d",
                member.slot,
                heir.pid,
            )
        for fd in inherited:
            argv += ["--listen-fd", str(fd)]
        log = open_log(self.state.ingress_log(member.slot))
        try:
            process = await trio.lowlevel.open_process(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,  # what it says before its own logging is set up (a failed import)
                env=self.env,
                start_new_session=True,  # not stopped by a Ctrl-C at the daemon's terminal
                close_fds=True,
                pass_fds=inherited,
            )
        finally:
            os.close(log)
            for fd in inherited:
                os.close(fd)
        member.pid = process.pid
        if self.stopping():
            process.send_signal(signal.SIGTERM)  # the stop did not see it: started meanwhile
        handle = Handle(process.pid, process=process)
        self.write_record(member, address)
        assert process.stdout is not None
        said = b""
        with trio.move_on_after(START_TIMEOUT_S):
            async for chunk in process.stdout:
                said += chunk
                if b"ready\n" in said:
                    break
        await process.stdout.aclose()
        if b"ready\n" in said:
            return handle
        if process.returncode is None and process.poll() is None:
            # Alive but not serving in time: it is stopped, and another tried.
            process.kill()
        member.last_exit = describe_exit(await reap(process)).removeprefix("worker process ")
        return None

    def write_record(self, member: Member, address: str) -> None:
        """What the next daemon needs to adopt `member`'s process (and to go on counting)."""
        if member.pid is None:
            return
        record = Record(
            member.slot,
            member.pid,
            start_time(member.pid) or "",
            address,
            self.digest,
            member.restarts,
        )
        write_private(self.state.ingress_record(member.slot), json.dumps(attrs.asdict(record)))
