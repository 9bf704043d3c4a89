"""The SQLite store: atomic batches, grouped writes, a real file."""

from __future__ import annotations

import sqlite3
import subprocess
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


async def test_any_text_round_trips_and_a_value_that_is_not_text_is_refused(
    tmp_path: Path,
) -> None:
    # Written and read through JSON documents (one statement each): the text must come back
    # exactly, whatever it holds.
    odd = {
        'quote"s': 'a "b" \\ c',
        "lines\n": "x\ny\r\n\t",
        "ünïcødé": "日本語 🙂",
        "control\x01": "\x00\x1b[31m",
        "empty": "",
        "json-ish": '{"a": [1, 2]}',
    }
    with controller.SQLiteStore(tmp_path / "s.db") as store:
        await store.write(odd)
        assert await store.read_all() == odd
        await store.write(dict.fromkeys(list(odd)[:3]))
        assert await store.read_all() == dict(list(odd.items())[3:])
        with pytest.raises(controller.StoreError, match="'n' is not text"):
            await store.write({"n": 5})  # type: ignore[dict-item]
        assert await store.read_all() == dict(list(odd.items())[3:])
    with controller.SQLiteStore(tmp_path / "e.db") as empty:
        assert await empty.read_all() == {}


async def test_a_batch_is_one_statement_whatever_its_size(tmp_path: Path) -> None:
    # A statement a row let the store's thread give up the GIL at every row and wait to win it
    # back from a busy trio thread: 4,000 rows took a second beside a busy loop, and cost the
    # leader its lease (bench/apply_bench.py). Counted here, not timed.
    with controller.SQLiteStore(tmp_path / "s.db") as store:
        await store.write({"warm": "up"})
        conn = store._conn
        assert conn is not None
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        await store.write({f"k{i}": "v" * 100 for i in range(4000)} | {"warm": None})
        conn.set_trace_callback(None)
        assert [s.split()[0] for s in statements] == ["BEGIN", "INSERT", "DELETE", "COMMIT"]
        assert len(await store.read_all()) == 4000


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


async def test_an_exclusive_store_maps_no_shm_file(tmp_path: Path) -> None:
    # Alone on its file, SQLite keeps the WAL's index in the heap: no -shm to fault on.
    path = tmp_path / "s.db"
    with controller.SQLiteStore(path, exclusive=True) as store:
        await store.write({"a": "1"})
        assert not (tmp_path / "s.db-shm").exists()
        # One planted, cut to nothing and unreadable, is not SQLite's concern any more.
        (tmp_path / "s.db-shm").write_bytes(b"")
        (tmp_path / "s.db-shm").chmod(0)
        await store.write({"b": "2"})
        assert await store.read_all() == {"a": "1", "b": "2"}


async def test_a_shm_file_cut_while_in_use_is_refused_not_touched(tmp_path: Path) -> None:
    # Touching the lost pages of a mapped file is SIGBUS: in a child process, so that a failure
    # of this test kills that, not the test run.
    script = """
import os, sys, trio, controller
async def main():
    path = sys.argv[1]
    store = controller.SQLiteStore(path)
    await store.write({"a": "1"})
    os.truncate(path + "-shm", 0)
    for op in (store.read_all, lambda: store.write({"b": "2"}), store.read_lease):
        try:
            await op()
        except controller.StoreError as exc:
            print(exc)
    store.close()  # SQLite's close touches the index too: it must not fault either
    with controller.SQLiteStore(path) as again:
        print(await again.read_all())
trio.run(main)
"""
    path = tmp_path / "s.db"
    with trio.fail_after(30):
        result = await trio.run_process(
            [sys.executable, "-c", script, str(path)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 0, result.stderr.decode()
    lines = result.stdout.decode().splitlines()
    assert len(lines) == 4, lines
    for line in lines[:3]:
        assert f"{path}-shm" in line, line
        assert "was truncated (from 32768 to 0 bytes) while in use" in line, line
        assert "nothing was read or written" in line, line
    assert lines[3] == "{'a': '1'}"


@pytest.mark.parametrize("how", ["chattr", "injected"])
def test_a_shm_file_made_immutable_while_in_use_is_refused_not_touched(
    tmp_path: Path, how: str
) -> None:
    """An immutable ``-shm`` faults (SIGBUS) at SQLite's next write to its mapped pages, and
    at its close. Made so for real (``chattr +i``, where this machine allows it), or with the
    check told so (anywhere): each use is refused by name, the close leaves the connection
    open rather than fault, and once mended the store is used again."""
    script = """
import subprocess, sys, trio, controller
from controller._stores import sqlite, sqlite_files
path, how = sys.argv[1], sys.argv[2]
def mark(frozen):
    if how == "chattr":
        subprocess.run(["chattr", "+i" if frozen else "-i", path + "-shm"], check=True)
    else:
        told = (lambda p: "immutable") if frozen else sqlite_files.frozen
        sqlite.frozen = sqlite_files.frozen = told
real = sqlite_files.frozen
async def main():
    store = controller.SQLiteStore(path)
    await store.write({"a": "1"})
    mark(True)
    for op in (store.read_all, lambda: store.write({"b": "2"}), store.read_lease):
        try:
            await op()
        except controller.StoreError as exc:
            print(exc)
    store.close()  # a checkpoint, which would fault: not done
    if how != "chattr":
        sqlite.frozen = sqlite_files.frozen = real
    mark(False)
    await store.write({"c": "3"})
    print(sorted(await store.read_all()))
    store.close()
trio.run(main)
"""
    path = tmp_path / "s.db"
    if how == "chattr":
        probe = tmp_path / "probe"
        probe.touch()
        if subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i needs root on a file system with attributes")
        subprocess.run(["chattr", "-i", str(probe)], check=True)
    try:
        # (In a child process: a fault kills that, not the test run.)
        result = subprocess.run(
            [sys.executable, "-c", script, str(path), how],
            capture_output=True,
            check=False,
            timeout=60,
        )
    finally:
        subprocess.run(["chattr", "-i", f"{path}-shm"], capture_output=True, check=False)
    assert result.returncode == 0, result.stderr.decode()
    lines = result.stdout.decode().splitlines()
    assert len(lines) == 4, lines
    for line in lines[:3]:
        assert f"{path}-shm" in line, line
        assert "was made immutable while in use" in line, line
        assert f"`chattr -i {path}-shm`" in line, line
    assert lines[3] == "['a', 'c']"


@pytest.mark.parametrize(
    ("suffix", "plant", "expected"),
    [
        ("-wal", "dir", "is not a regular file"),
        ("-shm", "dir", "is not a regular file"),
        ("-wal", "link", "is a symlink: SQLite would write its wal file wherever it points"),
        ("-shm", "link", "is a symlink: SQLite would write its shm file wherever it points"),
    ],
)
async def test_files_sqlite_would_misuse_are_named_before_it_opens_them(
    tmp_path: Path, suffix: str, plant: str, expected: str
) -> None:
    path = tmp_path / "s.db"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    planted = trio.Path(f"{path}{suffix}")
    if plant == "dir":
        await planted.mkdir()
    else:
        await planted.symlink_to(victim)
    with controller.SQLiteStore(path) as store, pytest.raises(controller.StoreError) as caught:
        await store.read_all()
    assert f"{path}{suffix} {expected}" in str(caught.value)
    assert victim.read_text() == "precious"


@pytest.mark.slow  # SQLite's busy timeout, 5 s of the real clock, in a worker thread
async def test_a_file_an_exclusive_store_holds_is_refused_after_one_wait(tmp_path: Path) -> None:
    """Not 100 waits (the set-up's retries, for daemons opening a new file at once): a store
    that another holds exclusively is refused after one busy timeout, saying why."""
    path = tmp_path / "s.db"
    with controller.SQLiteStore(path, exclusive=True) as alone:
        await alone.write({"a": "1"})
        # Another connection of this process counts as another holder, as another process's.
        with (
            controller.SQLiteStore(path) as other,
            trio.fail_after(30),
            pytest.raises(controller.StoreError, match="another connection holds it") as caught,
        ):
            await other.read_all()
    assert "database is locked" in str(caught.value)
    assert "the store of a daemon run without --shared-dir" in str(caught.value)
