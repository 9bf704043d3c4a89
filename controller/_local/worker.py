"""The worker process behind LocalRuntime: hosts one replica of a user's code.

Started as ``python -m controller.worker SPEC_FILE``, or forked by the fork server
(``zygote_main``), which then calls ``worker_process.run`` as that command would. The runtime
binds its Unix socket first, so it can reach the worker while the replica is still being built;
the worker then imports the entrypoint, builds the replica (``_serving.entry``: a function, a
callable class, an ASGI application, or a class that serves its own port) and applies the user
config; for code it serves, it listens on the replica's port (``_serving.server``) before it
counts as ready. It answers the runtime's requests (one JSON object per line) until it is
killed; it never exits on its own, so a restarted controller can find it and adopt it.

Fencing: the worker remembers the highest leader epoch that has commanded it (the spec's, from
its start; an adoption's, ``hello`` with ``adopt``; any command's ``epoch``, which raises it) and
refuses every command from a lower epoch with ``{"ok": false, "fenced": true, "epoch": <its
epoch>}``, which the runtime raises as ``FencedError``: ``wait_ready``, adoption,
``reconfigure``, ``check_health`` (refused too: a stale leader hears at once that it is stale,
and a failing check could only lead it to a kill that is refused anyway), ``drain`` and
``stop``. Each check and the start of the command's effect run without a checkpoint between
them, and a command that waited (for the build, for the reconfigure lock) is checked again
before it acts, so a command is refused whenever a newer leader's adoption reached the worker
first. Plain ``hello`` and ``monitor`` only read, and are answered to anyone. A request
without an ``epoch`` is from epoch 0 (a runtime never fenced, or one from before fencing).

``stop`` is how a kill is asked for: once the worker accepts one it is committed to ending
(every later command but ``hello`` and ``stop`` is refused as ``WorkerStopping``, adoptions
too), the runtime then signals its process group, and should the runtime vanish before it
does, the worker kills its own group after the request's ``grace_s``.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any, final

import trio

from .._model.records.code_report import CodeReport
from .._serving.entry import build
from .._serving.multiplex import process_shelf
from .._serving.server import ReplicaServer, serving_line
from .own_load import read_load
from .user_calls import call, describe, has
from .wire import (
    MONITOR_CHECKS,
    LineStream,
    WireError,
    check_passed,
    encode,
    parse_check_request,
)


@final
class Worker:
    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self.instance: Any = None
        """What the contract's methods (``reconfigure``, ``check_health``, ``drain``,
        ``load``) are looked up on: the user's instance; None for a function."""
        self.server: ReplicaServer | None = None
        """The replica's HTTP server, for code the worker serves."""
        self.ready = trio.Event()
        self.init_error: dict[str, str] | None = None
        # One reconfigure at a time: a controller restarted during one sends it again, and
        # user code must never see two at once.
        self.reconfiguring = trio.Lock()
        self.monitors: dict[LineStream, trio.Lock] = {}
        """The runtime's monitor connections, where the replica's own load is pushed, each with
        the lock its senders take (its own task and `push_load` may both send, and trio lets
        one task at a time send on a stream)."""
        self.load: int | None = None
        self.served: int | None = None
        self.code: CodeReport | None = None
        """The requests its server has answered, as last pushed (code it serves)."""
        epoch = _epoch_of(spec)
        if epoch is None:
            raise ValueError(f"the spec's epoch must be a whole number >= 0: {spec['epoch']!r}")
        self.epoch: int = epoch
        """The highest leader epoch that has commanded this worker (its start's at first)."""
        self.stopping = False
        """Set once a stop is accepted: the worker is ending and takes no other command."""
        self.nursery: trio.Nursery | None = None
        """Where the worker's own tasks run (the stop's safety net, the drain)."""
        self.checking: trio.Event | None = None
        self.check_answer: dict[str, Any] = {"ok": True}
        """The user's check running now (set when it ends), and the answer of the last one."""
        self.drained: trio.Event | None = None
        self.drain_answer: dict[str, Any] = {"ok": True}
        """One drain for the worker's life: a controller that takes over a stop under way asks
        again, and waits for the one running (user code never sees two at once)."""

    async def build(self) -> None:
        try:
            # The import too, in the thread: the worker keeps answering (hello, monitor) while
            # a slow import runs.
            entry = await trio.to_thread.run_sync(build, self.spec)
            self.instance = entry.instance
            if self.spec.get("user_config") is not None:
                reconfigure = getattr(self.instance, "reconfigure", None)
                if reconfigure is not None:
                    await call(reconfigure, self.spec["user_config"])
            if entry.served:
                serving = self.spec.get("serving", {})
                self.server = ReplicaServer(
                    entry,
                    max_ongoing_requests=serving.get("max_ongoing_requests", 100),
                    request_timeout_s=serving.get("request_timeout_s", 60.0),
                    shelf=process_shelf(),
                )
                assert self.nursery is not None
                # Listening before it counts as ready: routers send at once.
                await self.nursery.start(self.server.run, self.spec["host"], self.spec["port"])
                print(serving_line(self.spec, entry), flush=True)  # the replica's log says
        except Exception as exc:
            self.init_error = describe(exc)
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

    def admit(self, request: dict[str, Any], *, take: bool = True) -> dict[str, Any] | None:
        """Check `request`'s epoch: a refusal to answer if it is lower than the highest seen (or
        not an epoch at all); else None, having raised the worker's epoch to it if `take`. No
        checkpoint: the caller acts before any other request is looked at."""
        epoch = _epoch_of(request)
        if epoch is None:
            return _protocol_error(f"epoch must be a whole number >= 0: {request['epoch']!r}")
        if epoch < self.epoch:
            return {
                "ok": False,
                "fenced": True,
                "epoch": self.epoch,
                "error_type": "Fenced",
                "message": f"epoch {epoch} is older than epoch {self.epoch}, which commands it",
            }
        if take:
            self.epoch = epoch
        return None

    def hello(self) -> dict[str, Any]:
        state = (
            "stopping"
            if self.stopping
            else "starting"
            if not self.ready.is_set()
            else "failed"
            if self.init_error
            else "ready"
        )
        return {
            "ok": True,
            "tag": self.spec["tag"],
            "pid": os.getpid(),
            "state": state,
            "epoch": self.epoch,
            MONITOR_CHECKS: True,
        }

    async def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "hello" and not request.get("adopt"):
            return self.hello()  # reads only: answered to anyone
        if op not in ("hello", "stop", "wait_ready", "reconfigure", "check_health", "drain"):
            return _protocol_error(f"unknown op {op!r}")
        if op == "stop":
            return self.admit(request) or self.stop(request)
        refusal = self.check(request)
        if refusal is not None:
            return refusal
        if op == "hello":  # an adoption: the epoch is raised, and this is who answers
            return self.hello()
        await self.ready.wait()
        # Waited: a newer leader may have come meanwhile, or a stop been accepted.
        refusal = self.check(request)
        if refusal is not None:
            return refusal
        if self.init_error is not None:
            return {"ok": False, **self.init_error}
        if op == "wait_ready":
            return {"ok": True}
        try:
            method = getattr(self.instance, op, None)
        except Exception as exc:  # a property that raises: the user's error, not the worker's
            return {"ok": False, **describe(exc)}
        if op == "drain":
            return await self.drain_once(method)
        if op == "check_health" and (problem := self.serving_problem()) is not None:
            return problem
        if method is None:
            return {"ok": True}  # every method of the contract is optional
        if op == "check_health":
            return await self.check_once(method)
        try:
            if op == "reconfigure":
                async with self.reconfiguring:
                    refusal = self.check(request)  # again, once its turn has come
                    if refusal is not None:
                        return refusal
                    await call(method, request.get("user_config"))
            else:
                await call(method)
        except Exception as exc:
            return {"ok": False, **describe(exc)}
        return {"ok": True}

    async def check_once(self, method: Any) -> dict[str, Any]:
        """Run the replica's check, or, if one runs already, wait for its answer: a check that
        hangs holds one thread however many periods it spans, not one a period (which would
        take every thread the worker has for user code, its load included). A check cut short
        (the connection that asked for it hung up) answers no one: those waiting for it run
        their own."""
        while self.checking is not None:
            running = self.checking
            await running.wait()
            if self.check_answer is not _CUT_SHORT:
                return self.check_answer
        self.checking = running = trio.Event()
        answer: dict[str, Any] = {"ok": True}
        try:
            await call(method)
        except Exception as exc:
            answer = {"ok": False, **describe(exc)}
        except BaseException:
            answer = _CUT_SHORT
            raise
        finally:
            self.checking, self.check_answer = None, answer
            running.set()
        return answer

    async def drain_once(self, method: Any) -> dict[str, Any]:
        """Run the replica's drain once (in the worker's nursery, so that a controller that
        goes away mid-drain does not cut it), and answer every request for it when it ends:
        for code it serves, its server's first (the requests under way end, then it stops
        listening), then the user's ``drain`` if it has one."""
        if self.drained is None:
            self.drained = trio.Event()
            done = self.drained

            async def drain() -> None:
                try:
                    if self.server is not None:
                        await self.server.drain()
                    if method is not None:
                        await call(method)
                except Exception as exc:
                    self.drain_answer = {"ok": False, **describe(exc)}
                finally:
                    done.set()

            if self.nursery is None:
                await drain()
            else:
                self.nursery.start_soon(drain)
        await self.drained.wait()
        return self.drain_answer

    def serving_problem(self) -> dict[str, Any] | None:
        """A failed check's answer if the code it serves cannot serve (``ReplicaServer.problem``:
        every handler thread held by a call whose request ended), else None."""
        problem = None if self.server is None else self.server.problem()
        if problem is None:
            return None
        return {"ok": False, "error_type": "HandlersStuck", "message": problem}

    def check(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """`admit`; or, once a stop was accepted, refuse (and raise the epoch by nothing)."""
        if self.stopping:
            return self.admit(request, take=False) or _STOPPING
        return self.admit(request)

    def stop(self, request: dict[str, Any]) -> dict[str, Any]:
        """Accept a stop (already admitted): from now on the worker only ends. The runtime
        signals its group; if that has not ended it within `grace_s`, it ends itself."""
        if not self.stopping:
            self.stopping = True
            grace = request.get("grace_s", _STOP_GRACE_S)
            if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
                grace = _STOP_GRACE_S
            if self.nursery is not None:
                self.nursery.start_soon(_end_after, float(grace))
        return {"ok": True, "pid": os.getpid()}

    async def monitor(self, lines: LineStream) -> None:
        """A monitor connection: its end tells the runtime the process ended. It carries the
        replica's own load, when that changes, and the runtime's health checks (see ``wire``).
        Returns when the runtime hangs up (raising, as a closed connection does)."""
        sending = self.monitors[lines] = trio.Lock()
        try:
            # Checks that run user code do so in tasks of their own, bound to the connection: a
            # slow or hung one holds up neither the others nor the load pushes.
            async with trio.open_nursery() as checks:
                try:
                    await self._serve_checks(lines, sending, checks)
                except (WireError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    hung_up: BaseException | None = exc  # raised out of the nursery as it is
                    checks.cancel_scope.cancel()  # no one is left to answer
                else:
                    hung_up = None
            if hung_up is not None:
                raise hung_up
        finally:
            del self.monitors[lines]

    async def _serve_checks(
        self, lines: LineStream, sending: trio.Lock, checks: trio.Nursery
    ) -> None:
        if self.load is not None:
            async with sending:  # a restarted controller hears it at once
                await lines.send(self._load_message())
        while True:
            asked = parse_check_request(await lines.receive_line())
            if asked is None:
                continue  # nothing else is asked here; an older runtime asks nothing
            ident, epoch = asked
            request = {"op": "check_health", "epoch": epoch}
            if self.ready.is_set() and (
                self.init_error is not None or not has(self.instance, "check_health")
            ):
                # No user code to run: answered here, without a task.
                refusal = self.check(request)
                if refusal is None and self.init_error is not None:
                    refusal = {"ok": False, **self.init_error}
                if refusal is None:
                    refusal = self.serving_problem()
                await _answer_check(lines, sending, ident, refusal)
            else:
                checks.start_soon(self._check_and_answer, lines, sending, ident, request)

    async def _check_and_answer(
        self, lines: LineStream, sending: trio.Lock, ident: int, request: dict[str, Any]
    ) -> None:
        reply = await self.answer(request)
        await _answer_check(lines, sending, ident, None if reply.get("ok") else reply)

    async def push_load(self) -> None:
        """Push the replica's own ``load()`` to the runtime when it changes (``own_load``);
        without one, for code it serves, the requests its server holds (running and
        waiting)."""
        if self.server is None or has(self.instance, "load"):
            await read_load(self.instance, self._push)
        else:
            await self.server.follow_load(self._push)

    async def _push(
        self, count: int | None, served: int | None = None, code: CodeReport | None = None
    ) -> None:
        if (count, served, code) == (self.load, self.served, self.code):
            return
        self.load, self.served, self.code = count, served, code
        for lines, sending in list(self.monitors.items()):
            with contextlib.suppress(WireError, trio.BrokenResourceError, trio.ClosedResourceError):
                async with sending:
                    await lines.send(self._load_message())

    def _load_message(self) -> dict[str, Any]:
        if self.served is None:
            return {"load": self.load}
        said = {"load": self.load, "served": self.served}
        return said if self.code is None else {**said, **self.code.to_json()}


async def _answer_check(
    lines: LineStream, sending: trio.Lock, ident: int, refusal: dict[str, Any] | None
) -> None:
    """Answer check `ident` on a monitor connection: passed, or `refusal` (the runtime reads
    one as ``command`` reads a reply)."""
    line = check_passed(ident) if refusal is None else encode({**refusal, "check": ident})
    # A runtime that hung up is told nothing: the monitor's reader ends the connection.
    with contextlib.suppress(WireError, trio.BrokenResourceError, trio.ClosedResourceError):
        async with sending:
            await lines.send_line(line)


#: What a check cut short leaves for those that waited on it: nothing to answer with.
_CUT_SHORT: dict[str, Any] = {"ok": False, "error_type": "WorkerDied", "message": "cut short"}

#: How long an accepted stop waits for the runtime's signals before the worker ends itself
#: (when the request does not say).
_STOP_GRACE_S = 30.0
_STOPPING: dict[str, Any] = {
    "ok": False,
    "error_type": "WorkerStopping",
    "message": "its worker accepted a stop and is ending",
}


def _epoch_of(message: dict[str, Any]) -> int | None:
    """The ``epoch`` of a request or spec (0 if it has none), or None if it is no epoch."""
    epoch = message.get("epoch", 0)
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        return None
    return epoch


def _protocol_error(message: str) -> dict[str, Any]:
    return {"ok": False, "error_type": "ProtocolError", "message": message}


async def _end_after(grace_s: float) -> None:
    """The safety net of an accepted stop: the runtime that asked for it vanished before its
    signals came. The worker leads its own process group (its own session), which holds what
    the user's code started too; a worker that does not (run by hand) ends alone."""
    await trio.sleep(grace_s)
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
