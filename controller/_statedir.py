"""The daemon's state dir: where it is, what is in it, and the lock that makes it one daemon's.

Light on imports: the CLI reads the paths (to find the daemon and its token) without trio.

- ``lock``: held (``flock``) by the daemon for its whole life, with its pid in it; a second
  daemon on the same dir is refused before it writes anything.
- ``token``, ``daemon.json`` (the API's address, pid and epoch): written atomically, 0600.
- ``controller.db``: the SQLite store, 0600. ``w/``: LocalRuntime's workers and their logs.
- ``daemon.log``: the daemon's own log, rotated.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from ._errors import ConfigError, StartupError
from ._files import private_dir, write_private

STATE_DIR_ENV = "CONTROLLER_STATE_DIR"
TOKEN_ENV = "CONTROLLER_TOKEN"


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
        data = json.loads(address_path(state_dir).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@contextlib.contextmanager
def locked(state_dir: Path) -> Iterator[Path]:
    """Check that `state_dir` is private (creating it), and hold its lock until exit.

    Raises ``StartupError`` if it is unsafe or another daemon holds it, naming that daemon."""
    try:
        private_dir(state_dir, "--state-dir")
    except ConfigError as exc:
        raise StartupError(f"state dir {state_dir}: {exc.rule}") from None
    except OSError as exc:
        raise StartupError(f"cannot use state dir {state_dir}: {exc.strerror or exc}") from None
    path = lock_path(state_dir)
    try:
        # Close-on-exec (Python's default): a worker must never inherit, and so keep, the lock.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StartupError(f"cannot open {path}: {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StartupError(_held_by_other(state_dir, fd)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield state_dir
    finally:
        os.close(fd)  # releases the lock


def _held_by_other(state_dir: Path, fd: int) -> str:
    pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    url = read_address(state_dir).get("url") or "its address not written yet"
    return (
        f"another controller daemon (pid {pid}, {url}) is using the state dir {state_dir}; "
        "stop it first (`controller shutdown`, or Ctrl-C to keep its replicas), or pass "
        "another --state-dir"
    )


def write_token(state_dir: Path, token: str) -> None:
    write_private(token_path(state_dir), token + "\n")


def write_address(state_dir: Path, url: str, epoch: str) -> None:
    write_private(
        address_path(state_dir), json.dumps({"url": url, "pid": os.getpid(), "epoch": epoch})
    )
