"""The handle benchmark's backends (bench/handle_bench.py), ours and Ray Serve's alike.

- ``Back``: ``echo(x)`` for a handle's call; any HTTP request answers ``ok`` (the ingress's
  own hop, for comparison).
- ``Front`` (at ``/front``): ``/zero`` answers at once; ``/hop`` calls ``Back.echo`` once
  through a handle; ``/loop?n=N&how=handle|direct`` makes N calls one after another inside the
  replica and answers each one's time (``direct``: the same request, on one kept connection to
  Back's replica at ``&addr=``, with no routing: HTTP's own cost).
- ``Link`` (``/chain``): A -> B -> C by handles, C sleeping 10 s; each link records when it
  ended (``/chain/stats``), for the deadline figure.
- ``ServeBack`` and ``ServeFront``: the same two as Ray Serve deployments, Front holding a
  ``DeploymentHandle`` to Back.
"""

from __future__ import annotations

import time
from typing import Any

import trio

from controller import Request
from controller.worker import context, handle


def _stats(took: list[float]) -> dict[str, Any]:
    took.sort()
    return {
        "n": len(took),
        "p50_us": round(took[len(took) // 2] * 1e6, 1),
        "p99_us": round(took[int(len(took) * 0.99)] * 1e6, 1),
        "mean_us": round(sum(took) / len(took) * 1e6, 1),
    }


class Back:
    def echo(self, x: Any) -> Any:
        return x

    def __call__(self, request: Request) -> str:
        return "ok"


class _Direct:
    """One kept HTTP/1.1 connection to a replica, the call's request written by hand: what a
    call costs without a handle's routing and bookkeeping."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.stream: trio.SocketStream | None = None
        self.buffer = b""

    async def call(self, body: bytes) -> bytes:
        if self.stream is None:
            host, _, port = self.address.rpartition(":")
            self.stream = await trio.open_tcp_stream(host, int(port))
        await self.stream.send_all(
            b"POST / HTTP/1.1\r\nhost: replica\r\nx-controller-call: echo\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += await self.stream.receive_some(65536)
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        while len(rest) < length:
            rest += await self.stream.receive_some(65536)
        self.buffer = rest[length:]
        return rest[:length]


class Front:
    def __init__(self) -> None:
        self.direct: _Direct | None = None

    async def __call__(self, request: Request) -> Any:
        path = request.path
        if path.endswith("/zero"):
            return "ok"
        if path.endswith("/hop"):
            return await handle("hop_back").echo("ok")
        if path.endswith("/loop"):
            n = int(request.query_params.get("n", "1000"))
            how = request.query_params.get("how", "handle")
            took = []
            if how == "direct":
                address = request.query_params["addr"]
                if self.direct is None or self.direct.address != address:
                    self.direct = _Direct(address)
                for _ in range(n):
                    began = time.perf_counter()
                    await self.direct.call(b'{"args": ["ok"], "kwargs": {}}')
                    took.append(time.perf_counter() - began)
            else:
                back = handle("hop_back")
                for _ in range(n):
                    began = time.perf_counter()
                    await back.echo("ok")
                    took.append(time.perf_counter() - began)
            return _stats(took)
        return "front"


class Link:
    """One link of A -> B -> C: calls `then`, or (the last) sleeps 10 s. ``/chain/stats``:
    when each request it took ended, by CLOCK_MONOTONIC."""

    def __init__(self, then: str | None = None) -> None:
        self.then = then
        self.ended: list[float] = []
        self.moved = trio.Event()

    async def __call__(self, request: Request) -> Any:
        if request.path.endswith("/stats"):
            want = int(request.query_params.get("n", "0"))
            while len(self.ended) < want:
                await self.moved.wait()
            return {"ended": self.ended, "at": context().backend}
        try:
            if self.then is not None:
                answer = await handle(self.then).request("GET", "/go")
                return {"status": answer.status}
            await trio.sleep(10)
            return "slept"
        finally:
            self.ended.append(time.monotonic())
            self.moved.set()
            self.moved = trio.Event()


def serve_deployments() -> Any:
    """Ray Serve's Front -> Back, bound (imported only where Ray Serve is installed)."""
    import asyncio

    from ray import serve
    from ray.serve.handle import DeploymentHandle

    @serve.deployment(max_ongoing_requests=100, ray_actor_options={"num_cpus": 0.25})
    class ServeBack:
        def echo(self, x: Any) -> Any:
            return x

    @serve.deployment(max_ongoing_requests=100, ray_actor_options={"num_cpus": 0.25})
    class ServeFront:
        def __init__(self, back: DeploymentHandle[Any]) -> None:
            self.back = back

        async def __call__(self, request: Any) -> Any:
            path = request.url.path
            if path.endswith("/zero"):
                return "ok"
            if path.endswith("/hop"):
                return await self.back.echo.remote("ok")
            if path.endswith("/loop"):
                n = int(request.query_params.get("n", "1000"))
                took = []
                for _ in range(n):
                    began = time.perf_counter()
                    await self.back.echo.remote("ok")
                    took.append(time.perf_counter() - began)
                await asyncio.sleep(0)
                return _stats(took)
            return "front"

    return ServeFront.bind(ServeBack.bind())  # type: ignore[attr-defined]
