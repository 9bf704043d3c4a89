"""Where LocalRuntime keeps each replica's files in its directory, and their removal once the
worker is gone: one place for the names, which the runtime, the commands and the starts share.

Layout of the runtime directory, per replica (``<id>`` is a digest of its tag, to keep socket
paths short): ``<id>.spec.json`` (what the worker runs), ``<id>.sock`` (its socket),
``<id>.pid`` (a forked worker's pid) and ``logs/<tag>.log`` (its stdout and stderr, kept after it
is gone); ``zygote.log``, the fork server's stderr; and ``fence``, the highest epoch fenced
over the directory (see ``fence_file``, and Fencing in ``runtime``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Container
from pathlib import Path

import trio

from .._model.values.errors import ConfigError
from .logs import log_file, prune_logs

# sockaddr_un.sun_path is 108 bytes on Linux, including the final NUL.
_MAX_SOCKET_PATH = 107
LOGS = "logs"
ZYGOTE_LOG = "zygote.log"
#: Where workers' handles follow the routes: a daemon's API and its route token (``LocalRuntime
#: .publish_routes``); beside the specs, which name the runtime dir's replicas.
ROUTES = "routes.json"


def check_socket_room(runtime_dir: Path) -> None:
    """Refuse a `runtime_dir` too long for the sockets of its workers (``ConfigError``)."""
    longest = runtime_dir / ("0" * 16 + ".sock")
    if len(os.fsencode(longest)) > _MAX_SOCKET_PATH:
        raise ConfigError(
            "runtime_dir",
            f"is too long for Unix socket paths ({len(os.fsencode(longest))} > "
            f"{_MAX_SOCKET_PATH} bytes with a socket name); choose a shorter directory",
            str(runtime_dir),
        )


def replica_base(runtime_dir: Path, tag: str) -> Path:
    """The path of the files of `tag`, but their suffix."""
    return runtime_dir / hashlib.sha256(tag.encode()).hexdigest()[:16]


def socket_path(runtime_dir: Path, tag: str) -> str:
    return str(replica_base(runtime_dir, tag)) + ".sock"


def spec_path(runtime_dir: Path, tag: str) -> str:
    return str(replica_base(runtime_dir, tag)) + ".spec.json"


def pid_path(runtime_dir: Path, tag: str) -> str:
    return str(replica_base(runtime_dir, tag)) + ".pid"


def log_path(runtime_dir: Path, tag: str) -> Path:
    return log_file(runtime_dir / LOGS, tag)


async def remove_replica_files(
    runtime_dir: Path, tag: str, held: Container[str], logs_kept: int
) -> None:
    """Remove what a worker that is gone leaves behind, but its log: that is kept for people
    to read, and only the oldest beyond `logs_kept` are deleted (`held`: the tags of the
    workers the runtime holds, whose logs stay)."""
    base = str(replica_base(runtime_dir, tag))
    for suffix in (".sock", ".spec.json", ".pid"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(base + suffix)

    def is_live(other: str) -> bool:
        # A worker is alive exactly while its socket file is there.
        return other in held or os.path.exists(socket_path(runtime_dir, other))

    # One directory listing, bounded by the live workers and the kept logs; shielded, as a
    # kill's cleanup is.
    with trio.CancelScope(shield=True):
        await trio.to_thread.run_sync(prune_logs, runtime_dir / LOGS, is_live, logs_kept)
