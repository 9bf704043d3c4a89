"""Replica logs of LocalRuntime: one file per replica, named by its tag, size-capped and rotated.

The worker writes its own log (``capture_output``): whatever it prints goes to ``<tag>.log``,
which past `max_bytes` is moved to ``<tag>.log.1`` and started afresh, so a chatty replica holds
at most twice `max_bytes` on disk. The runtime reads the logs
(``read_log``) and keeps those of replicas that are gone, the newest `kept` of them, so that a
replica that failed can still be looked at (``prune_logs``).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._files import UnsafeFileError, open_regular
from .._ports.runtime import LogChunk

#: Past this size a log is rotated (the worker keeps one rotated file besides the current one).
DEFAULT_MAX_BYTES = 8 << 20
#: The most a single read returns: a tail of a huge line stays bounded too.
MAX_READ_BYTES = 1 << 20

_SUFFIX = ".log"


def log_file(logs_dir: Path, tag: str) -> Path:
    return logs_dir / f"{tag}{_SUFFIX}"


def _open_append(path: Path) -> int:
    # Never through a symlink, and private: logs may hold what the replica's code prints.
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)


class _Log:
    """One replica's log file, rotated past `max_bytes`; safe to write from any thread."""

    def __init__(self, path: Path, max_bytes: int):
        self._path = path
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._fd = _open_append(path)
        self._size = os.fstat(self._fd).st_size

    def write(self, data: bytes) -> int:
        with self._lock:
            if self._size and self._size + len(data) > self._max_bytes:
                os.close(self._fd)
                with contextlib.suppress(OSError):
                    os.replace(self._path, f"{self._path}.1")
                self._fd = _open_append(self._path)
                self._size = 0
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            self._size += len(data)
        return len(data)


class _Raw(io.RawIOBase):
    def __init__(self, log: _Log):
        self._log = log

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return self._log.write(bytes(data))


def capture_output(path: Path, max_bytes: int) -> None:
    """Send this process's output to `path`, rotated past `max_bytes`.

    What Python code prints is written before ``print`` returns, so a traceback written just
    before a reply is in the log when the reply arrives. What C code or child processes write
    on descriptors 1 and 2 goes through a pipe that a thread copies into the same log.
    """
    log = _Log(path, max_bytes)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 1)
    os.dup2(write_end, 2)
    os.close(write_end)
    threading.Thread(target=_copy, args=(read_end, log), name="log", daemon=True).start()
    sys.stdout = io.TextIOWrapper(
        _Raw(log), encoding="utf-8", errors="backslashreplace", write_through=True
    )
    sys.stderr = io.TextIOWrapper(
        _Raw(log), encoding="utf-8", errors="backslashreplace", write_through=True
    )


def _copy(read_end: int, log: _Log) -> None:
    while True:
        chunk = os.read(read_end, 65536)
        if not chunk:
            return  # every writer is gone: the process is ending
        log.write(chunk)


def read_log(
    path: Path, *, offset: int | None = None, tail: int = 100, max_bytes: int = MAX_READ_BYTES
) -> LogChunk | None:
    """The last `tail` lines of the log at `path` (its rotated part included), or, given an
    `offset` from an earlier read, what was written since; `max_bytes` at most. None if there
    is no such log. A symlink in the place of the log or its rotated part is refused
    (``UnsafeFileError``), never followed: it would serve whatever file it names."""
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            if offset is not None and 0 <= offset <= size:
                start = max(offset, size - max_bytes)
                f.seek(start)
                # Up to `size` only: what is written meanwhile comes with the next read.
                return LogChunk(f.read(size - start).decode(errors="replace"), size)
            # No offset, or the log was rotated since it was taken: from the end.
            f.seek(max(0, size - max_bytes))
            data = f.read(size - f.tell())
    except FileNotFoundError:
        return None
    if offset is None and data.count(b"\n") <= tail and len(data) < max_bytes:
        data = _rotated_tail(Path(f"{path}.1"), max_bytes - len(data)) + data
    lines = data.decode(errors="replace").splitlines(keepends=True)
    if offset is None:
        lines = lines[-tail:] if tail > 0 else []
    return LogChunk("".join(lines), size)


def _rotated_tail(path: Path, size: int) -> bytes:
    """The last `size` bytes of a rotated log; nothing if there is none (or it is unreadable)."""
    try:
        old = open_regular(path)
    except UnsafeFileError:
        raise
    except OSError:
        return b""
    with old:
        old.seek(0, os.SEEK_END)
        old.seek(max(0, old.tell() - size))
        return old.read()


def log_tags(logs_dir: Path, prefix: str = "") -> list[str]:
    """The tags that have a log in `logs_dir` (starting with `prefix`), oldest log first."""
    found: list[tuple[float, str]] = []
    with contextlib.suppress(FileNotFoundError), os.scandir(logs_dir) as entries:
        for entry in entries:
            name = entry.name
            if name.endswith(_SUFFIX) and name.startswith(prefix):
                with contextlib.suppress(FileNotFoundError):
                    found.append((entry.stat().st_mtime, name[: -len(_SUFFIX)]))
    return [tag for _, tag in sorted(found)]


def prune_logs(logs_dir: Path, is_live: Callable[[str], bool], kept: int) -> int:
    """Delete the logs of gone replicas (for which `is_live` is false) but the newest `kept`;
    return how many were deleted."""
    gone = [tag for tag in log_tags(logs_dir) if not is_live(tag)]
    doomed = gone[: max(0, len(gone) - kept)]
    for tag in doomed:
        path = log_file(logs_dir, tag)
        for victim in (path, Path(f"{path}.1")):
            with contextlib.suppress(FileNotFoundError):
                victim.unlink()
    return len(doomed)
