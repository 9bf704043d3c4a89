"""The embedded default store: a SQLite file in WAL mode, with concurrent writes grouped."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Mapping
from typing import Literal, final

import attrs
import trio

from ._errors import StoreError


@attrs.define(eq=False)
class _Batch:
    changes: dict[str, str | None] = attrs.field(factory=dict)
    done: trio.Event = attrs.field(factory=trio.Event)
    error: Exception | None = None


@final
class SQLiteStore:
    """Checkpoints in a SQLite file: one table, one transaction per batch of writes.

    Writes that arrive while a transaction is in flight are grouped into the next one, so a burst
    of checkpoints from many backends costs a few commits rather than one each. The connection is
    opened on first use; call ``close()`` (or use ``with``) when done.

    `synchronous` is SQLite's setting: ``"FULL"`` (the default) makes each commit survive a power
    loss; ``"NORMAL"`` survives a crash of the process, which is what the controller's recovery
    needs, and commits faster.

    A new database file is created readable by its owner only (0600). Failures raise
    ``StoreError`` with SQLite's own message (``disk I/O error``, ``file is not a database``...);
    a failed write changes nothing.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, synchronous: Literal["FULL", "NORMAL"] = "FULL"
    ):
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f'synchronous: must be "FULL" or "NORMAL" (got {synchronous!r})')
        self.path = os.fspath(path)
        self._synchronous = synchronous
        self._conn: sqlite3.Connection | None = None
        self._inode: int | None = None
        self._wal_inode: int | None = None
        # SQLite calls block, so they run in a worker thread, one at a time.
        self._limiter = trio.CapacityLimiter(1)
        self._pending: _Batch | None = None
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
            self._conn.close()
            self._conn = None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            if self.path != ":memory:" and not os.path.exists(self.path):
                # Checkpoints name what runs where: private from the first byte.
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            # isolation_level=None: transactions are begun and committed explicitly below.
            # check_same_thread=False: trio's worker threads vary; the limiter serializes use.
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(f"PRAGMA synchronous={self._synchronous}")
                conn.execute("PRAGMA busy_timeout=5000")
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS checkpoints "
                    "(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID"
                )
            except BaseException:
                conn.close()
                raise
            self._conn = conn
            if self.path != ":memory:":
                self._inode = os.stat(self.path).st_ino
        return self._conn

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

    def _commit_sync(self, changes: Mapping[str, str | None]) -> None:
        conn = self._connection()
        self._check_file()
        conn.execute("BEGIN IMMEDIATE")
        try:
            puts = [(k, v) for k, v in changes.items() if v is not None]
            deletes = [(k,) for k, v in changes.items() if v is None]
            if puts:
                conn.executemany(
                    "INSERT INTO checkpoints (key, value) VALUES (?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    puts,
                )
            if deletes:
                conn.executemany("DELETE FROM checkpoints WHERE key = ?", deletes)
            conn.execute("COMMIT")
            if self._inode is not None and self._wal_inode is None:
                self._wal_inode = _inode(self.path + "-wal")
        except BaseException:
            # SQLite may have rolled back already (it does on an I/O error or a full disk), and
            # a ROLLBACK then fails with "no transaction is active": the error to report is the
            # one that brought us here.
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise

    async def read_all(self) -> dict[str, str]:
        try:
            return await trio.to_thread.run_sync(self._read_all_sync, limiter=self._limiter)
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"reading {self.path}: {exc}") from exc

    async def write(self, changes: Mapping[str, str | None]) -> None:
        batch = self._pending
        if batch is None:
            batch = self._pending = _Batch()
        batch.changes.update(changes)
        if not self._flushing:
            await self._flush()
        await batch.done.wait()
        if batch.error is not None:
            raise StoreError(f"writing {self.path}: {batch.error}") from batch.error

    async def _flush(self) -> None:
        # The first writer commits for everyone who queues up behind it. Shielded: if it were
        # cancelled half-way, the writers waiting on later batches would never be released. The
        # caller's cancellation still arrives at its next checkpoint.
        self._flushing = True
        try:
            with trio.CancelScope(shield=True):
                while self._pending is not None:
                    batch, self._pending = self._pending, None
                    try:
                        await trio.to_thread.run_sync(
                            self._commit_sync, batch.changes, limiter=self._limiter
                        )
                        self.transactions += 1
                    except (sqlite3.Error, OSError) as exc:
                        batch.error = exc
                    batch.done.set()
        finally:
            self._flushing = False


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None
