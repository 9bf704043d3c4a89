"""Where a standby's answer sends a client: read by the CLI and by a replica's route source,
both of which follow a 307 to the leader (light: the CLI imports it, and not trio)."""

from __future__ import annotations

from typing import Any


def leader_of(status: int, payload: Any) -> str | None:
    """The leader's API a standby's 307 names (``error.leader``), if it names one by URL."""
    error = payload.get("error") if status == 307 and isinstance(payload, dict) else None
    leader = error.get("leader") if isinstance(error, dict) else None
    if isinstance(leader, str) and leader.startswith("http://"):
        return leader.rstrip("/")
    return None
