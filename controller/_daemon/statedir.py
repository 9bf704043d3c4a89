"""The daemon's state dir: where it is, what is in it, and the lock that makes it one daemon's.

One object, ``StateDir``, names every file in it and reads and writes them; the daemon, its
ingress processes and the CLI are handed it, never a bare path to join names to. Light on
imports: the CLI reads the paths (to find the daemon and its token) without trio.

- the directory itself is locked (``flock`` on it) by the daemon for its whole life, so that a
  second daemon on it is refused before it writes anything; deleting a file cannot undo that.
  ``lock`` names the holder's pid, for that refusal.
- ``token``, ``daemon.json`` (the API's address, pid and epoch): written atomically, 0600.
- ``controller.db``: the SQLite store, 0600, and SQLite's ``-wal`` beside it (and its ``-shm``
  when daemons share the store). ``w/``: LocalRuntime's workers and their logs.
- ``daemon.log``: the daemon's own log, rotated.
- ``ingress/``: each ingress process's record (``N.json``), its sockets and its log.
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
from typing import final

import attrs

from .._files import UnsafeFileError, private_dir, read_regular, write_private
from .._model.values.errors import ConfigError, StartupError

STATE_DIR_ENV = "CONTROLLER_STATE_DIR"
TOKEN_ENV = "CONTROLLER_TOKEN"

logger = logging.getLogger("controller")


def default_state_dir() -> Path:
    env = os.environ.get(STATE_DIR_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "trio-controller"


#: How long ingress processes outlive the daemon of their state dir, by default (``controller run
#: --ingress-orphan-timeout``): here, for the CLI to show it without importing the ingress.
ORPHAN_TIMEOUT_S = 300.0

#: How long a start waits for a daemon that is stopping (it says so in the lock file) to exit:
#: its graceful stop of the API server takes a few seconds at most.
STOPPING_WAIT_S = 30.0


@final
@attrs.frozen
class StateDir:
    """A daemon's state dir (or the dir daemons share: the same files but the lock's)."""

    path: Path

    def __str__(self) -> str:
        return str(self.path)

    # -- what is in it --

    @property
    def token(self) -> Path:
        return self.path / "token"

    @property
    def address(self) -> Path:
        return self.path / "daemon.json"

    @property
    def lock(self) -> Path:
        return self.path / "lock"

    @property
    def log(self) -> Path:
        return self.path / "daemon.log"

    @property
    def store(self) -> Path:
        return self.path / "controller.db"

    @property
    def workers(self) -> Path:
        """LocalRuntime's directory: its workers' sockets and logs."""
        return self.path / "w"

    @property
    def ingress(self) -> Path:
        return self.path / "ingress"

    def ingress_record(self, slot: int) -> Path:
        return self.ingress / f"{slot}.json"

    def ingress_socket(self, slot: int, pid: int) -> Path:
        """An ingress process's own socket: named by its pid too, so that a process replacing
        another in its slot never shares (or, on the other's way out, loses) its socket."""
        return self.ingress / f"{slot}.{pid}.sock"

    def ingress_handover(self, slot: int, pid: int) -> Path:
        """Where an ingress process gives its listening sockets to the daemon starting its
        successor."""
        return self.ingress / f"{slot}.{pid}.listeners"

    def ingress_beat(self, slot: int, pid: int) -> Path:
        """Where an ingress process writes the time, again and again, while its loop runs
        (`liveness`)."""
        return self.ingress / f"{slot}.{pid}.beat"

    def ingress_log(self, slot: int) -> Path:
        return self.ingress / f"{slot}.log"

    # -- reading --

    def read_address(self) -> dict[str, object]:
        """What ``daemon.json`` says (``url``, ``pid``, ``epoch``), or nothing."""
        try:
            data = json.loads(read_regular(self.address))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def kept_token(self) -> str | None:
        """The token an earlier daemon wrote here (locked, private), if it looks like one:
        printable ASCII without spaces. A symlink in its place is refused (``UnsafeFileError``),
        not followed: it would make any file the token."""
        try:
            token = read_regular(self.token, limit=4096).decode("ascii").strip()
        except UnsafeFileError:
            raise
        except (OSError, UnicodeDecodeError):
            return None
        return token if re.fullmatch(r"[!-~]{16,1024}", token) else None

    def running(self) -> bool:
        """Whether a daemon holds it now. A ``daemon.json`` left by a daemon that was killed is
        stale: the port it names may be anyone's by now."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def check_private(self, *, create: bool, what: str = "state dir") -> None:
        """Refuse (``StartupError``) a dir that another user owns or may write in, or one
        reached through another user's symlink: its files (the token, the address) are not to
        be trusted, nor written. With `create`, make it (0700) if missing."""
        try:
            if create or self.path.exists():
                private_dir(self.path, f"--{what.replace(' ', '-')}", create=create)
        except ConfigError as exc:
            raise StartupError(f"{what} {self.path}: {exc.rule}") from None
        except OSError as exc:
            raise StartupError(f"cannot use {what} {self.path}: {exc.strerror or exc}") from None

    # -- writing --

    def write_token(self, token: str) -> None:
        write_private(self.token, token + "\n")

    def write_address(self, url: str, epoch: str) -> None:
        write_private(self.address, json.dumps({"url": url, "pid": os.getpid(), "epoch": epoch}))

    def mark_stopping(self) -> None:
        """Say, in the lock file, that this daemon is on its way out: a start meanwhile waits
        for it, rather than being refused, so that `kill -TERM` and a new `controller run` can
        follow each other at once."""
        with contextlib.suppress(OSError):  # only a courtesy to the next start: never in the way
            write_private(self.lock, f"{os.getpid()} stopping\n")

    # -- the lock --

    @contextlib.contextmanager
    def locked(self) -> Iterator[StateDir]:
        """Check that it is private (creating it), and hold its lock until exit.

        Raises ``StartupError`` if it is unsafe or another daemon holds it, naming that
        daemon."""
        self.check_private(create=True)
        try:
            # The directory itself, not a file in it: a lock file can be deleted from under
            # its holder, and then a second daemon would take a lock of its own.
            # Close-on-exec (Python's default): a worker must never inherit, and so keep, it.
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise StartupError(
                f"cannot open state dir {self.path}: {exc.strerror or exc}"
            ) from None
        try:
            if not _take(fd) and not self._outwait_a_stopping_daemon(fd):
                raise StartupError(self._held_by_other())
            try:
                write_private(self.lock, f"{os.getpid()}\n")
            except OSError as exc:
                raise StartupError(f"cannot write {self.lock}: {exc.strerror or exc}") from None
            yield self
        finally:
            os.close(fd)  # releases the lock

    def _outwait_a_stopping_daemon(self, fd: int) -> bool:
        """Wait for the lock while its holder says it is stopping and is alive; True once
        taken."""
        try:
            pid_text, _, mark = self._read_lock().partition(" ")
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

    def _held_by_other(self) -> str:
        try:
            pid = self._read_lock().strip()[:32] or "unknown"
        except OSError:
            pid = "unknown"
        url = self.read_address().get("url") or "its address not written yet"
        return (
            f"another controller daemon (pid {pid}, {url}) is using the state dir {self.path}; "
            "stop it first (`controller shutdown`, or Ctrl-C to keep its replicas), or pass "
            "another --state-dir"
        )

    def _read_lock(self) -> str:
        return read_regular(self.lock, limit=4096).decode(errors="replace")


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
