"""Streaming answers: a generator's items are sent as it yields them (chunked), as a language
model sends tokens. ``tokens`` streams words; ``events`` the same as server-sent events."""

from __future__ import annotations

from collections.abc import AsyncIterator

import trio

from controller import Request, Response

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]


async def tokens(request: Request) -> AsyncIterator[str]:
    delay = float(request.query_params.get("delay", "0.05"))
    for word in WORDS:
        await trio.sleep(delay)  # stand-in for the next token's work
        yield word + " "
    yield "\n"


async def events(request: Request) -> Response:
    async def sent() -> AsyncIterator[str]:
        for n, word in enumerate(WORDS):
            await trio.sleep(0.05)
            yield f"id: {n}\ndata: {word}\n\n"

    return Response(sent(), media_type="text/event-stream")
