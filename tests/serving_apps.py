"""Code for the worker to serve, as the tests deploy it: functions, callable classes, generators
and ASGI applications (``serving_apps:NAME``), each answering what the tests check. Some count
what happened to them (cancellations, how many ran at once, health checks) and say so at
``/stats``, so that a test reads a replica's own counts through the ingress."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from fastapi import FastAPI, HTTPException
from fastapi import Request as FastAPIRequest
from pydantic import BaseModel

import controller
from controller import Request, Response
from controller.worker import context

NOT_CALLABLE = 3


def hello(request: Request) -> str:
    return f"hello, {request.query_params.get('name', 'world')}\n"


def no_request() -> str:
    return "nothing asked"


async def describe(request: Request) -> dict[str, Any]:
    """What it was asked: method, path, query, headers, body, and the time it had."""
    body = await request.body()
    return {
        "method": request.method,
        "path": request.path,
        "raw_path": request.url.raw_path,
        "query": request.query_params.multi_items(),
        "b": request.query_params.getlist("b"),
        "header": request.headers.get("X-Thing"),
        "headers": request.headers.getlist("x-many"),
        "cookies": request.cookies,
        "body": body.decode("latin-1"),
        "root_path": request.root_path,
        "time_left": request.time_left(),
        "url": str(request.url),
    }


def sync_body(request: Request) -> dict[str, Any]:
    """A sync handler: called once the body has arrived (``content``)."""
    return {"length": len(request.content), "thread": threading.current_thread().name}


async def json_body(request: Request) -> Any:
    return {"got": await request.json()}


async def streamed_body(request: Request) -> dict[str, int]:
    pieces = sizes = 0
    async for chunk in request.stream():
        pieces += 1
        sizes += len(chunk)
    return {"pieces": pieces, "bytes": sizes}


def shapes(request: Request) -> Any:
    kind = request.query_params["kind"]
    return {
        "str": "text",
        "bytes": b"\x00\x01",
        "dict": {"a": 1},
        "list": [1, 2],
        "none": None,
        "int": 7,
        "response": Response({"made": True}, status_code=201, headers={"x-made": "yes"}),
        "media": Response("<b>hi</b>", media_type="text/html"),
        "bad": object(),
        "bad_header": Response("x", headers={"x-bad": "a\r\nb"}),
        "framing": Response("x", headers={"content-length": "99", "x-ok": "1"}),
        "nan": {"x": float("nan")},
    }[kind]


async def tokens(request: Request) -> AsyncIterator[str]:
    delay = float(request.query_params.get("delay", "0.05"))
    for n in range(int(request.query_params.get("n", "5"))):
        await trio.sleep(delay)
        yield f"token{n} "


def sync_tokens(request: Request) -> Iterator[Any]:
    for n in range(3):
        time.sleep(0.02)
        yield {"n": n}


async def broken_stream(request: Request) -> AsyncIterator[str]:
    yield "first "
    raise RuntimeError("broke mid-stream")


def boom(request: Request) -> str:
    raise ValueError("a failure of the user's own")


def two_args(a: Any, b: Any) -> None:
    pass


def keyword_only(*, request: Request) -> None:
    pass


def with_default(request: Request, greeting: str = "hi") -> str:
    return greeting


def sync_asgi(scope: Any, receive: Any, send: Any) -> None:
    pass


class Counting:
    """Counts its requests: how many are inside at once (and the most ever), how many were
    cancelled, and its health checks. ``/stats`` answers the counts (``?until=NAME&n=N``: once
    that count has reached N, so that a test waits for it without polling); ``/sleep?s=N``
    sleeps; ``/digest?s=N`` reads the body first, then sleeps (what a model does with an upload);
    ``/block?s=N`` blocks its thread (sync); anything else answers at once."""

    def __init__(self) -> None:
        self.inside = 0
        self.most = 0
        self.cancelled = 0
        self.finished = 0
        self.checks = 0
        self.lock = threading.Lock()
        self.moved = trio.Event()

    def _moved(self) -> None:
        self.moved.set()
        self.moved = trio.Event()

    async def __call__(self, request: Request) -> Any:
        path = request.path.rpartition("/")[2]
        if path == "stats":
            until = request.query_params.get("until")
            if until is not None:
                while self.stats()[until] < int(request.query_params["n"]):
                    await self.moved.wait()
            return self.stats()
        if path == "block":
            return await trio.to_thread.run_sync(self._block, float(request.query_params["s"]))
        body = await request.body() if path == "digest" else b""
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        self._moved()
        try:
            if path in ("sleep", "digest"):
                await trio.sleep(float(request.query_params["s"]))
            else:
                await trio.sleep(0.01)
            return {"tag": context().tag, "left": request.time_left(), "bytes": len(body)}
        except trio.Cancelled:
            self.cancelled += 1
            raise
        finally:
            self.finished += 1
            with self.lock:
                self.inside -= 1
            self._moved()

    def _block(self, seconds: float) -> dict[str, Any]:
        time.sleep(seconds)
        return {"blocked": seconds}

    def stats(self) -> dict[str, Any]:
        return {
            "inside": self.inside,
            "most": self.most,
            "cancelled": self.cancelled,
            "finished": self.finished,
            "checks": self.checks,
            "pid": os.getpid(),
            "tag": context().tag,
        }

    def check_health(self) -> None:
        self.checks += 1


class Blocking:
    """A sync handler that blocks its thread (``?s=N``); its health checks are counted."""

    def __init__(self) -> None:
        self.checks = 0

    def __call__(self, request: Request) -> dict[str, Any]:
        seconds = float(request.query_params.get("s", "0"))
        time.sleep(seconds)
        return {"checks": self.checks, "tag": context().tag}

    def check_health(self) -> None:
        self.checks += 1


class Scaled:
    """A callable class built with arguments, reconfigured in place."""

    def __init__(self, scale: int = 1) -> None:
        self.scale = scale
        self.config: Any = None

    async def __call__(self, request: Request) -> dict[str, Any]:
        return {"scale": self.scale, "config": self.config, "tag": context().tag}

    def reconfigure(self, user_config: Any) -> None:
        self.config = user_config


# -- ASGI --

api = FastAPI()


class Item(BaseModel):
    name: str
    price: float = 0.0


@api.get("/items/{item_id}")
async def read_item(item_id: int, q: str | None = None) -> dict[str, Any]:
    if item_id == 0:
        raise HTTPException(status_code=404, detail="no item 0")
    return {"item_id": item_id, "q": q}


@api.post("/items")
def create_item(item: Item) -> dict[str, Any]:
    return {"name": item.name, "price": item.price, "taxed": round(item.price * 1.2, 2)}


@api.get("/fail")
async def fail() -> None:
    raise RuntimeError("an endpoint's own failure")


@api.get("/where")
async def where(request: FastAPIRequest) -> dict[str, Any]:
    return {"path": request.url.path, "root_path": request.scope.get("root_path", "")}


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    yield {"started": os.getpid()}


with_lifespan = FastAPI(lifespan=_lifespan)


@with_lifespan.get("/state")
async def state(request: FastAPIRequest) -> dict[str, Any]:
    return {"started": request.state.started}


@asynccontextmanager
async def _failing(app: FastAPI) -> AsyncIterator[None]:
    _load_model()
    yield


def _load_model() -> None:
    raise RuntimeError("the model file is missing")


failing_startup = FastAPI(lifespan=_failing)


async def raw_asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A bare ASGI application, without lifespan (it raises on other scopes, as the spec lets
    it): answers its path, streamed in two parts."""
    if scope["type"] != "http":
        raise RuntimeError("http only")
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x-raw", b"1")]})
    await send({"type": "http.response.body", "body": scope["path"].encode(), "more_body": True})
    await send({"type": "http.response.body", "body": b"!"})


class AppClass(FastAPI):
    """A class whose instances are ASGI applications, built with init_kwargs."""

    def __init__(self, greeting: str = "hi") -> None:
        super().__init__()

        @self.get("/greet")
        async def greet() -> dict[str, str]:
            return {"greeting": greeting}


def exits(request: Request) -> None:
    """A sync handler that calls sys.exit: an error of its request, not of its replica."""
    raise SystemExit(3)


async def interrupts(request: Request) -> None:
    raise KeyboardInterrupt


async def reads_then_answers(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A bare ASGI app that reads its whole body (none, for a GET), then answers its length."""
    if scope["type"] != "http":
        raise RuntimeError("http only")
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"%d" % len(body)})


async def no_content_asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A bare ASGI app that answers 204 with a body, which must not go out."""
    if scope["type"] != "http":
        raise RuntimeError("http only")
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b"not to be sent"})


def statuses(request: Request) -> Response:
    code = int(request.query_params.get("code", "200"))
    return Response(
        "body!", status_code=code, headers=[("set-cookie", "a=1"), ("set-cookie", "b=2")]
    )


#: Set by a test at its end: what `stuck` waits for (so that no thread outlives the test).
RELEASE = threading.Event()


def stuck(request: Request) -> str:
    """A sync handler that does not return (until the test lets it)."""
    RELEASE.wait(30)
    return "released"


class MultiModel:
    """Multiplexed: holds at most 2 models; each load takes `load_s`, each request `work_s`.
    Answers which replica and model served it, and what the replica loaded so far."""

    def __init__(self, load_s: float = 0.2, work_s: float = 0.0):
        self.load_s, self.work_s = load_s, work_s
        self.loads: list[str] = []
        self.loading: set[str] = set()
        self.overlapping = 0
        """Loads of a model begun while one of the same model ran: must stay 0."""
        self.unloaded: list[str] = []

    @controller.multiplexed(max_models_per_replica=2)
    async def get_model(self, model_id: str) -> dict[str, Any]:
        if model_id in self.loading:
            self.overlapping += 1
        self.loading.add(model_id)
        try:
            await trio.sleep(self.load_s)
        finally:
            self.loading.discard(model_id)
        self.loads.append(model_id)
        return {"name": model_id}

    async def __call__(self, request: Request) -> dict[str, Any]:
        model = await self.get_model()
        await trio.sleep(self.work_s)
        return {
            "model": model["name"],
            "asked": controller.model_id(),
            "replica": context().tag,
            "loads": self.loads,
            "overlapping": self.overlapping,
        }

    async def ask(self, text: str) -> dict[str, Any]:
        """A handle's call: the model its options named."""
        model = await self.get_model()
        return {"model": model["name"], "replica": context().tag, "text": text}
