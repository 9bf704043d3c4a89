"""An asyncio web app (aiohttp) whose endpoints deploy and scale backends through an embedded
controller. The two ways of embedding differ only in how the controller is opened; see
``aio_guest_app.py`` (trio as a guest of asyncio) and ``aio_trio_asyncio_app.py`` (trio-asyncio).

    PUT  /backends/{name}?replicas=N   deploy the echo replica with N replicas, wait, report
    GET  /backends                     every backend's state and message
    DELETE /backends/{name}            drain and delete
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

import controller
from controller.aio import AioController

HERE = Path(__file__).parent
log = logging.getLogger("aio_app")
ECHO = controller.ReplicaConfig("echo_replica:Echo", init_kwargs={"work_ms": 1})
CONTROLLER: web.AppKey[AioController] = web.AppKey("controller", AioController)


def make_app(ctl: AioController) -> web.Application:
    app = web.Application()
    app[CONTROLLER] = ctl
    app.add_routes(
        [
            web.put("/backends/{name}", deploy),
            web.get("/backends", listing),
            web.delete("/backends/{name}", delete),
        ]
    )
    return app


async def deploy(request: web.Request) -> web.Response:
    ctl = request.app[CONTROLLER]
    name = request.match_info["name"]
    try:
        replicas = int(request.query.get("replicas", "1"))
        config = controller.BackendConfig(num_replicas=replicas, version="v1")
    except (ValueError, controller.ConfigError) as exc:
        return web.json_response({"error": str(exc)}, status=422)
    try:
        goal = await ctl.deploy(name, config, ECHO)
        outcome = await goal.wait()  # the request waits for the replicas, in asyncio
    except controller.ControllerError as exc:
        return web.json_response({"error": f"{type(exc).__name__}: {exc}"}, status=409)
    status = ctl.status(name)
    return web.json_response({"outcome": outcome.value, "message": status.message})


async def listing(request: web.Request) -> web.Response:
    ctl = request.app[CONTROLLER]
    return web.json_response(
        {b.name: {"state": b.state.value, "message": b.message} for b in ctl.status().backends}
    )


async def delete(request: web.Request) -> web.Response:
    ctl = request.app[CONTROLLER]
    try:
        goal = await ctl.delete(request.match_info["name"])
    except controller.UnknownBackendError as exc:
        return web.json_response({"error": str(exc)}, status=404)
    await goal.wait()
    return web.json_response({"deleted": request.match_info["name"]})


@asynccontextmanager
async def serving(ctl: AioController, port: int) -> AsyncIterator[str]:
    """The web app on 127.0.0.1:`port` (0: any free port); yields its base URL."""
    runner = web.AppRunner(make_app(ctl))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    server = site._server
    assert isinstance(server, asyncio.Server)
    bound = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{bound}"
    finally:
        await runner.cleanup()


async def demo(base: str) -> None:
    """Drive the app as a client would: deploy, scale, list, delete."""
    async with aiohttp.ClientSession() as http:

        async def call(method: str, path: str) -> Any:
            async with http.request(method, base + path) as response:
                body = await response.json()
                log.info("%s %s -> %d %s", method, path, response.status, body)
                return body

        await call("PUT", "/backends/echo?replicas=2")
        await call("PUT", "/backends/echo?replicas=3")
        await call("GET", "/backends")
        await call("DELETE", "/backends/echo")


async def run(ctl: AioController, port: int, demo_only: bool) -> None:
    async with serving(ctl, port) as base:
        log.info("serving on %s", base)
        if demo_only:
            await demo(base)
            return
        await asyncio.Event().wait()  # until Ctrl-C cancels us


def runtime_and_store(tmp: str) -> tuple[controller.LocalRuntime, controller.SQLiteStore]:
    return (
        controller.LocalRuntime(Path(tmp) / "w", pythonpath=[HERE]),
        controller.SQLiteStore(Path(tmp) / "controller.db"),
    )


def temp_dir() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="aioapp", dir="/tmp")  # short: socket paths


async def clean_up(ctl: AioController) -> None:
    """Drain and delete whatever is left, so that no worker outlives the example."""
    for backend in ctl.status().backends:
        await (await ctl.delete(backend.name)).wait()
