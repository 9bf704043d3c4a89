"""The SQLite store: atomic batches, grouped writes, a real file."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
import trio

import controller


async def test_round_trip_and_delete(tmp_path: Path) -> None:
    with controller.SQLiteStore(tmp_path / "s.db") as store:
        await store.write({"a": "1", "b": "2"})
        await store.write({"a": None, "c": "3"})
        assert await store.read_all() == {"b": "2", "c": "3"}
    with controller.SQLiteStore(tmp_path / "s.db") as again:
        assert await again.read_all() == {"b": "2", "c": "3"}


async def test_wal_mode(tmp_path: Path) -> None:
    with controller.SQLiteStore(tmp_path / "s.db") as store:
        await store.write({"a": "1"})
    conn = sqlite3.connect(tmp_path / "s.db")
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        conn.close()


async def test_concurrent_writes_are_grouped(tmp_path: Path) -> None:
    with controller.SQLiteStore(tmp_path / "s.db", synchronous="NORMAL") as store:
        async with trio.open_nursery() as nursery:
            for i in range(50):
                nursery.start_soon(store.write, {f"k{i}": str(i)})
        assert len(await store.read_all()) == 50
        assert store.transactions < 50
        assert store.transactions >= 1


async def test_a_failed_batch_lands_nothing(tmp_path: Path) -> None:
    with controller.SQLiteStore(tmp_path / "s.db") as store:
        await store.write({"a": "1"})
        with pytest.raises(controller.StoreError, match="writing"):
            # SQLite cannot bind a list: the whole batch is rolled back.
            await store.write({"b": "2", "c": ["x"]})  # type: ignore[dict-item]
        assert await store.read_all() == {"a": "1"}


def test_bad_synchronous_setting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="synchronous"):
        controller.SQLiteStore(tmp_path / "s.db", synchronous="OFF")  # type: ignore[arg-type]


@pytest.mark.parametrize("deleted", [("", "-wal", "-shm"), ("-wal",), ("-wal", "-shm")])
async def test_a_database_deleted_while_in_use_refuses_writes(
    tmp_path: Path, deleted: tuple[str, ...]
) -> None:
    path = tmp_path / "s.db"
    with controller.SQLiteStore(path) as store:
        await store.write({"a": "1"})
        for suffix in deleted:
            await trio.Path(f"{path}{suffix}").unlink(missing_ok=True)
        with pytest.raises(controller.StoreError, match="deleted or replaced while in use"):
            await store.write({"b": "2"})


async def test_the_original_error_is_reported_not_the_failed_rollback(tmp_path: Path) -> None:
    # A write that fails inside SQLite (here: the disk full, by a file size limit in a child
    # process, so that this process's own files are not limited) is rolled back by SQLite
    # itself; the error to see is that one, not "cannot rollback - no transaction is active".
    script = """
import resource, sys, trio, controller
async def main():
    store = controller.SQLiteStore(sys.argv[1])
    await store.write({"a": "x"})
    resource.setrlimit(resource.RLIMIT_FSIZE, (1, resource.RLIM_INFINITY))
    try:
        await store.write({"b": "y" * 100_000})
    except controller.StoreError as exc:
        print(exc)
trio.run(main)
"""
    with trio.fail_after(30):
        result = await trio.run_process(
            [sys.executable, "-c", script, str(tmp_path / "s.db")],
            capture_stdout=True,
            capture_stderr=True,
        )
    out = result.stdout.decode()
    assert "disk I/O error" in out or "disk is full" in out, (out, result.stderr)
    assert "rollback" not in out
