"""The wire between LocalRuntime and its workers: one JSON object per line over a Unix socket.

On the monitor connection, health checks go as short lines instead (a check is the commonest
thing a backend at rest does): the runtime asks ``?<id> <epoch>``, the worker answers ``+<id>``
if it passed, or a JSON object with ``check: <id>`` and the refusal or the user's error. The
replica's load is pushed as JSON on the same connection. A worker that answers checks there says
so in its ``hello`` (`MONITOR_CHECKS`); one started by an older version does not, and is checked
with a command on a connection of its own.
"""

from __future__ import annotations

import json
from typing import Any

import trio

#: A line longer than this is a protocol error (user configs are small; this bounds memory).
MAX_LINE = 1 << 20
#: The field of a worker's ``hello`` that says its monitor connection answers health checks.
MONITOR_CHECKS = "monitor_checks"


#: The most digits an id or an epoch has on the wire (both are below 2**63): a longer number is
#: not a protocol line, and never reaches ``int``, which refuses past 4,300 digits.
_MAX_DIGITS = 19


def _number(digits: bytes) -> int | None:
    return int(digits) if digits.isdigit() and len(digits) <= _MAX_DIGITS else None


def check_request(ident: int, epoch: int) -> bytes:
    """The line that asks for check `ident` as the leader of `epoch`."""
    return b"?%d %d\n" % (ident, epoch)


def parse_check_request(line: bytes) -> tuple[int, int] | None:
    """(id, epoch) of a check request line (without its newline), or None if it is not one."""
    if line[:1] != b"?":
        return None
    ident, _, epoch = line[1:].partition(b" ")
    number, at = _number(ident), _number(epoch)
    if number is None or at is None:
        return None
    return number, at


def check_passed(ident: int) -> bytes:
    """The line that says check `ident` passed."""
    return b"+%d\n" % ident


def parse_check_passed(line: bytes) -> int | None:
    """The id of a passed check's line, or None if it is not one."""
    if line[:1] != b"+":
        return None
    return _number(line[1:])


class WireError(Exception):
    """The peer closed the connection or sent something that is not a protocol line."""


class LineStream:
    """Newline-delimited JSON over a trio stream."""

    def __init__(self, stream: trio.abc.Stream):
        self.stream = stream
        self._buffer = bytearray()

    async def send(self, message: dict[str, Any]) -> None:
        await self.stream.send_all(encode(message))

    async def send_line(self, line: bytes) -> None:
        """Send `line` as it is (it ends with a newline)."""
        await self.stream.send_all(line)

    async def receive(self) -> dict[str, Any]:
        return decode(await self.receive_line())

    async def receive_line(self) -> bytes:
        """The next line, without its newline."""
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                return line
            if len(self._buffer) > MAX_LINE:
                raise WireError("line too long")
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise WireError("connection closed")
            self._buffer += chunk

    def take_buffered(self) -> bytes:
        """What was received and not read yet (for a reader that reads the socket itself)."""
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    async def aclose(self) -> None:
        await self.stream.aclose()


def encode(message: dict[str, Any]) -> bytes:
    """`message` as a line."""
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """The JSON object of `line` (``WireError`` if it is none)."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python recurses
        raise WireError(f"not JSON: {line[:80]!r}") from None
    if not isinstance(message, dict):
        raise WireError(f"not a JSON object: {line[:80]!r}")
    return message
