"""The worker process behind LocalRuntime: hosts one replica of a user's class.

Started as ``python -m controller.worker SPEC_FILE``, or forked by the fork server
(``_zygote_main``), which then calls `run` as that command would. The runtime binds its Unix
socket first, so it can reach the worker while the class is still being built; the worker then
imports the entrypoint, builds the class and applies the user config. It answers requests (one
JSON object per line) until it is killed; it never exits on its own, so a restarted controller
can find it and adopt it.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, final

import trio

from ._context import ReplicaContext, set_context
from ._hosting import construct, describe_error
from ._wire import LineStream, WireError
from ._worker_logs import DEFAULT_MAX_BYTES, capture_output


def _describe(exc: BaseException) -> dict[str, str]:
    """The user's exception as the runtime reports it: type, message and traceback (which
    also goes to the worker's log)."""
    text = "".join(traceback.format_exception(exc))
    sys.stderr.write(text)
    return describe_error(exc, text)


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a user method, sync or async. Sync code runs in a thread so the worker stays
    responsive (pings, drains) while it works."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    result = await trio.to_thread.run_sync(lambda: fn(*args))
    if inspect.isawaitable(result):
        return await result
    return result


@final
class Worker:
    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self.instance: Any = None
        self.ready = trio.Event()
        self.init_error: dict[str, str] | None = None
        # One reconfigure at a time: a controller restarted during one sends it again, and
        # user code must never see two at once.
        self.reconfiguring = trio.Lock()
        self.monitors: set[LineStream] = set()
        """The runtime's monitor connections: where the replica's own load is pushed."""
        self.load: int | None = None

    async def build(self) -> None:
        try:
            # The import too, in the thread: the worker keeps answering (hello, monitor) while
            # a slow import runs.
            self.instance = await trio.to_thread.run_sync(construct, self.spec)
            if self.spec.get("user_config") is not None:
                reconfigure = getattr(self.instance, "reconfigure", None)
                if reconfigure is not None:
                    await _call(reconfigure, self.spec["user_config"])
        except Exception as exc:
            self.init_error = _describe(exc)
        self.ready.set()

    async def handle(self, stream: trio.SocketStream) -> None:
        lines = LineStream(stream)
        try:
            while True:
                request = await lines.receive()
                if request.get("op") == "monitor":
                    await self.monitor(lines)
                    return
                await lines.send(await self.answer(request))
        except (WireError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the runtime hung up; a monitor connection ends only this way
        finally:
            with trio.CancelScope(shield=True):
                await lines.aclose()

    async def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "hello":
            state = (
                "starting" if not self.ready.is_set() else "failed" if self.init_error else "ready"
            )
            return {"ok": True, "tag": self.spec["tag"], "pid": os.getpid(), "state": state}
        if op == "wait_ready":
            await self.ready.wait()
            if self.init_error is not None:
                return {"ok": False, **self.init_error}
            return {"ok": True}
        if op not in ("reconfigure", "check_health", "drain"):
            return {"ok": False, "error_type": "ProtocolError", "message": f"unknown op {op!r}"}
        await self.ready.wait()
        if self.init_error is not None:
            return {"ok": False, **self.init_error}
        method = getattr(self.instance, op, None)
        if method is None:
            return {"ok": True}  # every method of the contract is optional
        try:
            if op == "reconfigure":
                async with self.reconfiguring:
                    await _call(method, request.get("user_config"))
            else:
                await _call(method)
        except Exception as exc:
            return {"ok": False, **_describe(exc)}
        return {"ok": True}

    async def monitor(self, lines: LineStream) -> None:
        """A monitor connection: never answered, so that its end tells the runtime the process
        ended; it carries the replica's own load, when that changes. Returns when the runtime
        hangs up (raising, as a closed connection does)."""
        self.monitors.add(lines)
        try:
            if self.load is not None:
                await lines.send({"load": self.load})  # a restarted controller hears it at once
            await lines.receive()  # the runtime sends nothing more: this waits for its hang-up
        finally:
            self.monitors.discard(lines)

    async def push_load(self) -> None:
        """For a replica with a ``load()`` method: call it every `LOAD_SAMPLE_S`, and push what
        it returns (requests it holds, a whole number >= 0, at most `MAX_LOAD`) to the runtime
        when it changes; ``null`` once it raises or returns anything else, so that a stale
        figure does not hold the backend where it was."""
        method = getattr(self.instance, "load", None)
        if not callable(method):
            return
        complained = False
        while True:
            count: int | None = None
            try:
                value = await _call(method)
            except Exception as exc:
                if not complained:
                    complained = True
                    _describe(exc)  # once, in the replica's log
            else:
                if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                    count = min(value, MAX_LOAD)
            if count != self.load:
                self.load = count
                for lines in list(self.monitors):
                    with contextlib.suppress(
                        WireError, trio.BrokenResourceError, trio.ClosedResourceError
                    ):
                        await lines.send({"load": count})
            await trio.sleep(LOAD_SAMPLE_S)


#: How often a replica's own ``load()`` is read (in its own process, on its own thread), and
#: the most it may say (as an ingress's report: past it is a bug, not a load).
LOAD_SAMPLE_S = 0.1
MAX_LOAD = 2**31 - 1


async def serve(spec: dict[str, Any]) -> None:
    set_context(ReplicaContext(spec["tag"], spec["backend"], spec["version"], spec["port"]))
    worker = Worker(spec)
    # The runtime bound and listened on the socket before starting us and handed it over, so
    # it could connect from the first instant; it stays connectable exactly while we live.
    sock = trio.socket.fromfd(spec["listen_fd"], trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    os.close(spec["listen_fd"])  # fromfd duplicated it
    listener = trio.SocketListener(sock)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, worker.handle, [listener])
        await worker.build()
        if worker.init_error is None:
            nursery.start_soon(worker.push_load)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m controller.worker SPEC_FILE")
    run(sys.argv[1])


def run(spec_path: str, listen_fd: int | None = None) -> None:
    """Host the replica that the spec file describes, until killed. `listen_fd` is the
    listening socket if not the spec's (a worker forked by the fork server receives it under
    a number of its own)."""
    with open(spec_path) as f:
        spec = json.load(f)
    if listen_fd is not None:
        spec["listen_fd"] = listen_fd
    if spec.get("log"):
        capture_output(Path(spec["log"]), int(spec.get("log_max_bytes", DEFAULT_MAX_BYTES)))
    trio.run(serve, spec)
