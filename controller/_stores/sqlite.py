"""The embedded default store: a SQLite file in WAL mode, with concurrent writes grouped."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sqlite3
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Literal, TypeVar, final

import attrs
import trio

from .._model.decisions.lease import Lease, same_grant
from .._model.values.errors import FencedError, StoreError
from .sqlite_files import ShmGuard, check_files, frozen

T = TypeVar("T")

#: Opening a file others open at the same moment: how often, and how far apart, to try.
_SETUP_ATTEMPTS = 100
_SETUP_PAUSE_S = 0.01
#: How long a statement waits for a lock another connection holds (SQLite's busy timeout).
_LOCK_WAIT_S = 5.0


@attrs.define(eq=False)
class _Batch:
    epoch: int | None
    """The writer's epoch, checked in the batch's transaction (None: not fenced)."""
    changes: dict[str, str | None] = attrs.field(factory=dict)
    done: trio.Event = attrs.field(factory=trio.Event)
    error: Exception | None = None


class _Fenced(Exception):
    """Raised inside a transaction that a stale epoch began: it is rolled back."""

    def __init__(self, held: int):
        self.held = held


@final
class SQLiteStore:
    """Checkpoints in a SQLite file: one table, one transaction per batch of writes.

    Writes that arrive while a transaction is in flight are grouped into the next one, so a burst
    of checkpoints from many backends costs a few commits rather than one each.

    It is a ``LeaseStore``: daemons sharing the file elect a leader through a lease kept in a
    table of its own, and ``write_fenced`` checks the lease's epoch inside the write's own
    ``BEGIN IMMEDIATE`` transaction (which holds SQLite's write lock from its first statement),
    so no claim can come between the check and the commit. The connection is
    opened on first use; call ``close()`` (or use ``with``) when done.

    `synchronous` is SQLite's setting: ``"FULL"`` (the default) makes each commit survive a power
    loss; ``"NORMAL"`` survives a crash of the process, which is what the controller's recovery
    needs, and commits faster.

    `exclusive`: this store is the only user of the file (SQLite's exclusive locking mode),
    and no other process or store may open it while it is open. SQLite then keeps the index of
    its write-ahead log in this process's memory rather than in the ``-shm`` file that every
    connection maps into its own, so no fault of that file (truncated by someone, a disk
    error) can kill the process with SIGBUS. Shared (the default), the ``-shm`` file is checked
    before each use, and one truncated, replaced or deleted meanwhile is refused, not touched.

    A new database file is created readable by its owner only (0600). Before the file is
    opened, the directory, the database, its ``-wal`` and (shared) its ``-shm`` are checked:
    one this process cannot write is named in the error. Failures raise ``StoreError`` with
    SQLite's own message (``disk I/O error``, ``file is not a database``...); a failed write
    changes nothing.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        exclusive: bool = False,
    ):
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f'synchronous: must be "FULL" or "NORMAL" (got {synchronous!r})')
        self.path = os.fspath(path)
        self._synchronous = synchronous
        self._exclusive = exclusive
        memory = self.path == ":memory:"
        self._shm = None if exclusive or memory else ShmGuard(self.path)
        self._conn: sqlite3.Connection | None = None
        self._inode: int | None = None
        self._wal_inode: int | None = None
        # SQLite calls block, so they run in a worker thread, one at a time.
        self._limiter = trio.CapacityLimiter(1)
        # Waiting writes, one batch per epoch (one in a daemon; tests fence several).
        self._pending: dict[int | None, _Batch] = {}
        self._flushing = False
        self.transactions = 0
        """How many write transactions were committed (fewer than ``write`` calls under load)."""

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; the next use opens it again."""
        if self._conn is not None:
            if self._shm is not None:
                if frozen(self.path + "-shm") is not None:
                    # Closing would checkpoint, writing the mapped index: a fault (SIGBUS).
                    # The connection is left open for good, and its mapping to the kernel
                    # when the process exits; a next use opens another, refused by name.
                    _never_closed(self._conn)
                    self._conn = None
                    return
                self._shm.mend()
            self._conn.close()
            self._conn = None

    def _connection(self, *, writing: bool = False) -> sqlite3.Connection:
        """The connection, opened if need be; its files checked before it is used: for a
        write, the database and its log; for any use, the ``-shm`` file."""
        conn = self._open()
        if writing:
            self._check_file()
        if self._shm is not None:
            self._shm.check()
        return conn

    def _open(self) -> sqlite3.Connection:
        if self._conn is None:
            if self.path != ":memory:":
                check_files(self.path, shm=self._shm is not None)
            if self.path != ":memory:" and not os.path.exists(self.path):
                # Checkpoints name what runs where: private from the first byte. Another
                # daemon sharing the file may create it first: then it is there, as wanted.
                with contextlib.suppress(FileExistsError):
                    os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            # isolation_level=None: transactions are begun and committed explicitly below.
            # check_same_thread=False: trio's worker threads vary; the limiter serializes use.
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            try:
                # First: the daemons sharing the file may hold its lock while this one opens.
                conn.execute(f"PRAGMA busy_timeout={int(_LOCK_WAIT_S * 1000)}")
                # Before the first read, or SQLite maps the -shm file all the same.
                if self._exclusive:
                    conn.execute("PRAGMA locking_mode=EXCLUSIVE")
                # The database itself is read, never mapped (a build may default otherwise).
                conn.execute("PRAGMA mmap_size=0")
                for attempt in range(_SETUP_ATTEMPTS):
                    began = time.monotonic()
                    try:
                        self._set_up(conn)
                        break
                    except sqlite3.OperationalError as exc:
                        if "locked" not in str(exc) or attempt == _SETUP_ATTEMPTS - 1:
                            raise
                        if time.monotonic() - began >= _LOCK_WAIT_S:
                            # Its whole busy timeout waited out: a holder that lets go in
                            # a moment would have let go by now.
                            raise sqlite3.OperationalError(
                                f"{exc}: another connection holds it, and may until it "
                                "closes (a store opened with exclusive=True does: the "
                                "store of a daemon run without --shared-dir)"
                            ) from exc
                        # Daemons opening a new shared file at once: the switch to WAL
                        # answers "locked" without waiting; it is over in a moment.
                        time.sleep(_SETUP_PAUSE_S)  # a worker thread's: trio is not blocked
            except BaseException:
                conn.close()
                raise
            self._conn = conn
            if self.path != ":memory:":
                self._inode = os.stat(self.path).st_ino
                self._wal_inode = None
            if self._shm is not None:
                self._shm.reset()
                self._shm.seen()
        return self._conn

    def _set_up(self, conn: sqlite3.Connection) -> None:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS checkpoints "
            "(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID"
        )
        # One row: the lease, its epoch apart so that a fenced write reads one integer.
        conn.execute(
            "CREATE TABLE IF NOT EXISTS lease (id INTEGER PRIMARY KEY CHECK (id = 1), "
            "epoch INTEGER NOT NULL, body TEXT NOT NULL)"
        )

    def _check_file(self) -> None:
        """Refuse to write when the files we opened are no longer the ones at our path (the
        database, or its write-ahead log, which holds the latest commits until they are copied
        into the database): SQLite would go on writing to deleted files, and the next start
        would find nothing."""
        if self._inode is None:
            return
        if _inode(self.path) != self._inode or (
            self._wal_inode is not None and _inode(self.path + "-wal") != self._wal_inode
        ):
            raise sqlite3.OperationalError(
                "the database file was deleted or replaced while in use; nothing was written. "
                "Put it back, or restart (a restart over a missing store adopts nothing)"
            )

    def _read_all_sync(self) -> dict[str, str]:
        rows = self._connection().execute("SELECT key, value FROM checkpoints").fetchall()
        return dict(rows)

    def _commit_sync(self, epoch: int | None, changes: Mapping[str, str | None]) -> None:
        conn = self._connection(writing=True)
        conn.execute("BEGIN IMMEDIATE")
        try:
            if epoch is not None:
                held = _held_epoch(conn)
                if held != epoch:
                    raise _Fenced(held)
            # Each kind of change is one statement over one JSON document, not a statement a
            # row: this thread lets go of the GIL at every step of a statement, and has to win
            # it back from the trio thread each time. Beside a busy loop that costs up to a
            # switch interval (5 ms) a row: a batch of 4,000 rows took a second, long enough
            # to cost the leader its lease, where one statement takes milliseconds.
            puts = {k: v for k, v in changes.items() if v is not None}
            deletes = [k for k, v in changes.items() if v is None]
            for key, value in puts.items():
                if not isinstance(key, str) or not isinstance(value, str):
                    raise sqlite3.InterfaceError(f"the value of {key!r} is not text: {value!r:.80}")
            if any("\x00" in text for pair in changes.items() for text in pair if text):
                # SQLite's JSON ends a string at a NUL: such text goes a row at a time. (The
                # controller's own values never hold one: they are JSON texts themselves.)
                _commit_rows(conn, puts, deletes)
            else:
                _commit_documents(conn, puts, deletes)
            conn.execute("COMMIT")
        except BaseException:
            _roll_back(conn)
            raise

    def _read_lease_sync(self) -> Lease | None:
        row = self._connection().execute("SELECT body FROM lease WHERE id = 1").fetchone()
        return None if row is None else Lease.from_json(row[0])

    def _claim_sync(self, seen: Lease | None, new: Lease) -> bool:
        conn = self._connection(writing=True)
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute("SELECT body FROM lease WHERE id = 1").fetchone()
            if not same_grant(None if row is None else Lease.from_json(row[0]), seen):
                conn.execute("ROLLBACK")
                return False
            conn.execute(
                "INSERT INTO lease (id, epoch, body) VALUES (1, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET epoch = excluded.epoch, body = excluded.body",
                (new.epoch, new.to_json()),
            )
            conn.execute("COMMIT")
            return True
        except BaseException:
            _roll_back(conn)
            raise

    def _renew_sync(self, lease: Lease) -> None:
        conn = self._connection(writing=True)
        conn.execute("BEGIN IMMEDIATE")
        try:
            held = _held_epoch(conn)
            if held != lease.epoch:
                raise _Fenced(held)
            conn.execute("UPDATE lease SET body = ? WHERE id = 1", (lease.to_json(),))
            conn.execute("COMMIT")
        except BaseException:
            _roll_back(conn)
            raise

    async def read_lease(self) -> Lease | None:
        return await self._run("reading the lease of", self._read_lease_sync)

    async def claim_lease(self, seen: Lease | None, new: Lease) -> bool:
        return await self._run("claiming the lease of", lambda: self._claim_sync(seen, new))

    async def renew_lease(self, lease: Lease) -> None:
        try:
            await self._run("renewing the lease of", lambda: self._renew_sync(lease))
        except _Fenced as exc:
            raise FencedError("renewing the lease", lease.epoch, exc.held) from None

    def _seen_after(self, fn: Callable[[], T]) -> T:
        result = fn()
        if self._inode is not None and self._wal_inode is None:
            # The log exists once anything was read or written: from then on, it is this one.
            self._wal_inode = _inode(self.path + "-wal")
        if self._shm is not None:
            self._shm.seen()  # SQLite may have grown it
        return result

    async def _run(self, doing: str, fn: Callable[[], T]) -> T:
        try:
            return await trio.to_thread.run_sync(self._seen_after, fn, limiter=self._limiter)
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"{doing} {self.path}: {exc}") from exc

    async def write_fenced(self, epoch: int, changes: Mapping[str, str | None]) -> None:
        await self._write(epoch, changes)

    async def read_all(self) -> dict[str, str]:
        return await self._run("reading", self._read_all_sync)

    async def write(self, changes: Mapping[str, str | None]) -> None:
        await self._write(None, changes)

    async def _write(self, epoch: int | None, changes: Mapping[str, str | None]) -> None:
        batch = self._pending.get(epoch)
        if batch is None:
            batch = self._pending[epoch] = _Batch(epoch)
        batch.changes.update(changes)
        if not self._flushing:
            await self._flush()
        await batch.done.wait()
        if isinstance(batch.error, _Fenced):
            raise FencedError("writing intent", epoch or 0, batch.error.held)
        if batch.error is not None:
            raise StoreError(f"writing {self.path}: {batch.error}") from batch.error

    async def _flush(self) -> None:
        # The first writer commits for everyone who queues up behind it. Shielded: if it were
        # cancelled half-way, the writers waiting on later batches would never be released. The
        # caller's cancellation still arrives at its next checkpoint.
        self._flushing = True
        try:
            with trio.CancelScope(shield=True):
                while self._pending:
                    epoch = next(iter(self._pending))
                    batch = self._pending.pop(epoch)
                    try:
                        await trio.to_thread.run_sync(
                            self._seen_after,
                            partial(self._commit_sync, epoch, batch.changes),
                            limiter=self._limiter,
                        )
                        self.transactions += 1
                    except (sqlite3.Error, OSError, _Fenced) as exc:
                        batch.error = exc
                    batch.done.set()
        finally:
            self._flushing = False


_PUT = (
    "INSERT INTO checkpoints (key, value) VALUES (?, ?) "
    "ON CONFLICT(key) DO UPDATE SET value = excluded.value"
)


def _commit_documents(conn: sqlite3.Connection, puts: dict[str, str], deletes: list[str]) -> None:
    if puts:
        conn.execute(
            "INSERT INTO checkpoints (key, value) SELECT key, value FROM json_each(?) "
            "WHERE true ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (json.dumps(puts),),
        )
    if deletes:
        conn.execute(
            "DELETE FROM checkpoints WHERE key IN (SELECT value FROM json_each(?))",
            (json.dumps(deletes),),
        )


def _commit_rows(conn: sqlite3.Connection, puts: dict[str, str], deletes: list[str]) -> None:
    if puts:
        conn.executemany(_PUT, puts.items())
    if deletes:
        conn.executemany("DELETE FROM checkpoints WHERE key = ?", [(k,) for k in deletes])


def _held_epoch(conn: sqlite3.Connection) -> int:
    """The lease's epoch as stored (0: never claimed), read inside the caller's transaction."""
    row = conn.execute("SELECT epoch FROM lease WHERE id = 1").fetchone()
    return 0 if row is None else int(row[0])


def _roll_back(conn: sqlite3.Connection) -> None:
    # SQLite may have rolled back already (it does on an I/O error or a full disk), and a
    # ROLLBACK then fails with "no transaction is active": the error to report is the one that
    # brought us here.
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _never_closed(conn: sqlite3.Connection) -> None:
    """Keep `conn` alive until the process exits, through the interpreter's own finalization
    too (which would close it): a reference no one ever gives back."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(conn))
