"""Handles, in process (FakeRuntime serving real HTTP, and ``ctl.handle``): a backend's code calls
another by name through ``controller.worker.handle``, as the ingress routes; methods by name,
with JSON arguments and results; streams; errors; and a request tree under one deadline, whose
every call a deadline or a hang-up ends. On real workers behind a daemon, with the route token:
tests/daemon/test_handles_daemon.py."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import controller
from controller._model.config.manifest import parse_manifest
from controller.ingress import ControllerSource, Ingress, open_listener
from controller.testing import FakeRuntime, FakeState

from ..http_client import request

HERE = Path(__file__).parent.parent
LIMIT_S = 60


def code(entrypoint: str, **kwargs: Any) -> controller.ReplicaConfig:
    return controller.ReplicaConfig(f"handle_apps:{entrypoint}", **kwargs)


def config(**fields: Any) -> controller.BackendConfig:
    return controller.BackendConfig(**{"num_replicas": 1, "version": "v1", **fields})


async def deploy(
    ctl: controller.Controller, name: str, rc: controller.ReplicaConfig, **fields: Any
) -> None:
    goal = await ctl.deploy(name, config(**fields), rc)
    assert await goal.wait() is controller.GoalOutcome.COMPLETED


async def test_a_handle_calls_methods_with_json_and_raises_what_they_raise() -> None:
    runtime = FakeRuntime(auto_ready=True, serve_http=True, pythonpath=[HERE])
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(
            runtime=runtime, store=controller.MemoryStore()
        ) as ctl:
            await deploy(ctl, "calc", code("Calculator"), num_replicas=2)
            calc = ctl.handle("calc")
            assert await calc.call("add", 2, 3) == 5
            assert await calc.add(1.5, 2) == 3.5  # the same, by attribute
            described = await calc.describe(name="y")
            assert described["name"] == "y"
            assert described["tag"].startswith("calc#")
            with pytest.raises(controller.RemoteError) as raised:
                await calc.fail()
            assert (raised.value.kind, raised.value.status) == ("KeyError", 500)
            assert "no such thing" in str(raised.value)
            # Neither a method it lacks, nor the controller's own, nor a private one.
            for name in ("nope", "drain", "reconfigure"):
                with pytest.raises(controller.RemoteError) as raised:
                    await calc.call(name)
                assert raised.value.kind == "NoSuchMethod", name
            # Nor a callable attribute, a property (its getter not run) or a builtin's method.
            for name in ("helper", "expensive"):
                with pytest.raises(controller.RemoteError) as raised:
                    await calc.call(name)
                assert raised.value.kind == "NoSuchMethod", name
            assert await calc.getter_runs() == 0
            await deploy(ctl, "shelf", code("Shelf"))
            shelf = ctl.handle("shelf")
            assert await shelf.model() == "m1"
            for name in ("copy", "clear", "update", "get"):
                with pytest.raises(controller.RemoteError) as raised:
                    await shelf.call(name)
                assert raised.value.kind == "NoSuchMethod", name
            assert (await shelf.request("GET", "/")).status == 404  # a class of methods
            with pytest.raises(ValueError, match="not a method a handle may call"):
                await calc.call("_private")
            with pytest.raises(TypeError, match="must be JSON"):
                await calc.call("add", object(), 1)
            deep: list[Any] = []
            for _ in range(5000):
                deep = [deep]
            with pytest.raises(TypeError, match="nested too deeply"):
                await calc.call("add", deep, 1)
            with pytest.raises(TypeError, match="call it with call_stream"):
                await calc.call("count_to", 2)
            with pytest.raises(TypeError, match="session_key must be str or bytes"):
                calc.options(session_key=123)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="body must be bytes"):
                await calc.request("POST", "/", body="text")  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="not both"):
                await calc.request("POST", "/", body=b"x", json={})
            # The callee's own deadline passing first is the call's DeadlineExceeded too: a
            # backend of its own with a short one (2 s, not less: a stream must have sent some
            # items by then on a machine at load 20), the others' calls kept from it.
            await deploy(ctl, "hurried", code("Calculator"), request_timeout_s=2)
            hurried = ctl.handle("hurried")
            with pytest.raises(controller.HandleError) as late:
                await hurried.slow(30)
            assert late.value.kind == "DeadlineExceeded"
            # So is a stream the callee cuts at its deadline (not a broken one).
            got: list[int] = []

            async def drip() -> None:
                async with hurried.call_stream("drip", 100, 0.1) as items:
                    async for item in items:
                        got.append(item)

            with pytest.raises(controller.HandleError) as cut:
                await drip()
            assert cut.value.kind == "DeadlineExceeded"
            assert 0 < len(got) < 100
            # A generator method's items as they come.
            async with calc.call_stream("count_to", 4) as items:
                assert [item async for item in items] == [0, 1, 2, 3]
            # Plain HTTP too: its handler's answer.
            answer = await calc.request("GET", "/anything")
            assert (answer.status, answer.text) == (200, "calculator")
            assert answer.header("Content-Type") == "text/plain; charset=utf-8"
            with pytest.raises(controller.HandleError) as missing:
                await ctl.handle("nope").request("GET", "/")
            assert missing.value.kind == "UnknownBackend"
            for name in ("calc", "shelf", "hurried"):
                await (await ctl.delete(name)).wait()


async def test_replicas_call_each_other_and_a_deadline_ends_the_whole_tree() -> None:
    runtime = FakeRuntime(auto_ready=True, serve_http=True, pythonpath=[HERE])
    with trio.fail_after(LIMIT_S):
        async with (
            controller.open_controller(runtime=runtime, store=controller.MemoryStore()) as ctl,
            trio.open_nursery() as nursery,
        ):
            await deploy(ctl, "a", code("Link", init_kwargs={"then": "b"}), route_prefix="/a")
            await deploy(ctl, "b", code("Link", init_kwargs={"then": "c"}))
            await deploy(ctl, "c", code("Link"), request_timeout_s=30)
            ingress = Ingress(ControllerSource(ctl))
            await nursery.start(ingress.run)
            listener = await open_listener("127.0.0.1", 0)
            await nursery.start(ingress.serve, [listener])
            port = listener.socket.getsockname()[1]
            # A -> B -> C through the ingress, each hop's time left under the last's.
            answer = (await request(port, "/a/go?s=0")).json()
            assert (answer["via"], answer["then"]["via"], answer["then"]["then"]["at"]) == (
                "a",
                "b",
                "c",
            )
            # Each hop has what the one before it had left, or less.
            assert answer["left"] >= answer["then"]["left"] >= answer["then"]["then"]["left"]
            stats = {name: ctl.handle(name) for name in "abc"}
            # A deadline of 100 ms on A (the client's): each hop has less left than the one
            # before it, so C, which would sleep 10 s, is cancelled at it first, and its 504
            # comes back up the chain, every link done.
            began = trio.current_time()
            late = await request(port, "/a/go?s=10", headers=[("x-request-timeout-ms", "100")])
            assert late.status == 504
            assert trio.current_time() - began < 5  # far under 10 s (the figure: the bench)
            counts = (await stats["c"].request("GET", "/stats?until=cancelled&n=1")).json()
            assert counts == {"inside": 0, "cancelled": 1}
            before = {}
            for name in "abc":  # each done: cancelled at its own deadline, or answered 504
                answer = await stats[name].request("GET", "/stats")
                assert answer.status == 200, (name, answer)
                counts = answer.json()
                assert counts["inside"] == 0, name
                before[name] = counts["cancelled"]
            # A client that hangs up on A: every link is cancelled, down the tree.
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"GET /a/go?s=10 HTTP/1.1\r\nHost: h\r\n\r\n")
            await stats["c"].request("GET", "/stats?until=inside&n=1")
            sock.close()
            for name in "abc":
                until = f"/stats?until=cancelled&n={before[name] + 1}"
                counts = (await stats[name].request("GET", until)).json()
                assert counts == {"inside": 0, "cancelled": before[name] + 1}, name
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("as_application", [False, True])
async def test_a_request_on_a_canary_calls_the_canaries_downstream(as_application: bool) -> None:
    """A and B both mid-canary (v2 beside v1, half the traffic each): every request that
    enters A's canary calls B's canary, and every one on A's stable calls B's stable, checked
    on every answer; calls from outside a request draw their side as the ingress does. Both
    ways of starting them: a canary block each, deployed one after the other, or one block of
    their application, in one apply."""
    runtime = FakeRuntime(auto_ready=True, serve_http=True, pythonpath=[HERE])
    canary = {"steps": [{"weight": 50, "pause_s": 3600}], "min_requests": 1_000_000}
    with trio.fail_after(LIMIT_S):
        async with (
            controller.open_controller(runtime=runtime, store=controller.MemoryStore()) as ctl,
            trio.open_nursery() as nursery,
        ):
            for version in ("v1", "v2"):  # v2: a canary of each
                if as_application:
                    applied = await ctl.apply_manifest(_linked(version, canary))
                    goals = [applied.goals["a"], applied.goals["b"]]
                else:
                    goals = []
                    for name, then, route in (("a", "b", "/a"), ("b", None, None)):
                        kwargs = {} if then is None else {"then": then}
                        block = config(
                            num_replicas=2, version=version, route_prefix=route, canary=canary
                        )
                        goals.append(
                            await ctl.deploy(name, block, code("Link", init_kwargs=kwargs))
                        )
                if version == "v1":
                    for goal in goals:
                        assert await goal.wait() is controller.GoalOutcome.COMPLETED

            def split_and_serving(ctl: controller.Controller) -> bool:
                for name in "ab":
                    snapshot = ctl.snapshot(name)
                    versions = {r.version for r in snapshot.replicas if r.address}
                    if snapshot.traffic is None or not {"v1", "v2"} <= versions:
                        return False
                return True

            await ctl.wait_until(split_and_serving)
            seen = await _versions_through_an_ingress(ctl, nursery, 100)
            for _ in range(40):
                answer = (await ctl.handle("a").request("GET", "/go?s=0")).json()
                seen.append((answer["version"], answer["then"]["version"]))
            assert set(seen) == {("v1", "v1"), ("v2", "v2")}  # both sides, never mixed
            nursery.cancel_scope.cancel()


async def test_a_request_on_a_rolling_updates_new_replica_calls_new_ones_downstream() -> None:
    """A and B both half way through a rolling update (no canary: a v1 and a v2 replica serving
    each, the second v2 held starting): a request that reaches A's new replica calls B's new
    one, and one on A's old replica B's old one, checked on every answer (the sides a request
    tree keeps to are the new and the old version's, as in a canary the canary's and the
    stable's); and a request the ingress draws for a side with no replica serving is told the
    side it reached."""
    runtime = FakeRuntime(auto_ready=True, serve_http=True, pythonpath=[HERE])
    with trio.fail_after(LIMIT_S):
        async with (
            controller.open_controller(runtime=runtime, store=controller.MemoryStore()) as ctl,
            trio.open_nursery() as nursery,
        ):
            rolling = {"num_replicas": 2, "max_surge": 1, "max_unavailable": 0}
            for version in ("v1", "v2"):
                if version == "v2":
                    runtime.auto_ready = False  # each new replica waits to be let start
                for name, then, route in (("a", "b", "/a"), ("b", None, None)):
                    kwargs = {} if then is None else {"then": then}
                    goal = await ctl.deploy(
                        name,
                        config(version=version, route_prefix=route, **rolling),
                        code("Link", init_kwargs=kwargs),
                    )
                    if version == "v1":
                        assert await goal.wait() is controller.GoalOutcome.COMPLETED

            # The first new replica of each serves; the second is held starting.
            def one_starting_each(r: FakeRuntime) -> bool:
                return all(len(r.tags(FakeState.STARTING, backend=n)) == 1 for n in "ab")

            await runtime.wait_until(one_starting_each)
            for name in "ab":
                (first,) = runtime.tags(FakeState.STARTING, backend=name)
                runtime.finish_start(first)

            def half_way(ctl: controller.Controller) -> bool:
                for name in "ab":
                    snapshot = ctl.snapshot(name)
                    if {r.version for r in snapshot.replicas if r.address} != {"v1", "v2"}:
                        return False
                return True

            await ctl.wait_until(half_way)
            seen = await _versions_through_an_ingress(ctl, nursery, 100)
            assert set(seen) == {("v1", "v1"), ("v2", "v2")}  # both sides, never mixed
            nursery.cancel_scope.cancel()


async def _versions_through_an_ingress(
    ctl: controller.Controller, nursery: trio.Nursery, requests: int
) -> list[tuple[str, str]]:
    """`requests` to A through an ingress of `ctl`'s: the versions of A and of the B it called,
    as each answer says them."""
    ingress = Ingress(ControllerSource(ctl))
    await nursery.start(ingress.run)
    listener = await open_listener("127.0.0.1", 0)
    await nursery.start(ingress.serve, [listener])
    port = listener.socket.getsockname()[1]
    seen = []
    for _ in range(requests):
        answer = (await request(port, "/a/go?s=0")).json()
        seen.append((answer["version"], answer["then"]["version"]))
    return seen


def _linked(version: str, canary: dict[str, Any]) -> controller.Manifest:
    """A calling B, as one application whose canary block is both's."""
    link = {"entrypoint": "handle_apps:Link", "num_replicas": 2, "version": version}
    return parse_manifest(
        {
            "backends": {
                "a": {**link, "init_kwargs": {"then": "b"}, "route_prefix": "/a"},
                "b": link,
            },
            "applications": {"ab": {"entry": "a", "backends": ["b"], "canary": canary}},
        },
        "ab.toml",
    )
