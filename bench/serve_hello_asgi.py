"""`serve_hello.hello` as the least ASGI application that serves it: the same function, called
with a Starlette request (as Ray Serve calls it), with no framework between it and uvicorn
(``uvicorn serve_hello_asgi:app --lifespan off``)."""

from __future__ import annotations

from typing import Any

from serve_hello import hello

# The bench session installs Starlette (with FastAPI); the typecheck session may not have it.
from starlette.requests import Request  # type: ignore[import-not-found, unused-ignore]

_HEAD = [(b"content-type", b"text/plain; charset=utf-8")]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """HTTP only: run uvicorn with ``--lifespan off``."""
    assert scope["type"] == "http", scope["type"]
    body = hello(Request(scope, receive)).encode()
    headers = [*_HEAD, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
