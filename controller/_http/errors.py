"""How an exchange ends other than with the replica's answer."""

from __future__ import annotations

from typing import Any


class ClientGone(Exception):
    """The client hung up (or stopped reading), or its answer was cut short: its connection is
    closed, and no answer of ours can be sent."""


class Reply(Exception):
    """Answer the client with this error (none of the replica's answer was sent yet)."""

    def __init__(self, status: int, kind: str, message: str, **extra: Any):
        super().__init__(message)
        self.status, self.kind, self.extra = status, kind, extra
