"""The serving benchmark's hello world (``bench/serve_bench.py``): one function, served four
ways. Our worker calls `hello` with its own request object, Ray Serve's replica with a Starlette
request; uvicorn serves `hello_asgi`, the least ASGI that calls the same function with a
Starlette request (no framework between them)."""

from __future__ import annotations

from typing import Any

# The bench session installs Starlette (with FastAPI); the typecheck session may not have it.
from starlette.requests import Request  # type: ignore[import-not-found, unused-ignore]


def hello(request: Any) -> str:
    return f"hello, {request.query_params.get('name', 'world')}\n"


_HEAD = [(b"content-type", b"text/plain; charset=utf-8")]


async def hello_asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """`hello` as an ASGI application (HTTP only: run uvicorn with ``--lifespan off``)."""
    assert scope["type"] == "http", scope["type"]
    body = hello(Request(scope, receive)).encode()
    headers = [*_HEAD, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def hello_async(request: Any) -> str:
    """`hello` as a coroutine: called on the worker's loop, where `hello` runs in a thread."""
    return hello(request)
