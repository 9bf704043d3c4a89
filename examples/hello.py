"""The smallest backend: a function. The worker calls it with each request and sends back what
it returns (a str is text; a dict or list, JSON; see docs/backends-as-code.md)."""

from __future__ import annotations

from controller import Request


def hello(request: Request) -> str:
    name = request.query_params.get("name", "world")
    return f"hello, {name}\n"
