"""Calling the daemon's ASGI app in process, as hypercorn would: for the API tests."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import trio

import controller
from controller._api.app import Api
from controller._api.metrics import Metrics

# What RFC 3986 lets a path carry unencoded ("/" and its pchar set), and "%": a test's path may
# hold an escape it means to send as written.
_PCHAR = "/!$&'()*+,;=:@-._~%"


async def call(
    app: Api,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    query: bytes = b"",
    token: str | None = None,
    content_type: bytes | None = b"application/json",
    headers: tuple[tuple[bytes, bytes], ...] = (),
    raw_path: bytes | None = None,
    client: tuple[str, int] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One request; its (status, headers, body). `path` is as the server decodes it, `raw_path`
    as it was sent (if not given, `path` encoded as a client would: a "?" in it is part of the
    path, never the start of a query)."""
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await trio.lowlevel.checkpoint()
        sent.append(message)

    sent_headers = list(headers)
    if token is not None:
        sent_headers.append((b"authorization", b"Bearer " + token.encode()))
    if content_type is not None:
        sent_headers.append((b"content-type", content_type))
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": raw_path if raw_path is not None else quote(path, safe=_PCHAR).encode(),
        "query_string": query,
        "headers": sent_headers,
        "client": client,
    }
    await app(scope, receive, send)  # type: ignore[arg-type]
    answered = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    return sent[0]["status"], answered, sent[1]["body"]


TOKEN = "t" * 32


class Client:
    """The app, called in process with the right token unless told otherwise."""

    def __init__(self, app: Api):
        self.app = app

    async def __call__(
        self, method: str, path: str, body: bytes = b"", **options: Any
    ) -> tuple[int, dict[str, str], bytes]:
        options.setdefault("token", TOKEN)
        return await call(self.app, method, path, body, **options)


def api(ctl: controller.Controller, metrics: Metrics | None = None) -> Client:
    render = metrics.render if metrics is not None else (lambda: b"")
    return Client(
        Api(ctl, token=TOKEN, epoch="e", render_metrics=render, request_shutdown=lambda: None)
    )
