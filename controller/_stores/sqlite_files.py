"""The files of a SQLite database in WAL mode, checked before SQLite is let at them.

SQLite keeps, beside ``X``, a write-ahead log ``X-wal`` and (unless one connection holds the file
alone) the WAL's index ``X-shm``, which every connection maps into its memory. SQLite's own
errors for those files name none of them ("attempt to write a readonly database"), and a fault
of the mapped ``-shm`` (truncated by someone, a disk error under it) is not an error at all but
SIGBUS, which kills the process without a word. So: each file is checked, by name, before the
connection opens; and while it is open, the ``-shm`` is checked before each use, so that one
truncated, replaced, deleted or made immutable (``chattr +i``: a write to its mapped pages then
faults too) under us is refused rather than touched.
"""

from __future__ import annotations

import ctypes
import os
import sqlite3
import stat
from typing import final

import attrs

#: statx(2), for a file's attributes without opening it (closing a descriptor of a file drops
#: every lock SQLite holds on it in this process). Absent (not Linux, an old libc): None.
_STATX = getattr(ctypes.CDLL(None, use_errno=True), "statx", None)
_AT_FDCWD = -100
_AT_SYMLINK_NOFOLLOW = 0x100
_STATX_ATTRIBUTES_AT = 8  # struct statx: u32 mask, u32 blksize, u64 attributes
#: Attributes under which a file cannot be written, nor its mapped pages (they fault).
_STATX_ATTR_IMMUTABLE = 0x10
_STATX_ATTR_APPEND = 0x20


def frozen(path: str) -> str | None:
    """What makes `path` unwritable whoever writes it, if anything (``immutable``, or
    ``append-only``: ``chattr``'s ``i`` and ``a``); None if neither, or if it cannot be told."""
    if _STATX is None:
        return None
    buf = ctypes.create_string_buffer(256)
    if _STATX(_AT_FDCWD, os.fsencode(path), _AT_SYMLINK_NOFOLLOW, 0, buf) != 0:
        return None
    attributes = int.from_bytes(buf.raw[_STATX_ATTRIBUTES_AT : _STATX_ATTRIBUTES_AT + 8], "little")
    if attributes & _STATX_ATTR_IMMUTABLE:
        return "immutable"
    if attributes & _STATX_ATTR_APPEND:
        return "append-only"
    return None


def check_files(path: str, *, shm: bool) -> None:
    """Raise ``sqlite3.OperationalError`` naming the first of `path`'s directory, the database,
    its ``-wal`` and (with `shm`) its ``-shm`` that this process cannot write, or that is not
    what SQLite would take it for. Touches nothing: no file is opened, so no lock SQLite holds on
    one elsewhere in the process is dropped (closing any descriptor of a file drops them all)."""
    directory = os.path.dirname(path) or "."
    name = os.path.basename(path)
    made_here = f"{name}-wal and {name}-shm" if shm else f"{name}-wal"
    if not _writable(directory):
        why, remedy = _refusal(directory)
        raise sqlite3.OperationalError(
            f"the directory {directory} cannot be written ({why}): SQLite creates {made_here} "
            f"there as it writes; {remedy}"
        )
    for suffix in ("", "-wal", "-shm") if shm else ("", "-wal"):
        file = path + suffix
        try:
            info = os.lstat(file)
        except FileNotFoundError:
            continue
        if suffix and stat.S_ISLNK(info.st_mode):
            raise sqlite3.OperationalError(
                f"{file} is a symlink: SQLite would write its {suffix[1:]} file wherever it "
                "points; remove the link (with no process using the store)"
            )
        if not stat.S_ISREG(os.stat(file).st_mode):
            raise sqlite3.OperationalError(
                f"{file} is not a regular file ({stat.filemode(info.st_mode)}); move it away"
            )
        if not _writable(file):
            why, remedy = _refusal(file)
            raise sqlite3.OperationalError(
                f"{file} cannot be written ({why}): SQLite {_USES[suffix]}; {remedy}"
            )


_USES = {
    "": "writes the database at each checkpoint",
    "-wal": "writes its write-ahead log at every commit",
    "-shm": "maps the log's index into memory and writes it at every transaction",
}


def _writable(path: str) -> bool:
    mode = os.R_OK | os.W_OK | (os.X_OK if os.path.isdir(path) else 0)
    if os.access in os.supports_effective_ids:
        return os.access(path, mode, effective_ids=True)
    return os.access(path, mode)


def _refusal(path: str) -> tuple[str, str]:
    """Why `path` cannot be written, and what to do about it."""
    attribute = frozen(path)
    if attribute is not None:
        return f"it is {attribute}", f"make it writable (`chattr -{attribute[0]} {path}`)"
    try:
        read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        return "its file system is mounted read-only", (
            "mount it read-write, or put the store elsewhere"
        )
    return f"by this user, uid {os.geteuid()}", (
        "give this user read and write access, or put the store elsewhere"
    )


@final
@attrs.define
class ShmGuard:
    """The ``-shm`` file as this connection mapped it: the same file (inode), at least as long.

    A file cut shorter than the part SQLite mapped faults (SIGBUS) at the next touch of the lost
    pages. Checked before each use, that becomes an error; a cut between the check and the use
    (a few microseconds of each transaction) still faults, and `faulthandler` in the daemon at
    least logs it."""

    path: str
    """The database's path; the guard watches ``path + "-shm"``."""
    _inode: int | None = None
    _size: int = 0

    def reset(self) -> None:
        """A new connection: nothing known of the file yet."""
        self._inode, self._size = None, 0

    def seen(self) -> None:
        """After a use: remember the file as SQLite left it (it may have grown)."""
        try:
            info = os.stat(self.path + "-shm")
        except FileNotFoundError:
            return
        self._inode, self._size = info.st_ino, info.st_size

    def check(self) -> None:
        """Before a use: raise ``sqlite3.OperationalError`` if the file is not as last seen."""
        if self._inode is None:
            return
        try:
            info = os.stat(self.path + "-shm")
        except FileNotFoundError:
            info = None
        attribute = None if info is None else frozen(self.path + "-shm")
        if (
            info is not None
            and info.st_ino == self._inode
            and info.st_size >= self._size
            and attribute is None
        ):
            return
        if attribute is not None:
            raise sqlite3.OperationalError(
                f"{self.path}-shm, the index of the write-ahead log that SQLite maps into "
                f"memory, was made {attribute} while in use: a write to it would crash the "
                "process (SIGBUS), so nothing was read or written. Make it writable again "
                f"(`chattr -{attribute[0]} {self.path}-shm`)"
            )
        if info is None:
            what = "deleted"
        elif info.st_ino != self._inode:
            what = "replaced"
        else:
            what = f"truncated (from {self._size} to {info.st_size} bytes)"
        raise sqlite3.OperationalError(
            f"{self.path}-shm, the index of the write-ahead log that SQLite maps into memory, "
            f"was {what} while in use: touching it could crash the process (SIGBUS), so "
            "nothing was read or written. "
            "Stop every process using the store, then start them again"
        )

    def mend(self) -> None:
        """Before the connection closes: give a ``-shm`` cut shorter than SQLite mapped its
        length back (zeros), since the close touches it (a checkpoint) and would fault. SQLite
        then finds the index blank and rebuilds it from the ``-wal``, as after a crash.

        Through an ``O_PATH`` descriptor, which neither follows a symlink planted meanwhile nor,
        once closed, drops the locks SQLite holds on the file (as closing any other would)."""
        if self._inode is None or not hasattr(os, "O_PATH"):
            return
        try:
            fd = os.open(self.path + "-shm", os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return  # gone: the mapping is of a deleted file, which stays whole
        try:
            info = os.fstat(fd)
            if info.st_ino == self._inode and info.st_size < self._size:
                os.truncate(f"/proc/self/fd/{fd}", self._size)
        except OSError:
            pass  # nothing better to do: the close may fault, and faulthandler says so
        finally:
            os.close(fd)
