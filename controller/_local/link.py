"""The runtime's end of a worker's monitor connection: its end is the worker's death, it carries
the replica's pushed load, and health checks go over it (see ``wire``): a check costs a short
write and a short read on a connection already open, not a connection of its own.

A check's request is written straight to the socket (it is non-blocking): no task, no lock, no
wait unless the socket's buffer is full, which only a worker that reads nothing for a long time
causes; what did not fit is then kept and written, in order, by the next check that waits for
room. Each check leaves a callable for its answer, which the reader (the task that watches the
connection) hands it: one check's caller parks until then (``check``); a wave of checks of many
workers (``check_wave``) parks once for all of them. A check given up (its timeout) is
forgotten, and its late answer dropped.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, final

import trio

from .._model.records.code_report import CodeReport, parse_code_report
from .._ports.arrivals import Arrivals
from .wire import MAX_LINE, LineStream, WireError, check_request, decode, parse_check_passed

#: Where a worker's own load goes (requests it holds, None: it says nothing), with the requests
#: it has answered (None: not known; code the worker serves says).
OnLoad = Callable[[int | None, int | None, CodeReport | None], None]

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
        self._waiting: dict[int, Callable[[Answer], None]] = {}
        """The checks asked and not answered: what each answer is handed to."""
        self._next = 0
        self._unsent = bytearray()
        self._writing = False
        stream = lines.stream
        if not isinstance(stream, trio.SocketStream):
            raise TypeError(f"a monitor connection is a socket, not {stream!r}")
        self.fd = stream.socket.fileno()
        # The socket is read here, not through the stream: one read per wake-up, which holds
        # every answer that came meanwhile.
        self._pending = bytearray(lines.take_buffered())

    def ask(self, epoch: int, on_answer: Callable[[Answer], None]) -> int | None:
        """Ask for one health check as the leader of `epoch`, without waiting: `on_answer` is
        handed what the worker answers (None: it passed), or `ENDED` if the connection ends
        first (at once, if it has). Its id, for ``forget``; if ``blocked`` then, someone must
        ``write`` for the request to go out."""
        if self.ended:
            on_answer(ENDED)
            return None
        ident = self._next
        self._next += 1
        # Listed before it is written: its answer may come while a full socket makes it wait.
        self._waiting[ident] = on_answer
        self._unsent += check_request(ident, epoch)
        if not self._writing:
            self._write_now()
        return ident

    @property
    def blocked(self) -> bool:
        """Requests are waiting for room in the socket, and no one is writing them."""
        return bool(self._unsent) and not self._writing

    def forget(self, ident: int) -> None:
        """The check `ident` is given up (its timeout): a late answer is dropped."""
        self._waiting.pop(ident, None)

    async def check(self, epoch: int) -> Answer:
        """Ask for one health check as the leader of `epoch`; what the worker answered (None:
        it passed), or `ENDED` if the connection ended before it did."""
        answers: Arrivals[Answer] = Arrivals()
        ident = self.ask(epoch, answers.put)
        try:
            if self.blocked:
                await self.write()
            else:
                await trio.lowlevel.checkpoint_if_cancelled()
            (answer,) = await answers.take()
            return answer
        finally:
            if ident is not None:
                self.forget(ident)

    def _write_now(self) -> None:
        """Write what the socket takes at once; the rest stays unsent."""
        try:
            sent = os.write(self.fd, self._unsent)
        except BlockingIOError:
            return
        except OSError:
            self._unsent.clear()  # the connection is broken: the reader sees its end, and wakes all
            return
        del self._unsent[:sent]

    async def write(self) -> None:
        """Write what is unsent as the socket makes room (checks asked meanwhile add to it)."""
        self._writing = True
        try:
            while self._unsent:
                await trio.lowlevel.wait_writable(self.fd)
                self._write_now()
        finally:
            self._writing = False

    async def read(self, on_load: OnLoad) -> None:
        """Read what the worker sends until the connection ends: answers wake their checks,
        loads go to `on_load`. Every check still waiting then is woken with `ENDED`. (A
        runtime holding many links reads them all with one task instead: ``LinkReader``.)"""
        try:
            if self.take(on_load, b""):
                while True:
                    await trio.lowlevel.wait_readable(self.fd)
                    if not self.pull(on_load):
                        break
        finally:
            await self.close()

    def pull(self, on_load: OnLoad) -> bool:
        """Read once what the socket holds (every answer that came since the last read) and
        take its lines; False once the connection has ended, or broken the protocol."""
        try:
            chunk = os.read(self.fd, 65536)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return bool(chunk) and self.take(on_load, chunk)  # no bytes: the worker's end

    def take(self, on_load: OnLoad, chunk: bytes) -> bool:
        """Take the whole lines of what was read so far with `chunk`; False if one breaks the
        protocol (the worker lives on; its checks fail from now on, and say why)."""
        pending = self._pending
        lines = (bytes(pending) + chunk if pending else chunk).split(b"\n")
        pending[:] = lines.pop()  # what follows the last newline: a line still coming
        try:
            for line in lines:
                self._received(line, on_load)
            if len(pending) > MAX_LINE:
                raise WireError("line too long")
        except WireError as exc:
            self.why = f"its worker broke the protocol of its monitor connection: {exc}"
            return False
        return True

    async def close(self) -> None:
        """End it (see ``end``) and close the socket."""
        self.end()
        with trio.CancelScope(shield=True):
            await self.lines.aclose()

    def _received(self, line: bytes, on_load: OnLoad) -> None:
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
            served = message.get("served")
            whole = isinstance(served, int) and not isinstance(served, bool)
            on_load(load, served if whole else None, parse_code_report(message))

    def end(self) -> None:
        """The connection is over (or let go): every check waiting is woken with `ENDED`."""
        self.ended = True
        for ident in list(self._waiting):
            self._wake(ident, ENDED)

    def _wake(self, ident: int, answer: Answer) -> None:
        on_answer = self._waiting.pop(ident, None)
        if on_answer is not None:  # else it timed out, and was forgotten
            on_answer(answer)
