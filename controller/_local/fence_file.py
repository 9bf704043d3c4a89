"""A runtime directory's fence: the highest leader epoch fenced in it, in a file of its own,
read and raised under ``flock``. LocalRuntime refuses a start from a lower epoch with it (the
workers themselves check every other command)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

FENCE_FILE = "fence"


def raise_fence(runtime_dir: Path, epoch: int) -> None:
    """Raise the directory's fence to `epoch` (never lower it); blocking."""
    fd = os.open(
        runtime_dir / FENCE_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for a read and a write of a few bytes
        if _read_epoch(fd) < epoch:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(epoch).encode(), 0)
    finally:
        os.close(fd)


def fenced_at(runtime_dir: Path) -> int:
    """The highest epoch fenced in the directory (0 if none was); blocking."""
    try:
        fd = os.open(runtime_dir / FENCE_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        return _read_epoch(fd)
    finally:
        os.close(fd)


def _read_epoch(fd: int) -> int:
    text = os.pread(fd, 64, 0).strip()
    try:
        return max(0, int(text)) if text else 0
    except ValueError:
        return 0  # not ours; overwritten by the next fence
