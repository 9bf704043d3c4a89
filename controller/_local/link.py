"""The runtime's end of a worker's monitor connection: its end is the worker's death, it carries
the replica's pushed load, and health checks go over it (see ``wire``): a check costs a short
write and a short read on a connection already open, not a connection of its own.

A check's request is written straight to the socket (it is non-blocking): no task, no lock, no
wait unless the socket's buffer is full, which only a worker that reads nothing for a long time
causes; what did not fit is then kept and written, in order, by the next check that waits for
room. Each check waits for its answer parked (``wait_task_rescheduled``), and the reader (the
task that watches the connection) wakes it with the answer; a check cancelled (its timeout) is
forgotten, and its late answer dropped.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, final

import outcome
import trio

from .wire import MAX_LINE, LineStream, WireError, check_request, decode, parse_check_passed

#: What a check's waiter is woken with: None if it passed, else the worker's refusal (a reply
#: as ``commands.command`` reads one); `ENDED` if the connection ended first.
Answer = dict[str, Any] | None
ENDED: dict[str, Any] = {"ok": False, "ended": True}


@final
class MonitorLink:
    """A worker's monitor connection, `lines`, as the runtime holds it. `checks`: whether the
    worker answers health checks on it (its ``hello`` says so; one started by an older version
    does not, and is checked over a connection of its own)."""

    def __init__(self, tag: str, lines: LineStream, *, checks: bool):
        self.tag = tag
        self.lines = lines
        self.checks = checks
        self.ended = False
        """The connection has ended: the worker has, or is ending."""
        self.why = "its monitor connection ended"
        """Why it ended, as a failed check says."""
        self._waiting: dict[int, trio.lowlevel.Task | None] = {}
        """The checks asked and not answered: each its parked task, or None until it parks."""
        self._early: dict[int, Answer] = {}
        """Answers that came before their check parked."""
        self._next = 0
        self._unsent = bytearray()
        self._writing = False
        stream = lines.stream
        if not isinstance(stream, trio.SocketStream):
            raise TypeError(f"a monitor connection is a socket, not {stream!r}")
        self._fd = stream.socket.fileno()

    async def check(self, epoch: int) -> Answer:
        """Ask for one health check as the leader of `epoch`; what the worker answered (None:
        it passed), or `ENDED` if the connection ended before it did."""
        if self.ended:
            return ENDED
        ident = self._next
        self._next += 1
        # Listed before it is written: its answer may come while a full socket makes it wait.
        self._waiting[ident] = None
        try:
            self._unsent += check_request(ident, epoch)
            if not self._writing:
                await self._write()
            else:
                await trio.lowlevel.checkpoint_if_cancelled()
            if ident in self._early:
                return self._early.pop(ident)
            self._waiting[ident] = trio.lowlevel.current_task()

            def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
                self._waiting.pop(ident, None)
                return trio.lowlevel.Abort.SUCCEEDED

            answer: Answer = await trio.lowlevel.wait_task_rescheduled(abort)
            return answer
        finally:
            self._waiting.pop(ident, None)
            self._early.pop(ident, None)

    async def _write(self) -> None:
        """Write what is unsent: at once if the socket takes it (the common case, which does not
        yield), else as it makes room (other checks add to it meanwhile)."""
        self._writing = True
        try:
            while self._unsent:
                try:
                    sent = os.write(self._fd, self._unsent)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    self._unsent.clear()
                    return  # the connection is broken: the reader sees its end, and wakes all
                del self._unsent[:sent]
                if self._unsent:
                    await trio.lowlevel.wait_writable(self._fd)
        finally:
            self._writing = False

    async def read(self, on_load: Callable[[int | None], None]) -> None:
        """Read what the worker sends until the connection ends: answers wake their checks,
        loads go to `on_load`. Every check still waiting then is woken with `ENDED`."""
        # The socket is read here, not through the stream: a wait and one read per wake-up,
        # which holds every answer that came meanwhile.
        pending = bytearray(self.lines.take_buffered())
        try:
            while True:
                end = pending.find(b"\n")
                while end >= 0:
                    self._received(bytes(pending[:end]), on_load)
                    del pending[: end + 1]
                    end = pending.find(b"\n")
                if len(pending) > MAX_LINE:
                    raise WireError("line too long")
                await trio.lowlevel.wait_readable(self._fd)
                try:
                    chunk = os.read(self._fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    return
                if not chunk:
                    return  # the worker's end
                pending += chunk
        except WireError as exc:
            # The worker lives on; its checks fail from now on, and say why.
            self.why = f"its worker broke the protocol of its monitor connection: {exc}"
        finally:
            self.end()
            with trio.CancelScope(shield=True):
                await self.lines.aclose()

    def _received(self, line: bytes, on_load: Callable[[int | None], None]) -> None:
        ident = parse_check_passed(line)
        if ident is not None:
            self._wake(ident, None)
            return
        message = decode(line)
        asked = message.get("check")
        if isinstance(asked, int) and not isinstance(asked, bool):
            self._wake(asked, message)
            return
        load = message.get("load")
        if load is None or (isinstance(load, int) and not isinstance(load, bool)):
            on_load(load)

    def end(self) -> None:
        """The connection is over (or let go): every check waiting is woken with `ENDED`."""
        self.ended = True
        for ident in list(self._waiting):
            self._wake(ident, ENDED)

    def _wake(self, ident: int, answer: Answer) -> None:
        if ident not in self._waiting:
            return  # it timed out, and was forgotten
        task = self._waiting.pop(ident)
        if task is None:
            self._early[ident] = answer
        else:
            trio.lowlevel.reschedule(task, outcome.Value(answer))
