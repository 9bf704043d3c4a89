"""One ingress process watched while it serves, by its supervisor in the fleet: killed when it
does not answer its health checks (and writes no fresh beat), or when `liveness` finds it
stopped or stuck; and given up on, its slot served anew, if it has not exited soon after its
SIGKILL (a frozen process dies only once thawed)."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import final

import trio

from .ingress_records import Handle, ask
from .ingress_slot import Member
from .liveness import STALE_AFTER_S, beat_age, until_dead_or_stuck
from .statedir import StateDir

logger = logging.getLogger("controller.daemon")

#: How often each process's health is asked, and after how many unanswered asks in a row (with
#: no fresh beat meanwhile) it is taken for hung and killed.
LIVENESS_PERIOD_S = 5.0
HUNG_AFTER = 3
#: How long after its SIGKILL a process's slot waits for it to exit before it is served anew.
KILLED_EXIT_S = 0.2


@final
class ProcessWatch:
    """The watch of `handle`, the process serving `member`'s slot."""

    def __init__(
        self, state: StateDir, member: Member, handle: Handle, stopping: Callable[[], bool]
    ):
        self.state = state
        self.member = member
        self.handle = handle
        self.killed: str | None = None
        """Why it was killed, if it was (``"... , and was killed"``)."""
        self._stopping = stopping
        self._beat = state.ingress_beat(member.slot, handle.pid)

    async def until_exit(self) -> tuple[bool, int | None]:
        """Wait for the process to exit, killing it if it hangs or is stuck: (whether it has
        gone, its wait status). Not gone: killed, and it did not exit."""
        gone, status = False, None  # unless it exits: `_kill` cancels the wait
        async with trio.open_nursery() as watch:
            scope = watch.cancel_scope
            watch.start_soon(self._until_hung, scope)
            watch.start_soon(self._until_stuck, scope)
            status = await self.handle.wait()
            gone = True
            scope.cancel()
        return gone, status

    async def _until_hung(self, scope: trio.CancelScope) -> None:
        """Ask the process for its health every `LIVENESS_PERIOD_S`; kill it once it has not
        answered `HUNG_AFTER` times in a row while it wrote no fresh beat."""
        missed = 0
        while True:
            await trio.sleep(LIVENESS_PERIOD_S)
            if self._stopping():
                return  # a process told to stop closes its socket: that is no hang
            # A fresh beat says its loop runs: an unanswered ask is a flood's delay, no hang.
            age = beat_age(self._beat)
            answered = (age is not None and age <= STALE_AFTER_S) or await ask(
                self.state, self.member.slot, self.handle.pid, "/-/healthz"
            ) is not None
            missed = 0 if answered else missed + 1
            if missed >= HUNG_AFTER:
                why = f"did not answer its health check {missed} times in a row"
                self._log(f"{why} (every {LIVENESS_PERIOD_S:g}s)")
                await self._kill(why, scope)
                return

    async def _until_stuck(self, scope: trio.CancelScope) -> None:
        """Kill the process once `liveness` finds it stopped or stuck: waiting for its health
        checks would leave its slot to its siblings for 15 s."""
        why = await until_dead_or_stuck(self.handle.pid, self._beat)
        self._log(why)
        await self._kill(why, scope)

    def _log(self, why: str) -> None:
        slot, pid = self.member.slot, self.handle.pid
        logger.warning("ingress process %d (pid %d) %s; killing it", slot, pid, why)

    async def _kill(self, why: str, scope: trio.CancelScope) -> None:
        """SIGKILL the process (once); if it has not exited `KILLED_EXIT_S` later, stop waiting
        for it (cancel `scope`): its slot is served anew."""
        if self.killed is not None:
            return
        self.killed = f"{why}, and was killed"
        self.member.state, self.member.since = "restarting", time.time()
        self.handle.signal(signal.SIGKILL)
        await trio.sleep(KILLED_EXIT_S)
        scope.cancel()
