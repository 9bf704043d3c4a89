"""A FastAPI application that needs asyncio itself, served on asyncio by the worker
(``controller.on_asyncio``): its own module, so that only a replica's process imports
trio-asyncio (which changes asyncio for the whole process), never a test's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from controller import on_asyncio


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    await asyncio.sleep(0)  # asyncio in the startup too
    yield {"started_on": type(asyncio.get_running_loop()).__name__}


inner = FastAPI(lifespan=_lifespan)


@inner.get("/sleep")
async def sleep(request: Request, s: float = 0.01) -> dict[str, Any]:
    await asyncio.sleep(s)
    return {"slept": s, "started_on": request.state.started_on}


@inner.get("/stream")
async def stream() -> StreamingResponse:
    async def words() -> AsyncIterator[str]:
        for word in ("one", "two", "three"):
            await asyncio.sleep(0.01)
            yield word + " "

    return StreamingResponse(words(), media_type="text/plain")


app = on_asyncio(inner)
