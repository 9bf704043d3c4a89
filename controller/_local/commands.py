"""LocalRuntime's commands to a worker over its socket: each carries the runtime's epoch, and the
worker's refusal comes back raised, so that every caller meets fencing and failures alike.

The worker, which remembers the highest epoch that has commanded it, refuses a command from a
lower epoch (see ``worker``): that refusal is raised as ``FencedError``, a failure of the
replica's own code as ``ReplicaError``, and a worker that no longer answers as
``ReplicaGoneError``.
"""

from __future__ import annotations

import contextlib
import errno
from pathlib import Path
from typing import Any

import trio

from .._model.values.errors import FencedError, ReplicaError, ReplicaGoneError
from .layout import log_path, socket_path
from .logs import read_log
from .wire import LineStream, WireError

#: How much longer than our own SIGTERM-then-SIGKILL a worker that accepted a stop waits before
#: ending itself (should this runtime vanish in between).
_STOP_MARGIN_S = 5.0
#: What a request is called in a FencedError.
_WHAT = {
    "hello": "adoption",
    "wait_ready": "start",
    "reconfigure": "reconfigure",
    "check_health": "health check",
    "drain": "drain",
    "stop": "kill",
}


async def connect(runtime_dir: Path, tag: str) -> LineStream:
    """A connection to the socket of the worker of `tag` (``ReplicaGoneError`` if nothing
    listens there)."""
    try:
        stream = await trio.open_unix_socket(socket_path(runtime_dir, tag))
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            raise ReplicaGoneError(
                tag, "its worker's socket does not answer (the worker is not running)"
            ) from None
        raise
    return LineStream(stream)


async def command(
    runtime_dir: Path, tag: str, epoch: int, request: dict[str, Any]
) -> dict[str, Any]:
    """Send `request` (with `epoch`) to the worker of `tag` and return its reply; raise
    ``FencedError`` if the worker refuses our epoch, ``ReplicaError`` if it fails."""
    lines = await connect(runtime_dir, tag)
    try:
        await lines.send({**request, "epoch": epoch})
        reply = await lines.receive()
    except (WireError, trio.BrokenResourceError) as exc:
        raise await died(runtime_dir, tag, exc) from None
    finally:
        with trio.CancelScope(shield=True):
            await lines.aclose()
    if not reply.get("ok"):
        raise refused(tag, epoch, str(request.get("op")), reply)
    return reply


def refused(tag: str, epoch: int, op: str, reply: dict[str, Any]) -> ReplicaError | FencedError:
    """What a worker's refusal of `op` (a reply that is not ok) raises."""
    if reply.get("fenced") is True:
        newer = reply.get("epoch")
        return FencedError(
            f"{_WHAT.get(op, op)} of replica {tag}",
            epoch,
            newer if isinstance(newer, int) and not isinstance(newer, bool) else None,
        )
    if reply.get("error_type") == "WorkerStopping":
        return ReplicaGoneError(tag, "its worker accepted a stop and is ending")
    traceback = reply.get("traceback")
    return ReplicaError(
        tag,
        str(reply.get("error_type")),
        str(reply.get("message")),
        traceback if isinstance(traceback, str) else None,
    )


async def died(runtime_dir: Path, tag: str, why: object) -> ReplicaError:
    """The error of a request whose connection ended before its answer: the worker died (its
    log's last line says how, often)."""
    tail = await trio.to_thread.run_sync(_log_tail, runtime_dir, tag)
    return ReplicaError(tag, "WorkerDied", f"{why}{tail}")


async def ask_to_stop(runtime_dir: Path, tag: str, epoch: int, term_timeout_s: float) -> None:
    """Have the worker of `tag` accept a stop from `epoch`; raise ``FencedError`` if it
    refuses. Returns too if it cannot say: its socket does not answer, it fails, or it has
    not replied within `term_timeout_s` (a hung or stopped worker, which is then signalled:
    it can check nothing), or it already accepted a stop, or it predates ``stop``."""
    with trio.move_on_after(term_timeout_s):
        # FencedError is neither; OSError: a socket that takes no more connections.
        with contextlib.suppress(ReplicaError, OSError):
            await command(
                runtime_dir,
                tag,
                epoch,
                {"op": "stop", "grace_s": 2 * term_timeout_s + _STOP_MARGIN_S},
            )


def _log_tail(runtime_dir: Path, tag: str) -> str:
    last = log_tail(runtime_dir, tag)
    return f"; its log ends: {last}" if last else ""


def log_tail(runtime_dir: Path, tag: str, lines: int = 1) -> str:
    """The last `lines` lines of the replica's log ("" if none). Blocking (a file read): run
    in a thread. Only the end of the log is read."""
    chunk = read_log(log_path(runtime_dir, tag), tail=lines, max_bytes=4096 * lines)
    return chunk.text.strip() if chunk is not None else ""
