"""An application behind a real daemon, on real workers, through the CLI as the README tells
it: applied from examples/services.toml, changed, its history listed, undone as one (both
members back), kept across a daemon restart (same state dir, same ports), deleted as one; a
member alone cannot be deleted."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import trio

from ..daemons import LIMIT_S, Daemon, free_port, running
from ..http_client import request
from ..pristine import EXAMPLES


async def _ok(daemon: Daemon, *args: str) -> str:
    result = await daemon.cli(*args)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout.decode()


async def _versions(daemon: Daemon) -> tuple[str, str]:
    status = await daemon.status()
    return status["search"]["version"], status["embed"]["version"]


async def test_an_application_is_applied_undone_kept_and_deleted_as_one(state_dir: Path) -> None:
    v1 = (EXAMPLES / "services.toml").read_text()
    file = state_dir / "services.toml"
    file.write_text(v1)
    api_port, ingress_port = free_port(), free_port()
    args = (
        "--config",
        str(file),
        "--pythonpath",
        str(EXAMPLES),
        "--ingress-listen",
        f"127.0.0.1:{ingress_port}",
    )
    with trio.fail_after(LIMIT_S * 3):
        async with trio.open_nursery() as nursery:
            first = Daemon(state_dir)
            await first.start(nursery, *args, listen=f"127.0.0.1:{api_port}")
            try:
                for name in ("embed", "search"):
                    await _ok(first, "wait", name)
                listing = await _ok(first, "status")
                assert "docsearch" in listing
                assert "search, embed" in listing
                # Both members change in one apply: one application revision.
                file.write_text(v1.replace('version = "v1"', 'version = "v2"'))
                applied = await _ok(first, "apply", "-f", str(file), "--wait")
                assert "application/docsearch at revision 2" in applied
                assert await _versions(first) == ("v2", "v2")
                history = await _ok(first, "rollout", "history", "docsearch")
                assert "search 1, embed 1" in history
                assert "search 2, embed 2" in history
                undone = await _ok(first, "rollout", "undo", "docsearch", "--wait")
                assert "rolling back every member, as revision 3" in undone
                assert await _versions(first) == ("v1", "v1")
                answer = await request(ingress_port, "/search?q=trio+nurseries")
                assert answer.status == 200, answer
                refused = await first.cli("delete", "embed")
                assert refused.returncode != 0
                assert b"member of application 'docsearch'" in refused.stderr
                assert await first.stop(signal.SIGTERM) == 0
            except BaseException:
                # Failed before its stop: no daemon or ingress of this test outlives it.
                with trio.move_on_after(LIMIT_S) as cleanup:
                    cleanup.shield = True
                    await first.cli("shutdown")
                    if first.process is not None:
                        await first.process.wait()
                raise
        # The same state dir and ports: the application and its history are as they were.
        async with running(state_dir, *args, listen=f"127.0.0.1:{api_port}") as second:
            shown = json.loads(await _ok(second, "rollout", "history", "docsearch", "--json"))
            assert [(r["number"], r["undone_to"]) for r in shown] == [
                (1, None),
                (2, None),
                (3, 1),
            ]
            status = json.loads(await _ok(second, "status", "docsearch", "--json"))
            assert (status["entry"], status["revision"]) == ("search", 3)
            assert [m["name"] for m in status["members"]] == ["search", "embed"]
            restarted = await _ok(second, "rollout", "restart", "docsearch", "--wait")
            assert "restarting every member, as revision 4" in restarted
            no_canary = await second.cli("rollout", "abort", "docsearch")
            assert no_canary.returncode != 0
            assert b"no member in a canary release" in no_canary.stderr
            await _ok(second, "delete", "docsearch", "--wait")
            assert await second.status() == {}
            code, body = await second.http("GET", "/api/v1/applications")
            assert (code, body) == (200, {"applications": []})
