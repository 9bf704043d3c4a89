"""The serving benchmark's hello world (``bench/serve_bench.py``): one function, served four
ways. Our worker calls `hello` with its own request object, Ray Serve's replica with a Starlette
request, and uvicorn serves it through ``serve_hello_asgi.py``. This module imports nothing, so
that a replica's start (the scale from zero) pays for no import of ours."""

from __future__ import annotations

from typing import Any


def hello(request: Any) -> str:
    return f"hello, {request.query_params.get('name', 'world')}\n"


async def hello_async(request: Any) -> str:
    """`hello` as a coroutine: our worker calls it on its loop, where it calls `hello` (a plain
    function) in a thread."""
    return hello(request)
