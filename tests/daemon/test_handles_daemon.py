"""Handles on real workers behind a daemon: replicas call each other through the routes the
daemon published (its API, read with the route token, which opens the watch and nothing else),
through a daemon restart; the admin token reaches no replica."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from ..daemons import LIMIT_S, Daemon, free_port, manifest, running
from ..http_client import request
from ..pristine import EXAMPLES


def code(entrypoint: str, **fields: Any) -> dict[str, Any]:
    return {
        "entrypoint": f"handle_apps:{entrypoint}",
        "num_replicas": 1,
        "version": "v1",
        "graceful_shutdown_timeout_s": 5,
        **fields,
    }


BACKENDS = {
    "a": code("Link", init_kwargs={"then": "b"}, route_prefix="/a"),
    "b": code("Link"),
    "calc": code("Calculator", num_replicas=2),
    "front": code("Front", route_prefix="/front"),
}


@asynccontextmanager
async def daemon_with(state_dir: Path, *extra: str) -> AsyncIterator[tuple[Daemon, int]]:
    file = state_dir / "handles.toml"
    file.write_text(manifest(**BACKENDS))
    with trio.fail_after(LIMIT_S * 2):
        async with running(state_dir, "--config", str(file), *extra) as daemon:
            for name in BACKENDS:
                assert (await daemon.cli("wait", name)).returncode == 0
            yield daemon, int(daemon.ingress_url.rpartition(":")[2])


def _call(url: str, token: str, method: str = "GET", body: bytes | None = None) -> int:
    ask = urllib.request.Request(url, data=body, method=method)
    ask.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(ask, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


async def test_replicas_call_each_other_with_the_route_token_alone(state_dir: Path) -> None:
    async with daemon_with(state_dir) as (daemon, port):
        answer = (await request(port, "/a/go?s=0")).json()
        assert (answer["via"], answer["then"]["at"]) == ("a", "b")
        assert (await request(port, "/front/add?a=2&b=3")).json() == {"sum": 5.0}
        # What replicas follow the routes with: the daemon's API and a token of their own.
        routes = json.loads((state_dir / "w" / "routes.json").read_text())
        assert routes["url"] == daemon.url
        assert routes["token"] != daemon.token
        watch = f"{daemon.url}/api/v1/watch?since=0&timeout_s=0"
        assert await trio.to_thread.run_sync(_call, watch, routes["token"]) == 200
        for method, path, body in (
            ("GET", "/api/v1/backends", None),
            ("DELETE", "/api/v1/backends/a", None),
            ("POST", "/api/v1/shutdown", b"{}"),
            ("PUT", "/api/v1/backends/x", json.dumps(code("Link")).encode()),
        ):
            url = daemon.url + path
            status = await trio.to_thread.run_sync(_call, url, routes["token"], method, body)
            assert status == 403, (method, path, status)
        # The API's own token is in no replica's environment, nor in its spec.
        pids = [r["pid"] for b in (await daemon.status()).values() for r in b["replicas"]]
        assert not await trio.to_thread.run_sync(_token_in, daemon.token, state_dir, pids)
        assert "a" in (await daemon.status())  # nothing the route token asked was done


async def test_handles_follow_the_daemon_through_its_restart(state_dir: Path) -> None:
    file = state_dir / "handles.toml"
    file.write_text(manifest(**BACKENDS))
    api_port, ingress_port = free_port(), free_port()
    args = ("--config", str(file), "--ingress-listen", f"127.0.0.1:{ingress_port}")
    with trio.fail_after(LIMIT_S * 2):
        async with trio.open_nursery() as nursery:
            first = Daemon(state_dir)
            await first.start(nursery, *args, listen=f"127.0.0.1:{api_port}")
            for name in BACKENDS:
                assert (await first.cli("wait", name)).returncode == 0
            assert (await request(ingress_port, "/front/add?a=1&b=1")).json() == {"sum": 2.0}
            assert await first.stop(signal.SIGTERM) == 0
            # No daemon: the replicas' handles route on what they last heard.
            assert (await request(ingress_port, "/front/add?a=1&b=2")).json() == {"sum": 3.0}
        async with running(state_dir, *args, listen=f"127.0.0.1:{api_port}") as second:
            assert (await second.cli("wait", "calc")).returncode == 0
            # Scaled while the handles follow the new daemon: they reach the new replicas.
            assert (await second.cli("scale", "calc", "3", "--wait")).returncode == 0
            answered = set()
            for _ in range(40):
                answer = (await request(ingress_port, "/front/add?a=0&b=0&who=1")).json()
                assert answer["sum"] == 0.0
                answered.add(answer["tag"])
            now = {r["tag"] for r in (await second.status())["calc"]["replicas"]}
            assert answered <= now
            assert len(answered) >= 2  # power of two choices over all three, new one included


def _token_in(token: str, state_dir: Path, pids: list[int]) -> bool:
    """Whether the API's token is in a replica's environment, or in a worker's spec."""
    for pid in pids:
        if token.encode() in Path(f"/proc/{pid}/environ").read_bytes():
            return True
    return any(token in spec.read_text() for spec in (state_dir / "w").glob("*.spec.json"))


async def test_the_readme_services_example_runs_as_written(state_dir: Path) -> None:
    """examples/services.toml as the README runs it: search calls embed through a handle; its
    rate limit answers 429 past the burst, its metrics count it; a session stays put."""
    examples = EXAMPLES
    with trio.fail_after(LIMIT_S * 2):
        async with running(
            state_dir,
            "--config",
            str(examples / "services.toml"),
            "--pythonpath",
            str(examples),
        ) as daemon:
            for name in ("embed", "search"):
                assert (await daemon.cli("wait", name)).returncode == 0
            port = int(daemon.ingress_url.rpartition(":")[2])
            answer = await request(port, "/search?q=cancel+a+tree+of+tasks")
            assert answer.status == 200, answer
            assert answer.json()["best"] == "cancel scopes end a whole tree of tasks"
            # A session's requests go to one replica of search (it has one: the key is read).
            served = {
                (await request(port, "/search?q=ray", headers=[("X-Session", "s1")])).json()[
                    "served_by"
                ]
                for _ in range(3)
            }
            assert len(served) == 1
            # 100 at once with one API key: the burst (40) and what refilled meanwhile pass.
            statuses: list[int] = []
            began = trio.current_time()

            async def one() -> None:
                got = await request(port, "/search?q=x", headers=[("X-Api-Key", "k")])
                statuses.append(got.status)

            async with trio.open_nursery() as nursery:
                for _ in range(100):
                    nursery.start_soon(one)
            took = trio.current_time() - began
            assert set(statuses) <= {200, 429}
            assert statuses.count(200) <= 40 + 20 * took + 1
            if took < 2.5:  # else the refill could have let every one through
                assert 429 in statuses
            _, metrics = await daemon.http("GET", "/metrics")
            limited = [
                line
                for line in metrics.splitlines()
                if line.startswith('ingress_rate_limited_total{backend="search"')
            ]
            assert limited
            assert float(limited[0].rsplit(" ", 1)[1]) == statuses.count(429)
