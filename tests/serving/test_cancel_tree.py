"""A request tree ended at random points: 500 trials in a test run (5,000 in ``nox -s
reliability``) on a chain A -> B -> C of replicas that
call each other through handles (FakeRuntime serving real HTTP on loopback, the controller's
handles and a real ingress in this process), each ended by one of: its caller cancelled, a
deadline, its client hanging up at the ingress, or (every 100th) one of B's three replicas
dying under it (the controller replaces it meanwhile). Some run to their end first; each B
replica holds one request at a time, so others queue at the handles' router and at B's
servers. After each, once every task is blocked: no handler is inside, every handler's
``finally`` ran for every request it took, and nothing is in flight or queued at any router
or replica server."""

from __future__ import annotations

import contextlib
import os
import random
import socket
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import controller
from controller._routing.handle import current_deadline
from controller._serving import handles
from controller.ingress import ControllerSource, Ingress, open_listener
from controller.testing import FakeRuntime
from controller.testing._fake_replica import FakeState

from ..conftest import FIGURES

HERE = Path(__file__).parent.parent
TRIALS = 500 * int(os.environ.get("RELIABILITY_SCALE", "1"))
DEATH_EVERY = 100
LIMIT_S = 600
MODES = ("caller", "deadline", "hang_up")


def link(then: str | None) -> controller.ReplicaConfig:
    kwargs = {} if then is None else {"then": then}
    return controller.ReplicaConfig("handle_apps:Link", init_kwargs=kwargs)


def instances(runtime: FakeRuntime) -> list[tuple[str, Any, Any]]:
    """(tag, Link, server) of every replica that served, dead ones too."""
    out = []
    for tag, replica in runtime.replicas.items():
        server = replica.server
        if server is not None:
            out.append((tag, server.entry.instance, server))
    return out


def check_quiet(runtime: FakeRuntime, ingress: Ingress, trial: int) -> None:
    for tag, instance, server in instances(runtime):
        assert instance.inside == 0, (trial, tag)
        assert instance.entered == instance.finished, (trial, tag)
        if runtime.replicas[tag].state is not FakeState.DEAD:
            assert server.load == 0, (trial, tag, server.in_flight, server.waiting)
    routers = [handles._handles.get().router]  # type: ignore[union-attr]
    for router in routers:
        for name, backend in router.backends.items():
            assert backend.in_flight() == {}, (trial, "handles", name)
            assert (backend.queued, backend.retrying) == (0, 0), (trial, "handles", name)
    for name in ("a", "b", "c"):
        routes = ingress.backend(name)
        if routes is not None:
            assert routes.in_flight() == {}, (trial, "ingress", name)
            assert routes.queued == 0, (trial, "ingress", name)


async def one_call(
    ctl: controller.Controller, port: int, mode: str, sleep_s: float, cut_s: float
) -> None:
    target = f"/go?s={sleep_s:.4f}"
    if mode == "caller":
        with trio.move_on_after(cut_s):
            await _call(ctl, target)
    elif mode == "deadline":
        # As a replica's server runs a handler: the request's deadline, its scope and the
        # time its calls inherit.
        deadline = trio.current_time() + cut_s
        token = current_deadline.set(deadline)
        try:
            with trio.move_on_at(deadline):
                await _call(ctl, target)
        finally:
            current_deadline.reset(token)
    else:  # a client of the ingress that hangs up
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /a%s HTTP/1.1\r\nHost: t\r\n\r\n" % target.encode())
            await trio.sleep(cut_s)  # the cancel point: the close below


async def _call(ctl: controller.Controller, target: str) -> None:
    # A deadline, or a replica that died: what the trial is about.
    with contextlib.suppress(controller.HandleError):
        await ctl.handle("a").request("GET", target)


# Ten seconds of real time (ten times that in the reliability run): not for the edit-test
# loop.
@pytest.mark.slow
async def test_random_cancel_points_leave_nothing_behind() -> None:
    rng = random.Random(47)
    runtime = FakeRuntime(auto_ready=True, serve_http=True, pythonpath=[HERE])
    fields: dict[str, Any] = {"version": "v1", "request_timeout_s": 30}
    with trio.fail_after(LIMIT_S):
        async with (
            # B's replicas die every 100 trials (seconds apart): a crash backoff grown to its
            # default 60 s would leave B without a replica for most of the reliability run (it
            # did: 10 minutes were not enough), and backoff is not what this tries.
            controller.open_controller(
                runtime=runtime,
                store=controller.MemoryStore(),
                restart_policy=controller.RestartPolicy(max_delay_s=1.0),
            ) as ctl,
            trio.open_nursery() as nursery,
        ):
            for name, then, extra in (
                ("a", "b", {"route_prefix": "/a"}),
                ("b", "c", {"max_ongoing_requests": 1, "num_replicas": 3}),
                ("c", None, {}),
            ):
                config = controller.BackendConfig(**{"num_replicas": 1, **fields, **extra})
                goal = await ctl.deploy(name, config, link(then))
                assert await goal.wait() is controller.GoalOutcome.COMPLETED
            ingress = Ingress(ControllerSource(ctl))
            await nursery.start(ingress.run)
            listener = await open_listener("127.0.0.1", 0)
            await nursery.start(ingress.serve, [listener])
            port = listener.socket.getsockname()[1]
            await ctl.handle("a").request("GET", "/go?s=0")  # the handles' router follows
            ended = dict.fromkeys((*MODES, "death"), 0)
            for trial in range(TRIALS):
                if trial % DEATH_EVERY == DEATH_EVERY - 1:
                    await _death(ctl, runtime, ingress, trial)
                    ended["death"] += 1
                    continue
                mode = rng.choice(MODES)
                async with trio.open_nursery() as calls:
                    for _ in range(rng.choice((1, 1, 2, 3))):
                        sleep_s, cut_s = rng.uniform(0, 0.004), rng.uniform(0, 0.005)
                        calls.start_soon(one_call, ctl, port, mode, sleep_s, cut_s)
                ended[mode] += 1
                await trio.testing.wait_all_tasks_blocked()
                check_quiet(runtime, ingress, trial)
            served = sum(instance.entered for _, instance, _ in instances(runtime))
            cancelled = sum(instance.cancelled for _, instance, _ in instances(runtime))
            said = f"{TRIALS} trials {ended}: {served} handler runs, {cancelled} cancelled"
            FIGURES["request trees cut short"] = said
            assert cancelled > TRIALS / 10  # the cancel points did cut requests short
            nursery.cancel_scope.cancel()


async def _death(
    ctl: controller.Controller, runtime: FakeRuntime, ingress: Ingress, trial: int
) -> None:
    """A request held in C (asked to sleep 1 s) while its B replica dies: C's handler is
    cancelled, and the caller's GET is tried again on another B replica (it answers after the
    second call's second), or the caller hears an error."""

    def live_b(ctl: controller.Controller) -> bool:
        return any(r.address for r in ctl.snapshot("b").replicas)

    await ctl.wait_until(live_b)  # one replaced since the last death, at least
    async with trio.open_nursery() as calls:
        calls.start_soon(_call, ctl, "/go?s=1")
        c = next(
            instance
            for tag, instance, _ in instances(runtime)
            if tag.startswith("c#") and runtime.replicas[tag].state is FakeState.READY
        )
        while c.inside == 0:
            await c.moved.wait()
        holder = next(
            tag
            for tag, instance, _ in instances(runtime)
            if tag.startswith("b#")
            and instance.inside
            and runtime.replicas[tag].state is FakeState.READY
        )
        runtime.crash(holder, "killed by the test")
    await trio.testing.wait_all_tasks_blocked()
    check_quiet(runtime, ingress, trial)
