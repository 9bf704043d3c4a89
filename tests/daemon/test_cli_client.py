"""The CLI's HTTP client against answers a daemon gives as it dies (no daemon needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from controller._cli.client import Client, Unreachable


async def test_an_answer_cut_short_is_a_daemon_gone_not_a_traceback() -> None:
    # What a leader killed mid-answer leaves: its head, a part of its body, and the end.
    async def cut_short(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 3123\r\n\r\n{"
        )
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, cut_short, listeners)
        client = Client(f"http://127.0.0.1:{port}", None)
        with trio.fail_after(10), pytest.raises(Unreachable, match=r"^error: cannot reach the"):
            await trio.to_thread.run_sync(client.call, "GET", "/api/v1/status")
        nursery.cancel_scope.cancel()


def test_what_the_cli_prints_shows_terminal_controls_escaped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import sys

    from controller._cli.output import EscapedText, print_log

    # A replica that prints escapes (in its output, or in an error that status and apply
    # --wait show) could clear the screen, retitle the window or, with bidi controls, make a
    # line read other than it is. The CLI's stdout and stderr escape them (logs --raw does not).
    text = "ok\tfine\n\x1b[2J\x1b]0;owned\x07 \u202eevil\u202c é\n"
    entry = {"text": text, "replica": "a#1", "state": "RUNNING"}
    escaped = EscapedText(sys.stdout)
    escaped.write(text)
    assert capsys.readouterr().out == "ok\tfine\n\\x1b[2J\\x1b]0;owned\\x07 \\u202eevil\\u202c é\n"
    print_log(entry, prefix=True)
    assert capsys.readouterr().out.splitlines()[1].startswith("[a#1] \x1b[2J")  # raw
    # Invisible characters that hide text or make two names look alike are shown too; the
    # joiners that emoji and some scripts need are not.
    hidden = "ad\u200bmin\ufeff\U000e0041\u00ad\u2060 \U0001f468\u200d\U0001f469 \u0645\u200c\u06cc"
    escaped.write(hidden)
    assert capsys.readouterr().out == (
        "ad\\u200bmin\\ufeff\\U000e0041\\xad\\u2060 \U0001f468\u200d\U0001f469 \u0645\u200c\u06cc"
    )


def test_prune_of_a_file_naming_no_backend_asks_for_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from controller._cli.main import main

    empty = tmp_path / "empty.toml"
    empty.write_text("[backends]\n")
    # Refused before any daemon is asked (there is none in tmp_path): nothing is deleted.
    with pytest.raises(SystemExit) as exited:
        main(["--state-dir", str(tmp_path), "apply", "-f", str(empty), "--prune"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "names no backend, so --prune would delete every backend; add --all" in err
    # With --all, it goes on to ask the daemon (here: none runs, which it says).
    with pytest.raises(SystemExit) as exited:
        main(["--state-dir", str(tmp_path), "apply", "-f", str(empty), "--prune", "--all"])
    assert exited.value.code not in (0, None)
    assert "names no backend" not in capsys.readouterr().err
