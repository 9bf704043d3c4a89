"""How the daemon and the ingress log: one line per record, for people or as JSON; to a
terminal, or to a private log file rotated by size."""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import io
import json
import logging
import logging.handlers
import os
import stat
import sys
from pathlib import Path
from typing import Any

from .._model.values.text import one_line


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)  # an access log line's fields, each its own key
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class HumanFormatter(logging.Formatter):
    """One line a record: what a record quotes of a replica (its error, a path it asked for)
    has its control characters and newlines escaped, so that it can neither drive the terminal
    of whoever reads the log nor forge a line of its own. A traceback below stays as it is."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return one_line(super().formatMessage(record))


def formatter(fmt: str) -> logging.Formatter:
    """``human``: a line for people; ``json``: a JSON object a line (its text escaped by
    JSON, non-ASCII included)."""
    if fmt == "json":
        return JSONFormatter()
    return HumanFormatter("%(asctime)s %(levelname)-7s %(message)s")


def setup_logging(fmt: str, handler: logging.Handler | None = None) -> None:
    """Log at INFO to `handler` (stderr by default) in the format `fmt`."""
    handler = handler if handler is not None else logging.StreamHandler()
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def private_log(
    path: Path, max_bytes: int, backups: int, *, fatal_errors: bool = False
) -> logging.Handler:
    """A handler writing to `path`, rotated past `max_bytes` with `backups` old files kept;
    every one of them 0600 and never opened through a symlink. With `fatal_errors`, a fatal
    signal (SIGBUS, SIGSEGV, SIGABRT...) writes the threads' tracebacks there too (through
    `faulthandler`), until the handler is closed (then to stderr)."""
    for n in range(1, backups + 1):
        _make_private(Path(f"{path}.{n}"))
    return _PrivateRotatingFileHandler(
        path, maxBytes=max_bytes, backupCount=backups, fatal_errors=fatal_errors
    )


def _make_private(path: Path) -> None:
    """Mode 0600 for an existing file, not through a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


class _PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A rotating log file that is 0600 and never opened through a symlink."""

    def __init__(self, *args: Any, fatal_errors: bool = False, **kwargs: Any):
        # Set first: the base class opens the file in its constructor.
        self._fatal_errors = fatal_errors
        super().__init__(*args, **kwargs)

    def _open(self) -> io.TextIOWrapper:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        # Without blocking, then checked: a FIFO put in its place would hold the start (with
        # the state dir's lock) until someone read it; one without a reader fails at once.
        try:
            fd = os.open(self.baseFilename, flags | os.O_NONBLOCK, 0o600)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # what a FIFO without a reader answers
                raise
            raise OSError(errno.EINVAL, "not a regular file", self.baseFilename) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file", self.baseFilename)
        os.set_blocking(fd, True)
        os.fchmod(fd, 0o600)  # one left by an older daemon may be readable by others
        stream = os.fdopen(fd, "a", encoding="utf-8")
        if self._fatal_errors:
            # Again at each rotation: faulthandler holds a descriptor, not a name.
            faulthandler.enable(stream)
        return stream

    def close(self) -> None:
        if self._fatal_errors and self.stream is not None:
            self._fatal_errors = False
            # Not to a closed file, whose descriptor number may be reused by then.
            with contextlib.suppress(ValueError, AttributeError, RuntimeError):
                faulthandler.enable(sys.stderr)
        super().close()
