"""The serving benchmark's FastAPI application (``bench/serve_bench.py``): a couple of JSON
routes, one with a path parameter, a query parameter and a response model, as a small service
has them. Served by our worker (a backend whose entrypoint is ``serve_fastapi:app``) and by
``uvicorn serve_fastapi:app``; the benchmark loads ``GET /items/{id}?q=...``."""

from __future__ import annotations

from typing import Any

# The bench session installs FastAPI; the typecheck session may not have it (then it is Any).
from fastapi import FastAPI  # type: ignore[import-not-found, unused-ignore]
from pydantic import BaseModel


class Item(BaseModel):
    item_id: int
    name: str
    q: str | None = None
    tags: list[str] = []


async def health() -> dict[str, str]:
    return {"status": "ok"}


async def read_item(item_id: int, q: str | None = None) -> Item:
    return Item(item_id=item_id, name=f"item {item_id}", q=q, tags=["a", "b"])


async def create_item(item: Item) -> Item:
    return item


app: Any = FastAPI(title="serve_bench")
# Routes added without the decorators, so that the module is typed whether or not FastAPI is.
app.add_api_route("/healthz", health, methods=["GET"])
app.add_api_route("/items/{item_id}", read_item, methods=["GET"], response_model=Item)
app.add_api_route("/items", create_item, methods=["POST"], response_model=Item)
