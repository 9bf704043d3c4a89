"""The model benchmark's replicas (bench/model_bench.py), ours and Ray Serve's alike: the same
toy model, the same bookkeeping, only the decorators differ.

- **The toy** (``Toy``): ``np.tanh(W @ X)`` with ``W`` a 4096 x 4096 float32 matrix (64 MiB, its
  "weights"). By default it runs at a fixed width of 16 columns whatever the batch (the inputs,
  zero-padded), as a model compiled for a static batch shape does: one call costs about the
  same for 1 input as for 16, which is the toy the issue asks for. (On this kind of CPU a plain
  ``W @ X`` does not: 1 column goes through BLAS's gemv, 2.6 times cheaper than 16 through gemm;
  ``width="plain"`` runs that instead.) Each request's input is the replica's fixed vector.
- ``Batched`` (``@controller.batch(max_batch_size=16, batch_wait_timeout_s=0.005)``) and
  ``Unbatched`` (one call of the toy per request): ``GET /...`` answers ``{"y": ..., "batch":
  n}``, ``GET /.../stats`` the calls and items so far.
- ``Models`` (``@controller.multiplexed(max_models_per_replica=4)``): a request naming a model
  (``x-model-id``) is answered with that model, loaded on demand (0.2 s of sleep, then its own
  256 x 256 ``W`` seeded by its id); a request naming none with the replica's own model, built
  in ``__init__`` (the single-model baseline). Its answer says whether the model was **held**:
  the loader returned the very object the replica had loaded and not evicted before the
  request asked (a model evicted meanwhile, or still loading, is a miss).
- ``serve_apps()``: the same three as Ray Serve deployments (``@serve.batch``,
  ``@serve.multiplexed(max_num_models_per_replica=4)``, the model id from
  ``serve.get_multiplexed_model_id()``). Serve calls an evicted model's ``__del__``; ours calls
  its ``unload()``: both forget it the same way.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

import numpy as np
import numpy.typing as npt
import trio

import controller
from controller import Request

#: The toy's matrix: DIM x DIM float32.
DIM = 4096
#: The width the toy runs at (``width="fixed"``): the batch, zero-padded to it.
WIDTH = 16
#: The most items a batch holds, and how long the first waits for others (both systems).
MAX_BATCH = 16
BATCH_WAIT_S = 0.005
#: The multiplexed models: each one's matrix, and what a load costs beyond building it.
MODEL_DIM = 256
LOAD_S = 0.2
MODELS_PER_REPLICA = 4
#: The replicas' ``max_ongoing_requests`` (ours in the manifest, Serve's on its deployments).
MAX_ONGOING = 32

Vector = npt.NDArray[np.float32]


class Toy:
    """The batching benchmark's model."""

    def __init__(self, width: str = "fixed") -> None:
        if width not in ("fixed", "plain"):
            raise ValueError(f"width: 'fixed' or 'plain', not {width!r}")
        rng = np.random.default_rng(0)
        self.w = rng.standard_normal((DIM, DIM), dtype=np.float32) / np.float32(DIM**0.5)
        self.x = rng.standard_normal(DIM, dtype=np.float32)
        self.fixed = width == "fixed"
        self.calls = 0
        self.items = 0
        self.model_s = 0.0

    def run(self, xs: list[Vector]) -> list[float]:
        """One call of the model on `xs` (at most WIDTH of them): one number per input."""
        began = time.perf_counter()
        n = len(xs)
        if self.fixed:
            x = np.zeros((DIM, WIDTH), dtype=np.float32)
            x[:, :n] = np.stack(xs, axis=1)
        else:
            x = np.stack(xs, axis=1)
        y = np.tanh(self.w @ x)
        out = [float(v) for v in y[:, :n].sum(axis=0)]
        self.calls += 1
        self.items += n
        self.model_s += time.perf_counter() - began
        return out

    def stats(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "items": self.items,
            "model_s": self.model_s,
            "pid": os.getpid(),
            "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        }


class Batched:
    """The toy behind ``@controller.batch``: one call per batch."""

    def __init__(self, width: str = "fixed") -> None:
        self.toy = Toy(width)

    @controller.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=BATCH_WAIT_S)
    async def predict(self, xs: list[Vector]) -> list[dict[str, Any]]:
        return [{"y": y, "batch": len(xs)} for y in self.toy.run(xs)]

    async def __call__(self, request: Request) -> dict[str, Any]:
        if request.path.endswith("/stats"):
            return self.toy.stats()
        answer: dict[str, Any] = await self.predict(self.toy.x)
        return answer


class Unbatched:
    """The toy called once per request."""

    def __init__(self, width: str = "fixed") -> None:
        self.toy = Toy(width)

    async def __call__(self, request: Request) -> dict[str, Any]:
        if request.path.endswith("/stats"):
            return self.toy.stats()
        return {"y": self.toy.run([self.toy.x])[0], "batch": 1}


# -- many models ---------------------------------------------------------------------------


class Shelf:
    """What a replica has loaded and not evicted (by the replica's own account, the same for
    both systems), and how many loads it began."""

    def __init__(self) -> None:
        self.models: dict[str, Model] = {}
        self.loads = 0

    def answer(self, model: Model, before: Model | None) -> dict[str, Any]:
        return {
            "model": model.name,
            "hit": model is before,
            "y": model.predict(),
            "replica": os.getpid(),
            "loads": self.loads,
            "held": len(self.models),
        }


class Model:
    """One of the many models: a matrix of its own, seeded by its id."""

    def __init__(self, name: str, shelf: Shelf | None = None) -> None:
        self.name = name
        seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
        rng = np.random.default_rng(seed)
        self.w = rng.standard_normal((MODEL_DIM, MODEL_DIM), dtype=np.float32)
        self.x = np.ones(MODEL_DIM, dtype=np.float32) / np.float32(MODEL_DIM)
        self.shelf = shelf
        if shelf is not None:
            shelf.models[name] = self

    def predict(self) -> float:
        return float(np.tanh(self.w @ self.x).sum())

    def forget(self) -> None:
        """Evicted: off its replica's shelf (if this very object is still on it)."""
        if self.shelf is not None and self.shelf.models.get(self.name) is self:
            del self.shelf.models[self.name]

    async def unload(self) -> None:
        """Ours calls it on eviction (async: before any other task runs, so no request can
        see the model on the shelf once the cache has let it go)."""
        self.forget()


class Models:
    """Many models over the replicas, 4 held by each."""

    def __init__(self) -> None:
        self.shelf = Shelf()
        self.base = Model("base")  # the single-model baseline's

    @controller.multiplexed(max_models_per_replica=MODELS_PER_REPLICA)
    async def get_model(self, model_id: str) -> Model:
        self.shelf.loads += 1
        await trio.sleep(LOAD_S)
        return Model(model_id, self.shelf)

    async def __call__(self, request: Request) -> dict[str, Any]:
        name = controller.model_id()
        if name is None:
            return self.shelf.answer(self.base, self.base)
        before = self.shelf.models.get(name)
        model: Model = await self.get_model()
        return self.shelf.answer(model, before)


# -- Ray Serve's -----------------------------------------------------------------------------


def serve_apps(width: str = "fixed", models_replicas: int = 8) -> dict[str, Any]:
    """Ray Serve's three, bound, by app name (imported only where Ray Serve is installed)."""
    import asyncio

    from ray import serve

    options: dict[str, Any] = {
        "max_ongoing_requests": MAX_ONGOING,
        "ray_actor_options": {"num_cpus": 0.25},
    }

    @serve.deployment(name="Batched", num_replicas=1, **options)
    class ServeBatched:
        def __init__(self, width: str) -> None:
            self.toy = Toy(width)

        @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=BATCH_WAIT_S)
        async def predict(self, xs: list[Vector]) -> list[dict[str, Any]]:
            return [{"y": y, "batch": len(xs)} for y in self.toy.run(xs)]

        async def __call__(self, request: Any) -> dict[str, Any]:
            if request.url.path.endswith("/stats"):
                return self.toy.stats()
            answer: dict[str, Any] = await self.predict(self.toy.x)
            return answer

    @serve.deployment(name="Unbatched", num_replicas=1, **options)
    class ServeUnbatched:
        def __init__(self, width: str) -> None:
            self.toy = Toy(width)

        async def __call__(self, request: Any) -> dict[str, Any]:
            if request.url.path.endswith("/stats"):
                return self.toy.stats()
            return {"y": self.toy.run([self.toy.x])[0], "batch": 1}

    class ServeModel(Model):
        def __del__(self) -> None:
            # Serve calls it on eviction (and Python again when the object goes): idempotent.
            self.forget()

    @serve.deployment(name="Models", num_replicas=models_replicas, **options)
    class ServeModels:
        def __init__(self) -> None:
            self.shelf = Shelf()
            self.base = Model("base")

        @serve.multiplexed(max_num_models_per_replica=MODELS_PER_REPLICA)  # type: ignore[untyped-decorator]
        async def get_model(self, model_id: str) -> Model:
            self.shelf.loads += 1
            await asyncio.sleep(LOAD_S)
            return ServeModel(model_id, self.shelf)

        async def __call__(self, request: Any) -> dict[str, Any]:
            name = serve.get_multiplexed_model_id()
            if not name:
                return self.shelf.answer(self.base, self.base)
            before = self.shelf.models.get(name)
            model: Model = await self.get_model(name)
            return self.shelf.answer(model, before)

    return {
        "batched": ServeBatched.bind(width),  # type: ignore[attr-defined]
        "plain": ServeUnbatched.bind(width),  # type: ignore[attr-defined]
        "models": ServeModels.bind(),  # type: ignore[attr-defined]
    }
