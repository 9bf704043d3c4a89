"""A backend's replica logs as the API serves them (``GET /api/v1/backends/{name}/logs``):
where they are read from, and the bounds of what one request reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from .._files import UnsafeFileError
from .._model.values.errors import UnknownBackendError
from .._model.views.status import BackendStatus
from .._ports.runtime import LogSource
from .http import HTTPError, int_param

MAX_LOG_LINES = 10_000


async def read_logs(
    logs: LogSource | None,
    status: Callable[[str], BackendStatus],
    name: str,
    query: dict[str, list[str]],
) -> dict[str, Any]:
    """The logs of a backend's replicas: its current ones and the kept logs of those gone
    (``?replica=TAG`` for one; ``tail`` lines each; with ``offset``, only what is new)."""
    if logs is None:
        raise HTTPError(
            501,
            "NoLogs",
            "this runtime keeps no replica logs the daemon can read",
        )
    tail = int_param(query, "tail", 100)
    offset = int_param(query, "offset", None)
    if not 0 <= tail <= MAX_LOG_LINES or (offset is not None and offset < 0):
        raise HTTPError(400, "BadQuery", f"tail must be in [0, {MAX_LOG_LINES}], offset >= 0")
    try:
        current = {r.tag: r.state.value for r in status(name).replicas}
        exists = True
    except UnknownBackendError:
        current, exists = {}, False
    # Directory listings and file reads: in a thread, never on the loop's.
    tags = await trio.to_thread.run_sync(logs.log_tags, name)
    wanted = query.get("replica", [None])[0]
    if wanted is not None:
        if wanted.rpartition("#")[0] != name or wanted not in tags:
            raise HTTPError(404, "NoSuchLog", f"no log of replica {wanted!r} in backend {name!r}")
        tags = [wanted]
    elif not tags and not current:
        raise HTTPError(404, "UnknownBackend", f"backend {name!r} has no replicas or logs")

    def read() -> list[dict[str, Any]]:
        out = []
        for tag in tags:
            try:
                chunk = logs.read_log(tag, offset=offset, tail=tail)
            except UnsafeFileError as exc:
                raise HTTPError(409, "LogRefused", f"the log of replica {tag}: {exc}") from None
            if chunk is not None:
                state = current.get(tag, "GONE")
                out.append(
                    {"replica": tag, "state": state, "text": chunk.text, "offset": chunk.offset}
                )
        return out

    return {"name": name, "exists": exists, "logs": await trio.to_thread.run_sync(read)}
