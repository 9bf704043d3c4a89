"""The wire between LocalRuntime and its workers: one JSON object per line over a Unix socket."""

from __future__ import annotations

import json
from typing import Any

import trio

#: A line longer than this is a protocol error (user configs are small; this bounds memory).
MAX_LINE = 1 << 20


class WireError(Exception):
    """The peer closed the connection or sent something that is not a protocol line."""


class LineStream:
    """Newline-delimited JSON over a trio stream."""

    def __init__(self, stream: trio.abc.Stream):
        self.stream = stream
        self._buffer = bytearray()

    async def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        await self.stream.send_all(data)

    async def receive(self) -> dict[str, Any]:
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                try:
                    message = json.loads(line)
                except ValueError:
                    raise WireError(f"not JSON: {line[:80]!r}") from None
                if not isinstance(message, dict):
                    raise WireError(f"not a JSON object: {line[:80]!r}")
                return message
            if len(self._buffer) > MAX_LINE:
                raise WireError("line too long")
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise WireError("connection closed")
            self._buffer += chunk

    async def aclose(self) -> None:
        await self.stream.aclose()
