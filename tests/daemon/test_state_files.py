"""The files the daemon reads from its state dir are read as themselves: a symlink planted in
the place of the token, a replica's log or the address file is refused with an error that names
it, never followed. In process, then on a real daemon (real clock, every wait
bounded by fail_after)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

from controller._daemon.statedir import StateDir
from controller._files import UnsafeFileError, open_regular, read_regular
from controller._local.logs import read_log

from ..daemons import LIMIT_S, Daemon, ingress_args, one_line, running, trivial

SECRET = "a-secret-of-another-file-0123456789"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file of this user's that no state dir names: what a planted link would expose."""
    path = tmp_path / "victim"
    path.write_text(SECRET + "\n")
    return path


def test_a_symlink_is_refused_by_name_and_a_regular_file_read(tmp_path: Path, victim: Path) -> None:
    link = tmp_path / "token"
    link.symlink_to(victim)
    with pytest.raises(UnsafeFileError) as caught:
        read_regular(link)
    assert str(caught.value) == (
        f"{link}: is a symlink, which is not followed: the daemon reads the files of its state "
        "dir only as themselves, since a link could point at any file; remove it"
    )
    assert read_regular(victim) == (SECRET + "\n").encode()
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "missing")


def test_what_is_not_a_regular_file_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "daemon.json"
    os.mkfifo(fifo)  # opened for reading the usual way, it waits for a writer for ever
    with pytest.raises(UnsafeFileError, match=r"daemon.json: is not a regular file \(p"):
        open_regular(fifo)
    assert StateDir(tmp_path).read_address() == {}
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(UnsafeFileError, match="is larger than 100 bytes"):
        read_regular(big, limit=100)


def test_the_state_dir_s_token_and_address_are_not_read_through_links(
    tmp_path: Path, victim: Path
) -> None:
    (tmp_path / "daemon.json").symlink_to(victim)
    (tmp_path / "token").symlink_to(victim)
    assert StateDir(tmp_path).read_address() == {}
    with pytest.raises(UnsafeFileError, match="token: is a symlink"):
        StateDir(tmp_path).kept_token()


@pytest.mark.parametrize("linked", ["a#0.log", "a#0.log.1"])
def test_a_replica_log_or_its_rotated_part_as_a_link_is_refused(
    tmp_path: Path, victim: Path, linked: str
) -> None:
    log = tmp_path / "a#0.log"
    log.write_text("short\n")
    (tmp_path / linked).unlink(missing_ok=True)
    (tmp_path / linked).symlink_to(victim)
    with pytest.raises(UnsafeFileError, match=f"{linked}: is a symlink"):
        read_log(log)


async def test_a_symlinked_token_stops_the_start_and_is_not_used(
    state_dir: Path, victim: Path
) -> None:
    (state_dir / "token").symlink_to(victim)
    args = ["--listen", "127.0.0.1:0", "--no-ingress"]
    with trio.fail_after(LIMIT_S):
        result = await trio.run_process(
            [*Daemon(state_dir).cli_argv(), "run", *ingress_args(args), *args],
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 1, result.stderr.decode()
    line = one_line(result.stderr)
    assert f"{state_dir}/token: is a symlink, which is not followed" in line, line
    # Not followed, and left for the user to look at: neither the token nor the link changed.
    assert (state_dir / "token").is_symlink()
    assert await trio.Path(victim).read_text() == SECRET + "\n"


async def test_a_fifo_for_the_daemons_log_stops_the_start_at_once(state_dir: Path) -> None:
    # Found by an attack: the start hung opening it (for a reader that never came), holding
    # the state dir's lock.
    os.mkfifo(state_dir / "daemon.log")
    args = ["--listen", "127.0.0.1:0", "--no-ingress"]
    with trio.fail_after(LIMIT_S):
        result = await trio.run_process(
            [*Daemon(state_dir).cli_argv(), "run", *ingress_args(args), *args],
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 1, result.stderr.decode()
    assert f"{state_dir}/daemon.log: not a regular file" in one_line(result.stderr)


async def test_the_cli_refuses_a_symlinked_token(state_dir: Path, victim: Path) -> None:
    (state_dir / "token").symlink_to(victim)
    with trio.fail_after(LIMIT_S):
        result = await Daemon(state_dir).cli("--url", "http://127.0.0.1:9", "status")
    assert result.returncode == 1
    assert f"error: the token {state_dir}/token: is a symlink" in result.stderr.decode()


async def test_a_replica_log_replaced_by_a_link_is_refused_not_served(
    state_dir: Path, victim: Path
) -> None:
    body = json.dumps(trivial(1)).encode()
    with trio.fail_after(LIMIT_S):
        async with running(state_dir, "--no-ingress") as daemon:
            assert (await daemon.http("PUT", "/api/v1/backends/a", body))[0] == 200
            assert (await daemon.cli("wait", "a")).returncode == 0
            (log,) = (state_dir / "w" / "logs").iterdir()
            log.unlink()
            log.symlink_to(victim)
            code, error = await daemon.http("GET", "/api/v1/backends/a/logs")
            assert code == 409, error
            assert error["error"]["type"] == "LogRefused"
            message = error["error"]["message"]
            assert f"{log}: is a symlink, which is not followed" in message, message
            assert SECRET not in json.dumps(error)
            result = await daemon.cli("logs", "a")
            assert result.returncode == 2  # the CLI's code for a 409
            assert "is a symlink" in result.stderr.decode()
            assert SECRET.encode() not in result.stdout + result.stderr
    assert await trio.Path(victim).read_text() == SECRET + "\n"
