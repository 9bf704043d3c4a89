"""A FastAPI application as a backend: the worker serves it as it is (``pip install fastapi``
first). Its routes are relative to the backend's route_prefix: with ``route_prefix = "/api"``,
``GET /api/items/3`` reaches ``read_item``, as under Ray Serve."""

from __future__ import annotations

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

app = FastAPI()
ITEMS: dict[int, str] = {1: "apple", 2: "pear"}


class Item(BaseModel):
    name: str


@app.get("/items/{item_id}")
async def read_item(item_id: int) -> dict[str, object]:
    if item_id not in ITEMS:
        raise HTTPException(status_code=404, detail=f"no item {item_id}")
    return {"id": item_id, "name": ITEMS[item_id]}


@app.post("/items/{item_id}", status_code=201)
def put_item(item_id: int, item: Item) -> dict[str, object]:
    ITEMS[item_id] = item.name  # a sync endpoint: FastAPI runs it in a thread
    return {"id": item_id, "name": item.name}
