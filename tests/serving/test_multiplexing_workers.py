"""Model multiplexing on real worker processes, through an ingress and a handle: a model's
requests land where it is held, a model held nowhere is answered after one load, concurrent
requests for it share that load, a hot model spreads to more replicas, and status says what
each replica holds. The rules on their own: tests/serving/test_model_routing.py and
tests/serving/test_multiplexing.py."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio

import controller
from controller.ingress import ControllerSource, Ingress, open_listener

from ..http_client import raw, request

HERE = Path(__file__).parent.parent
LIMIT_S = 90


async def ingress_of(ctl: controller.Controller, nursery: trio.Nursery) -> int:
    ingress = Ingress(ControllerSource(ctl))
    await nursery.start(ingress.run)
    listener = await open_listener("127.0.0.1", 0)
    await nursery.start(ingress.serve, [listener])
    return int(listener.socket.getsockname()[1])


async def deploy(
    ctl: controller.Controller, replicas: int, max_ongoing: int = 100, **init: Any
) -> None:
    config = controller.BackendConfig(
        num_replicas=replicas, route_prefix="/m", version="v1", max_ongoing_requests=max_ongoing
    )
    code = controller.ReplicaConfig("serving_apps:MultiModel", init_kwargs=init)
    assert await (await ctl.deploy("m", config, code)).wait() is controller.GoalOutcome.COMPLETED


async def ask(port: int, model: str) -> dict[str, Any]:
    answer = await request(port, "/m", headers=[("x-model-id", model)])
    assert answer.status == 200, answer.body
    assert "x-replica-models" not in answer.headers  # the routers', not the client's
    body: dict[str, Any] = answer.json()
    assert body["model"] == body["asked"] == model
    return body


async def test_requests_land_where_their_model_is_and_one_load_serves_a_burst(
    runtime_dir: Path,
) -> None:
    runtime = controller.LocalRuntime(runtime_dir / "w", pythonpath=[HERE])
    with trio.fail_after(LIMIT_S):
        async with (
            controller.open_controller(runtime=runtime, store=controller.MemoryStore()) as ctl,
            trio.open_nursery() as nursery,
        ):
            port = await ingress_of(ctl, nursery)
            await deploy(ctl, replicas=4)
            # A burst for a model held nowhere: one replica loads it once, and all are answered.
            answers: list[dict[str, Any]] = []

            async def one() -> None:
                answers.append(await ask(port, "a"))

            async with trio.open_nursery() as clients:
                for _ in range(12):
                    clients.start_soon(one)
            assert {a["replica"] for a in answers} == {answers[0]["replica"]}
            assert max(a["loads"].count("a") for a in answers) == 1
            assert all(a["overlapping"] == 0 for a in answers)
            home = answers[0]["replica"]
            # What follows for it lands there; other models go to other replicas.
            later = [await ask(port, "a") for _ in range(10)]
            assert {a["replica"] for a in later} == {home}
            others = {m: (await ask(port, m))["replica"] for m in ("b", "c", "d")}
            assert home not in others.values()  # replicas with room for a model go first
            assert len(set(others.values())) == 3

            # Status (and so metrics and the console) says what each holds, once each replica's
            # latest report is in (they come on their own time: the home replica's last one may
            # follow the others').
            def heard(c: controller.Controller) -> bool:
                said = c.status("m").load.models
                held = {m for one in said.values() for m in one.models}
                return held == {"a", "b", "c", "d"} and said[home].requests.get("a") == 22

            await ctl.wait_until(heard)
            said = ctl.status("m").load.models
            assert said[home].models == ("a",)
            assert said[home].requests["a"] == 22
            assert said[home].loads == 1
            assert said[home].hits >= 10

            # A handle names the model in its options and goes where it is held: a new router
            # learns that from the snapshot (published at most a second after the change).
            def published(c: controller.Controller) -> bool:
                held = c.snapshot("m").held.get(others["c"])
                return held is not None and "c" in held.models

            await ctl.wait_until(published)
            handle = ctl.handle("m").options(model_id="c")
            called = await handle.ask("x")
            assert called == {"model": "c", "replica": others["c"], "text": "x"}
            with pytest.raises(ValueError, match="model_id must be"):
                ctl.handle("m").options(model_id="no spaces")
            # A bad id is refused at the ingress, before any replica.
            two = await request(port, "/m", headers=[("x-model-id", "b"), ("x-model-id", "c")])
            assert (two.json()["model"], two.json()["replica"]) == ("b", others["b"])  # the first
            head = "GET /m HTTP/1.1\r\nHost: t\r\nConnection: close\r\nx-model-id: {}\r\n\r\n"
            padded = await raw(port, head.format("a  ").encode())
            assert f'"replica":"{home}"'.encode() in padded  # whitespace around it is no part
            accented = await raw(port, head.format("modèle").encode())
            assert accented.startswith(b"HTTP/1.1 400")
            said = json.loads(accented.partition(b"\r\n\r\n")[2])["error"]["message"]
            assert said.endswith("(got 'modèle')")  # read as UTF-8, as it was meant
            bad = await request(port, "/m", headers=[("x-model-id", "a b")])
            assert bad.status == 400
            assert bad.json()["error"]["type"] == "BadModelId"
            await (await ctl.delete("m")).wait()
            nursery.cancel_scope.cancel()


async def test_a_hot_model_spreads_to_more_replicas(runtime_dir: Path) -> None:
    runtime = controller.LocalRuntime(runtime_dir / "w", pythonpath=[HERE])
    with trio.fail_after(LIMIT_S):
        async with (
            controller.open_controller(runtime=runtime, store=controller.MemoryStore()) as ctl,
            trio.open_nursery() as nursery,
        ):
            port = await ingress_of(ctl, nursery)
            # 4 places a replica: a holder with 2 in flight is busy, and the model spreads.
            await deploy(ctl, replicas=4, max_ongoing=4, work_s=0.3)
            await ask(port, "hot")
            replicas: Counter[str] = Counter()

            async def one() -> None:
                replicas[(await ask(port, "hot"))["replica"]] += 1

            async with trio.open_nursery() as clients:
                for _ in range(12):
                    clients.start_soon(one)
            assert len(replicas) >= 3, replicas
            await ctl.wait_until(
                lambda c: sum("hot" in s.models for s in c.status("m").load.models.values()) >= 3
            )
            await (await ctl.delete("m")).wait()
            nursery.cancel_scope.cancel()


async def test_fake_runtime_serves_multiplexed_code_each_replica_with_its_own_models() -> None:
    """FakeRuntime(serve_http=True) runs several replicas in this process: each keeps its own
    models (not the process's), and their reports reach status as a real worker's do."""
    from controller.testing import FakeRuntime

    runtime = FakeRuntime(auto_ready=True, serve_http=True, pythonpath=[HERE])
    with trio.fail_after(LIMIT_S):
        async with (
            controller.open_controller(runtime=runtime, store=controller.MemoryStore()) as ctl,
            trio.open_nursery() as nursery,
        ):
            port = await ingress_of(ctl, nursery)
            await deploy(ctl, replicas=2, load_s=0.05)
            where = {m: (await ask(port, m))["replica"] for m in ("a", "b")}
            assert len(set(where.values())) == 2
            assert [(await ask(port, "a"))["replica"] for _ in range(5)] == [where["a"]] * 5
            await ctl.wait_until(
                lambda c: (
                    {t: s.models for t, s in c.status("m").load.models.items()}
                    == {where["a"]: ("a",), where["b"]: ("b",)}
                )
            )
            await (await ctl.delete("m")).wait()
            nursery.cancel_scope.cancel()
