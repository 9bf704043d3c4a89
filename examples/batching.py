"""Dynamic batching (docs/batching.md): requests that arrive within 20 ms of each other
run as one call of ``predict``, as a model runs a batch on a GPU. Run with
examples/batching.toml."""

from __future__ import annotations

from typing import Any

import trio

import controller
from controller import Request
from controller.worker import context


class Scorer:
    """``GET /score?text=...``: the text's score, and the size of the batch it ran in."""

    @controller.batch(max_batch_size=16, batch_wait_timeout_s=0.02)
    async def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        await trio.sleep(0.05)  # a model's forward pass: about the same for 1 item or 16
        return [{"text": t, "score": len(t) % 7, "batch": len(texts)} for t in texts]

    async def __call__(self, request: Request) -> dict[str, Any]:
        answer = await self.predict(request.query_params.get("text", ""))
        return {**answer, "replica": context().tag}
