"""The ingress's budget for uploads: request bodies too large to read before a replica is
chosen, which go on as they arrive. A slow one keeps its replica's connection for as long as it
keeps its rate, so uploads are counted here, per backend and per client address, and not
against ``max_ongoing_requests``: however many a client starts, the requests that use a
replica's room still find it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import final

from .._http.errors import Reply
from ._config import IngressConfig


@final
class Uploads:
    def __init__(self, config: IngressConfig):
        self.config = config
        self.by_backend: dict[str, int] = {}
        self.by_client: dict[str, int] = {}

    @contextmanager
    def held(self, backend: str, client: str) -> Iterator[None]:
        """One upload to `backend` from the address `client`, while the block runs. ``Reply``
        429 if the client has its share under way already, 503 if the backend has."""
        config = self.config
        if self.by_client.get(client, 0) >= config.max_uploads_per_client:
            message = (
                f"this address has max_uploads_per_client={config.max_uploads_per_client}"
                " request bodies larger than buffer_body_bytes under way"
            )
            raise Reply(429, "TooManyUploads", message, cause="client_uploads", retry_after=1)
        if self.by_backend.get(backend, 0) >= config.max_uploads:
            message = (
                f"backend {backend!r} has max_uploads={config.max_uploads} request bodies"
                " larger than buffer_body_bytes under way"
            )
            raise Reply(503, "TooManyUploads", message, cause="uploads", retry_after=1)
        self.by_client[client] = self.by_client.get(client, 0) + 1
        self.by_backend[backend] = self.by_backend.get(backend, 0) + 1
        try:
            yield
        finally:
            _less(self.by_client, client)
            _less(self.by_backend, backend)


def _less(counts: dict[str, int], key: str) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]  # an address gone for good leaves nothing behind
