"""Private files and directories: what the daemon and LocalRuntime keep on disk.

A directory that another user can write into is a place where they can plant a symlink named
like one of our files, so that we overwrite whatever it points to (as root, anything). So the
directories are checked (ours, writable by no one else), and files are never written through a
symlink: each is written to a new temporary file and renamed over the old name, which replaces a
symlink rather than following it. Nor are they read through one (``open_regular``): a link
planted where the daemon reads its token would make any file its token, and one in the place of
a replica's log would serve any file the daemon can read to whoever holds the token.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path
from typing import BinaryIO

from ._model.values.errors import ConfigError


def private_dir(path: Path, what: str, *, create: bool = True) -> None:
    """Create `path` (mode 0700) if missing and `create`; refuse it if another user owns it or
    may write in it, or if it is a symlink of another user's. `what` names it in the error (a
    parameter or an option)."""
    if create:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    link = path.lstat()
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (os.geteuid(), 0):
        raise ConfigError(
            what,
            f"is a symlink of another user's (uid {link.st_uid}), who could point it anywhere; "
            "use a directory of your own",
            str(path),
        )
    info = path.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(what, "is not a directory", str(path))
    if info.st_uid != os.geteuid():
        raise ConfigError(
            what,
            f"is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()}); "
            "use a directory of your own",
            str(path),
        )
    if info.st_mode & 0o022:
        raise ConfigError(
            what,
            f"may be written by other users (mode {stat.filemode(info.st_mode)}), who could "
            f"plant links to files of yours there; run `chmod go-w {path}` or use another "
            "directory",
            str(path),
        )


def write_private(path: Path, text: str) -> None:
    """Replace `path` with `text`, atomically, readable by this user only (0600); a symlink at
    `path` is replaced, never followed."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def create_private(path: Path) -> None:
    """Make sure `path` is a regular file of ours with mode 0600 (creating it empty), without
    following a symlink: for files that others then open by name (a SQLite database)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(str(path), "must be a regular file", stat.filemode(info.st_mode))
        if info.st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


class UnsafeFileError(OSError):
    """A file refused before a byte of it was read: a symlink, or not a regular file."""

    def __init__(self, path: str | os.PathLike[str], rule: str, code: int = errno.ELOOP):
        super().__init__(code, rule, os.fspath(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open `path` to read, never through a symlink, and only if it is a regular file (a FIFO
    would hang the reader, a device might never end). Raises ``UnsafeFileError`` for those,
    ``FileNotFoundError`` (and the like) as ``open`` would."""
    # O_NONBLOCK: opening a FIFO would wait for a writer; it changes nothing for a regular file.
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            raise UnsafeFileError(
                path,
                "is a symlink, which is not followed: the daemon reads the files of its state "
                "dir only as themselves, since a link could point at any file; remove it",
            ) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeFileError(
                path, f"is not a regular file ({stat.filemode(mode)}); remove it", errno.EINVAL
            )
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], *, limit: int = 1 << 20) -> bytes:
    """The bytes of `path`, opened by ``open_regular``; ``UnsafeFileError`` past `limit`."""
    with open_regular(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UnsafeFileError(path, f"is larger than {limit} bytes", errno.EFBIG)
    return data
