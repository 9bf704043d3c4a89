"""The daemon's state dir: where it is, what is in it, and the lock that makes it one daemon's.

Light on imports: the CLI reads the paths (to find the daemon and its token) without trio.

- the directory itself is locked (``flock`` on it) by the daemon for its whole life, so that a
  second daemon on it is refused before it writes anything; deleting a file cannot undo that.
  ``lock`` names the holder's pid, for that refusal.
- ``token``, ``daemon.json`` (the API's address, pid and epoch): written atomically, 0600.
- ``controller.db``: the SQLite store, 0600, and SQLite's ``-wal`` beside it (and its ``-shm``
  when daemons share the store). ``w/``: LocalRuntime's workers and their logs.
- ``daemon.log``: the daemon's own log, rotated.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

from .._files import UnsafeFileError, private_dir, read_regular, write_private
from .._model.errors import ConfigError, StartupError

STATE_DIR_ENV = "CONTROLLER_STATE_DIR"
TOKEN_ENV = "CONTROLLER_TOKEN"

logger = logging.getLogger("controller")


def default_state_dir() -> Path:
    env = os.environ.get(STATE_DIR_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "trio-controller"


def token_path(state_dir: Path) -> Path:
    return state_dir / "token"


def address_path(state_dir: Path) -> Path:
    return state_dir / "daemon.json"


def lock_path(state_dir: Path) -> Path:
    return state_dir / "lock"


def log_path(state_dir: Path) -> Path:
    return state_dir / "daemon.log"


def read_address(state_dir: Path) -> dict[str, object]:
    """What ``daemon.json`` says (``url``, ``pid``, ``epoch``), or nothing."""
    try:
        data = json.loads(read_regular(address_path(state_dir)))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def check_private(state_dir: Path, *, create: bool, what: str = "state dir") -> None:
    """Refuse (``StartupError``) a state dir (or `what` else) that another user owns or may
    write in, or one reached through another user's symlink: its files (the token, the
    address) are not to be trusted, nor written. With `create`, make it (0700) if missing."""
    try:
        if create or state_dir.exists():
            private_dir(state_dir, f"--{what.replace(' ', '-')}", create=create)
    except ConfigError as exc:
        raise StartupError(f"{what} {state_dir}: {exc.rule}") from None
    except OSError as exc:
        raise StartupError(f"cannot use {what} {state_dir}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def locked(state_dir: Path) -> Iterator[Path]:
    """Check that `state_dir` is private (creating it), and hold its lock until exit.

    Raises ``StartupError`` if it is unsafe or another daemon holds it, naming that daemon."""
    check_private(state_dir, create=True)
    try:
        # The directory itself, not a file in it: a lock file can be deleted from under its
        # holder, and then a second daemon would take a lock of its own. Close-on-exec
        # (Python's default): a worker must never inherit, and so keep, the lock.
        fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise StartupError(f"cannot open state dir {state_dir}: {exc.strerror or exc}") from None
    try:
        if not _take(fd) and not _outwait_a_stopping_daemon(state_dir, fd):
            raise StartupError(_held_by_other(state_dir))
        try:
            write_private(lock_path(state_dir), f"{os.getpid()}\n")
        except OSError as exc:
            raise StartupError(
                f"cannot write {lock_path(state_dir)}: {exc.strerror or exc}"
            ) from None
        yield state_dir
    finally:
        os.close(fd)  # releases the lock


def _take(fd: int) -> bool:
    # A few tries: a CLI checking whether a daemon is running holds a shared lock for an
    # instant, which must not look like a daemon.
    for _ in range(5):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            time.sleep(0.02)
    return False


#: How long a start waits for a daemon that is stopping (it says so in the lock file) to exit:
#: its graceful stop of the API server takes a few seconds at most.
STOPPING_WAIT_S = 30.0


def mark_stopping(state_dir: Path) -> None:
    """Say, in the lock file, that this daemon is on its way out: a start meanwhile waits for
    it, rather than being refused, so that `kill -TERM` and a new `controller run` can follow
    each other at once."""
    with contextlib.suppress(OSError):  # only a courtesy to the next start: never in the way
        write_private(lock_path(state_dir), f"{os.getpid()} stopping\n")


def _outwait_a_stopping_daemon(state_dir: Path, fd: int) -> bool:
    """Wait for the lock while its holder says it is stopping and is alive; True once taken."""
    try:
        pid_text, _, mark = _read_lock(state_dir).partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return False
    if mark.strip() != "stopping":
        return False
    logger.info("waiting for the daemon that is stopping (pid %d) to exit", pid)
    deadline = time.monotonic() + STOPPING_WAIT_S
    # Before the API is up and nothing else runs: a plain wait in steps is the simple thing.
    while time.monotonic() < deadline and _alive(pid):
        if _take(fd):
            return True
    return _take(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def daemon_running(state_dir: Path) -> bool:
    """Whether a daemon holds `state_dir` now. A ``daemon.json`` left by a daemon that was
    killed is stale: the port it names may be anyone's by now."""
    try:
        fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _held_by_other(state_dir: Path) -> str:
    try:
        pid = _read_lock(state_dir).strip()[:32] or "unknown"
    except OSError:
        pid = "unknown"
    url = read_address(state_dir).get("url") or "its address not written yet"
    return (
        f"another controller daemon (pid {pid}, {url}) is using the state dir {state_dir}; "
        "stop it first (`controller shutdown`, or Ctrl-C to keep its replicas), or pass "
        "another --state-dir"
    )


def _read_lock(state_dir: Path) -> str:
    return read_regular(lock_path(state_dir), limit=4096).decode(errors="replace")


def kept_token(state_dir: Path) -> str | None:
    """The token an earlier daemon wrote to this (locked, private) state dir, if it looks like
    one: printable ASCII without spaces. A symlink in its place is refused
    (``UnsafeFileError``), not followed: it would make any file the token."""
    try:
        token = read_regular(token_path(state_dir), limit=4096).decode("ascii").strip()
    except UnsafeFileError:
        raise
    except (OSError, UnicodeDecodeError):
        return None
    return token if re.fullmatch(r"[!-~]{16,1024}", token) else None


def write_token(state_dir: Path, token: str) -> None:
    write_private(token_path(state_dir), token + "\n")


def write_address(state_dir: Path, url: str, epoch: str) -> None:
    write_private(
        address_path(state_dir), json.dumps({"url": url, "pid": os.getpid(), "epoch": epoch})
    )
