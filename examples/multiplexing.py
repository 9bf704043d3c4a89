"""Model multiplexing (docs/multiplexing.md): each replica holds at most 4 models
and loads the others on demand; the ingress sends a request to a replica that holds the model
its ``x-model-id`` header names. Run with examples/multiplexing.toml."""

from __future__ import annotations

import hashlib
from typing import Any

import trio

import controller
from controller import Request
from controller.worker import context


class Model:
    """A stand-in for a fine-tuned model: its "weights" are derived from its name."""

    def __init__(self, name: str):
        self.name = name
        self.seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")

    def predict(self, text: str) -> int:
        return (self.seed + len(text)) % 1000

    def unload(self) -> None:
        """Called when the replica evicts it to make room (free GPU memory here)."""
        print(f"{context().tag}: unloaded {self.name}", flush=True)


class Models:
    """``GET /predict?text=...`` with ``x-model-id: NAME``: NAME's answer, and which replica
    gave it."""

    @controller.multiplexed(max_models_per_replica=4)
    async def get_model(self, model_id: str) -> Model:
        await trio.sleep(0.5)  # reading its weights from disk
        return Model(model_id)

    async def __call__(self, request: Request) -> dict[str, Any]:
        model = await self.get_model()  # the request's model (its x-model-id)
        return {
            "model": model.name,
            "output": model.predict(request.query_params.get("text", "")),
            "replica": context().tag,
        }
