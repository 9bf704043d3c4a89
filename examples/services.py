"""Two backends that call each other (docs/handles-and-applications.md):
``embed`` turns text into a vector, ``search`` (routed at ``/search``) ranks documents by
calling it through a handle. Run with examples/services.toml."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

from controller import Request
from controller.worker import context, handle

DOCS = [
    "structured concurrency with trio nurseries",
    "cancel scopes end a whole tree of tasks",
    "ray actors run on a cluster of machines",
    "a rolling update replaces replicas a few at a time",
    "consistent hashing keeps a session on one replica",
]


class Embedder:
    """A stand-in for a model: a word's vector is drawn from its hash."""

    def __init__(self, dims: int = 8) -> None:
        self.dims = dims

    def embed(self, text: str) -> list[float]:
        vector = [0.0] * self.dims
        for word in text.lower().split():
            digest = hashlib.blake2b(word.encode(), digest_size=self.dims).digest()
            for i, byte in enumerate(digest):
                vector[i] += byte / 255 - 0.5
        return vector

    async def embed_each(self, texts: list[str]) -> AsyncIterator[list[float]]:
        """A generator method: a caller's ``call_stream`` gets each vector as it is made."""
        for text in texts:
            yield self.embed(text)


class Search:
    """``GET /search?q=...``: the documents nearest the query, by the embedder's vectors."""

    def __init__(self) -> None:
        self.doc_vectors: list[list[float]] = []

    async def __call__(self, request: Request) -> dict[str, Any]:
        embed = handle("embed")
        if not self.doc_vectors:  # once a replica: every document's vector, streamed
            async with embed.call_stream("embed_each", DOCS) as vectors:
                self.doc_vectors = [vector async for vector in vectors]
        query = request.query_params.get("q", "")
        # One call to another backend: routed, its deadline what this request has left.
        wanted = await embed.embed(query)
        scores = [sum(a * b for a, b in zip(wanted, v, strict=True)) for v in self.doc_vectors]
        best = max(range(len(DOCS)), key=scores.__getitem__)
        return {"query": query, "best": DOCS[best], "served_by": context().tag}
