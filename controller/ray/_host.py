"""The Ray actor that hosts one replica of a user's class (RayRuntime's counterpart of the
LocalRuntime worker process).

It is an async actor, so that its monitor call, health checks and drains are answered while the
user's code works: sync user methods run in a thread, async ones under trio in a thread of their
own (``_trio_thread``), as in LocalRuntime's worker. Everything crossing the wire is JSON text:
the spec in, one reply object out (``{"ok": true, ...}`` or ``{"ok": false, "error_type",
"message"}``), so that user errors arrive as data, never as pickled exceptions.

Fencing (``Runtime.fence``): each command carries its controller's epoch; the actor remembers the
highest one that has commanded it (its start and an adoption set it through ``ready``, any higher
command raises it) and refuses readiness, reconfigure, health check, drain and stop from a lower
one with ``{"ok": false, "fenced": <its epoch>}``. The check and the raise are one step of the
actor's event loop (no await between them). A stop is the actor's own decision: once it has
accepted one it is committed to ending (the runtime then kills it with ``ray.kill``, and it ends
itself should that not come) and refuses every later command, adoption included, as
``ReplicaStopping``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, final

import ray
import trio

from .._local.logs import read_log
from .._local.own_load import read_load
from .._model.records.code_report import CodeReport
from .._ports.context import ReplicaContext, set_context
from .._ports.hosting import describe_error, tracebacks
from .._routing.sources import HTTPSource
from .._serving import handles
from .._serving.entry import build
from .._serving.multiplex import process_shelf
from .._serving.server import ReplicaServer, serving_line
from ._trio_thread import TrioThread

_CONTRACT = ("reconfigure", "check_health", "drain", "load")
#: How long an actor that accepted a stop waits for the runtime's ``ray.kill`` before it ends
#: itself (should the controller vanish in between).
_SELF_EXIT_S = 30.0


def _describe(exc: BaseException) -> dict[str, Any]:
    whole, shown = tracebacks(exc)
    sys.stderr.write(whole)  # into the actor's log, as the worker of LocalRuntime does
    return {"ok": False, **describe_error(exc, shown)}


#: The replica's async methods run here, under trio, as in LocalRuntime's worker.
_TRIO = TrioThread()


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await _TRIO.run(fn, *args)
    result = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(result):

        async def finish() -> Any:
            return await result

        return await _TRIO.run(finish)
    return result


async def _serve(
    server: ReplicaServer, host: str, port: int, *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    """The replica's HTTP server, a service of the actor's trio loop. A failure to start is
    the start's; one once it serves is said in the log and ends only the server (the loop
    goes on serving the replica's other calls)."""
    try:
        await server.run(host, port, task_status=task_status)
    except Exception as exc:
        if not server.up:
            raise
        _describe(exc)


async def _configure_handles(url: str, token: str, host: str) -> None:
    """The actor's handles follow the daemon's watch, and try replicas at its node first."""
    handles.configure(lambda: HTTPSource(url, token), prefer_host=host)


def free_port(host: str) -> int:
    # Bind-and-release, as LocalRuntime does: a port taken meanwhile shows as a failed start.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


@final
class ReplicaHost:
    """Built by RayRuntime as a named, detached actor; not meant to be used directly."""

    def __init__(self, spec_json: str) -> None:
        # One log a replica, as LocalRuntime keeps: its stderr (tracebacks) into the file Ray
        # gave its stdout (which Ray's own log tools still follow).
        with contextlib.suppress(OSError):
            os.dup2(1, 2)
        self._spec: dict[str, Any] = json.loads(spec_json)
        self._instance: Any = None
        # For code the actor serves (a function, a callable class, an ASGI app): its HTTP
        # server, on the replica's address, run by the trio loop.
        self._server: ReplicaServer | None = None
        # Started by the first ready() call, shared by every later one: a controller that adopts
        # this actor after a crash waits for the same build rather than starting another.
        self._build: asyncio.Task[dict[str, Any]] | None = None
        self._drain: asyncio.Task[dict[str, Any]] | None = None
        # One reconfigure at a time: a controller restarted during one sends it again, and
        # user code must never see two at once.
        self._reconfiguring = asyncio.Lock()
        # The highest epoch that has commanded this actor (0: none fenced), and whether it has
        # accepted a stop.
        self._epoch = 0
        self._stopping = False
        # The replica's own load() as last read (by `read_load`, in the trio thread), the
        # requests its server answered (code it serves), and a number that grows with each
        # change, for `load_changed` to wait on.
        self._load: int | None = None
        self._served: int | None = None
        self._code: dict[str, Any] | None = None
        self._load_seq = 0
        self._load_moved = asyncio.Event()
        self._load_reader: asyncio.Future[Any] | None = None

    def _refused(self, epoch: int) -> str | None:
        """None if a command from `epoch` may go on (raising the actor's epoch to it), else the
        reply that refuses it."""
        if self._stopping:
            return json.dumps(
                {"ok": False, "error_type": "ReplicaStopping", "message": "it accepted a stop"}
            )
        if epoch < self._epoch:
            return json.dumps({"ok": False, "fenced": self._epoch})
        self._epoch = epoch
        return None

    async def ready(self, epoch: int = 0) -> str:
        """Build the replica once; the reply names where it serves. A start or an adoption."""
        refused = self._refused(epoch)
        if refused is not None:
            return refused
        if self._build is None:
            self._build = asyncio.ensure_future(self._do_build())
        return json.dumps(await asyncio.shield(self._build))

    async def _do_build(self) -> dict[str, Any]:
        spec = self._spec
        host = spec["host"] or ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        port = free_port(host)
        set_context(ReplicaContext(spec["tag"], spec["backend"], spec["version"], port, host))
        try:
            # The import too, in a thread: the actor keeps answering while it runs.
            entry = await asyncio.to_thread(build, spec)
            self._instance = entry.instance
            if spec["user_config"] is not None:
                reconfigure = getattr(self._instance, "reconfigure", None)
                if reconfigure is not None:
                    await _call(reconfigure, spec["user_config"])
            routes = spec.get("routes")
            if routes is not None:  # the daemon's API and route token, for handles
                await _TRIO.run(_configure_handles, str(routes[0]), str(routes[1]), host)
            if entry.served:
                serving = spec.get("serving", {})
                self._server = ReplicaServer(
                    entry,
                    max_ongoing_requests=serving.get("max_ongoing_requests", 100),
                    request_timeout_s=serving.get("request_timeout_s", 60.0),
                    shelf=process_shelf(),
                )
                # Listening before it counts as ready: routers send at once.
                await _TRIO.start(_serve, self._server, host, port)
                print(serving_line({**spec, "host": host, "port": port}, entry), flush=True)
        except Exception as exc:
            return _describe(exc)
        node_id = ray.get_runtime_context().get_node_id()
        methods = [m for m in _CONTRACT if callable(getattr(self._instance, m, None))]
        if self._server is not None and "load" not in methods:
            methods.append("load")  # its server's count of the requests it holds
        return {
            "ok": True,
            "address": f"{host}:{port}",
            "node_id": node_id,
            "pid": os.getpid(),
            "resources": spec["resources"],
            "methods": methods,
        }

    async def _user(self, name: str, *args: Any) -> str:
        if self._build is None:
            return json.dumps(_describe(RuntimeError("the replica was never started")))
        built = await asyncio.shield(self._build)
        if not built["ok"]:
            return json.dumps(built)
        method = getattr(self._instance, name, None)
        if method is None:
            return json.dumps({"ok": True})  # every method of the contract is optional
        try:
            await _call(method, *args)
        except Exception as exc:
            return json.dumps(_describe(exc))
        return json.dumps({"ok": True})

    async def reconfigure(self, user_config_json: str, epoch: int = 0) -> str:
        async with self._reconfiguring:
            # Checked once it is this call's turn: an adoption may have come while it waited.
            refused = self._refused(epoch)
            if refused is not None:
                return refused
            return await self._user("reconfigure", json.loads(user_config_json))

    async def check_health(self, epoch: int = 0) -> str:
        # Fenced as well: a stale leader learns at its next check that it is stale.
        refused = self._refused(epoch)
        if refused is not None:
            return refused
        problem = None if self._server is None else self._server.problem()
        if problem is not None:  # code it serves that cannot serve: replaced
            return json.dumps({"ok": False, "error_type": "HandlersStuck", "message": problem})
        return await self._user("check_health")

    async def drain(self, epoch: int = 0) -> str:
        refused = self._refused(epoch)
        if refused is not None:
            return refused
        # Idempotent: a restarted controller finishing a stop waits for the drain in progress.
        if self._drain is None:
            self._drain = asyncio.ensure_future(self._drain_once())
        return json.dumps(await asyncio.shield(self._drain))

    async def _drain_once(self) -> dict[str, Any]:
        if self._server is not None:
            # The requests under way end, then it stops listening; the user's drain after.
            await _TRIO.run(self._server.drain)
        reply: dict[str, Any] = json.loads(await self._user("drain"))
        return reply

    async def stop(self, epoch: int = 0) -> str:
        """Accept a stop from `epoch`, or refuse it. Accepted, the actor takes no other command
        and ends itself after `_SELF_EXIT_S` unless the runtime's ``ray.kill`` comes first.
        (``ray.actor.exit_actor`` would not do: it waits for the calls under way, and the
        monitor's ``wait_until_dead`` never ends; and its caller gets no reply.)"""
        if self._stopping:
            return json.dumps({"ok": True})  # a stop said again: the runtime kills it
        refused = self._refused(epoch)
        if refused is not None:
            return refused
        self._stopping = True
        asyncio.get_running_loop().call_later(_SELF_EXIT_S, os._exit, 0)
        return json.dumps({"ok": True})

    async def load_changed(self, seq: int) -> str:
        """Answers once the replica's own ``load()`` says something new since `seq` (0: at its
        first figure): ``{"seq", "load"}``, the load None while it says nothing usable; or
        ``{"none": true}`` for a class without ``load()``. Read every 0.1 s in the actor, as
        LocalRuntime's worker reads it, so the runtime's one call waits without polling."""
        if self._build is None:
            return json.dumps({"none": True})
        built = await asyncio.shield(self._build)
        if not built["ok"] or "load" not in built["methods"]:
            return json.dumps({"none": True})
        if self._load_reader is None:
            loop = asyncio.get_running_loop()

            async def said(
                count: int | None, served: int | None = None, code: CodeReport | None = None
            ) -> None:
                said = None if code is None else code.to_json()
                loop.call_soon_threadsafe(self._loaded, count, served, said)

            if self._server is not None and not callable(getattr(self._instance, "load", None)):
                reading = _TRIO.run(self._server.follow_load, said)
            else:
                reading = _TRIO.run(read_load, self._instance, said)
            self._load_reader = asyncio.ensure_future(reading)
        while self._load_seq <= seq:
            await self._load_moved.wait()
        told: dict[str, Any] = {"seq": self._load_seq, "load": self._load, "served": self._served}
        if self._code is not None:
            told.update(self._code)
        return json.dumps(told)

    def _loaded(
        self, count: int | None, served: int | None = None, code: dict[str, Any] | None = None
    ) -> None:
        now = (count, served, code)
        if now == (self._load, self._served, self._code) and self._load_seq > 0:
            return
        self._load, self._served, self._code = now
        self._load_seq += 1
        self._load_moved.set()
        self._load_moved = asyncio.Event()

    async def read_log(self, offset: int | None = None, tail: int = 100) -> str:
        """The replica's log (``controller logs``): the last `tail` lines, or what follows
        `offset`; JSON ``{"text", "offset"}``, or null without one."""
        try:
            path = Path(os.readlink("/proc/self/fd/1"))
        except OSError:
            return json.dumps(None)
        chunk = await asyncio.to_thread(read_log, path, offset=offset, tail=tail)
        return json.dumps(None if chunk is None else {"text": chunk.text, "offset": chunk.offset})

    async def wait_until_dead(self) -> None:
        """Never returns: the call fails with RayActorError when the actor dies, which is how
        the runtime learns of the death without polling."""
        await asyncio.Event().wait()
