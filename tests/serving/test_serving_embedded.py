"""Code the worker serves, where no daemon runs: a controller embedded in a program (the ingress
in process, LocalRuntime's workers), and FakeRuntime(serve_http=True), whose replicas of code
answer real HTTP in a test of one's own."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import controller
from controller.ingress import ControllerSource, Ingress, open_listener
from controller.testing import FakeRuntime, FakeState

from ..http_client import request
from ..pristine import EXAMPLES

HERE = Path(__file__).parent.parent
LIMIT_S = 60


def code(entrypoint: str, **kwargs: Any) -> controller.ReplicaConfig:
    return controller.ReplicaConfig(f"serving_apps:{entrypoint}", **kwargs)


async def ingress_of(ctl: controller.Controller, nursery: trio.Nursery) -> int:
    """An ingress in process following `ctl`, on a port of its own (returned)."""
    ingress = Ingress(ControllerSource(ctl))
    await nursery.start(ingress.run)
    listener = await open_listener("127.0.0.1", 0)
    await nursery.start(ingress.serve, [listener])
    return int(listener.socket.getsockname()[1])


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sv", dir="/tmp"))  # short: Unix socket paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_an_embedded_controller_serves_code_through_its_ingress(runtime_dir: Path) -> None:
    runtime = controller.LocalRuntime(runtime_dir / "w", pythonpath=[HERE])
    with trio.fail_after(LIMIT_S):
        async with (
            controller.open_controller(runtime=runtime, store=controller.MemoryStore()) as ctl,
            trio.open_nursery() as nursery,
        ):
            port = await ingress_of(ctl, nursery)
            config = controller.BackendConfig(num_replicas=2, route_prefix="/hi", version="v1")
            assert await (await ctl.deploy("hi", config, code("hello"))).wait() is (
                controller.GoalOutcome.COMPLETED
            )
            for replica in ctl.status("hi").replicas:
                assert replica.pid is not None  # a worker process of its own
            answers = [await request(port, f"/hi?name={n}") for n in range(20)]
            assert [a.body for a in answers] == [f"hello, {n}\n".encode() for n in range(20)]
            # Each replica counts what it answered, and status says so.
            await ctl.wait_until(lambda c: sum(c.status("hi").load.served.values()) == 20)
            assert set(ctl.status("hi").load.served) == {r.tag for r in ctl.status("hi").replicas}
            await (await ctl.delete("hi")).wait()
            nursery.cancel_scope.cancel()


async def test_fake_runtime_replicas_of_code_answer_real_http() -> None:
    runtime = FakeRuntime(auto_ready=True, serve_http=True, pythonpath=[HERE])
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(
            runtime=runtime, store=controller.MemoryStore()
        ) as ctl:
            config = controller.BackendConfig(num_replicas=2, version="v1")
            await (await ctl.deploy("c", config, code("Counting"))).wait()
            for replica in ctl.status("c").replicas:
                assert replica.address is not None
                port = int(replica.address.rpartition(":")[2])
                answer = await request(port, "/x")
                # Each in-process replica has a context of its own.
                assert answer.json()["tag"] == replica.tag
            # A scale-down drains a replica's requests, then stops its server.
            one = controller.BackendConfig(num_replicas=1, version="v1")
            await (await ctl.deploy("c", one, code("Counting"))).wait()
            stopped = [r for r in runtime.replicas.values() if r.state is FakeState.DEAD]
            assert len(stopped) == 1
            dead_port = int(stopped[0].address.rpartition(":")[2])
            with pytest.raises(OSError, match="connect"):
                await request(dead_port, "/x")
            # A class's config reaches it, at its start and in place, as in a worker.
            scaled = code("Scaled", init_kwargs={"scale": 2})
            await (await ctl.deploy("s", config_with({"k": 1}), scaled)).wait()
            assert await _configs(ctl, "s") == [{"k": 1}, {"k": 1}]
            await (await ctl.deploy("s", config_with({"k": 2}), scaled)).wait()
            assert await _configs(ctl, "s") == [{"k": 2}, {"k": 2}]
            await (await ctl.delete("s")).wait()
            # A replica of code that serves itself is a fake replica as any.
            trivial = controller.ReplicaConfig("replicas:Trivial")
            await (await ctl.deploy("t", config, trivial)).wait()
            for replica in ctl.status("t").replicas:
                assert replica.address is not None
                assert replica.address.startswith("fake://")
            await (await ctl.delete("c")).wait()
            await (await ctl.delete("t")).wait()


def config_with(user_config: Any) -> controller.BackendConfig:
    return controller.BackendConfig(num_replicas=2, version="v1", user_config=user_config)


async def _configs(ctl: controller.Controller, name: str) -> list[Any]:
    """The config each replica of `name` answers that it holds."""
    out = []
    for replica in ctl.status(name).replicas:
        assert replica.address is not None
        port = int(replica.address.rpartition(":")[2])
        out.append((await request(port, "/")).json()["config"])
    return out


async def test_a_worker_batches_concurrent_requests_and_answers_each_its_own(
    runtime_dir: Path,
) -> None:
    """examples/batching.py on a real worker process: 24 requests at once run in batches of up
    to 16, and each answer is its own request's."""
    examples = EXAMPLES
    runtime = controller.LocalRuntime(runtime_dir / "w", pythonpath=[examples])
    with trio.fail_after(LIMIT_S):
        async with (
            controller.open_controller(runtime=runtime, store=controller.MemoryStore()) as ctl,
            trio.open_nursery() as nursery,
        ):
            port = await ingress_of(ctl, nursery)
            config = controller.BackendConfig(
                route_prefix="/score", version="v1", max_ongoing_requests=32
            )
            rc = controller.ReplicaConfig("batching:Scorer")
            assert await (await ctl.deploy("scorer", config, rc)).wait() is (
                controller.GoalOutcome.COMPLETED
            )
            answers: dict[int, Any] = {}

            async def one(i: int) -> None:
                answers[i] = (await request(port, f"/score?text=t{i}")).json()

            async with trio.open_nursery() as clients:
                for i in range(24):
                    clients.start_soon(one, i)
            assert {i: a["text"] for i, a in answers.items()} == {i: f"t{i}" for i in range(24)}
            sizes = [a["batch"] for a in answers.values()]
            assert max(sizes) > 1  # they ran together
            assert max(sizes) <= 16
            # The replica reports its batches with its load: status (and /metrics) show them.
            await ctl.wait_until(
                lambda c: (
                    sum(b.items for bs in c.status("scorer").load.batches.values() for b in bs)
                    == 24
                )
            )
            ((said,),) = ctl.status("scorer").load.batches.values()
            assert said.function == "Scorer.predict"
            assert said.largest == max(sizes)
            assert 2 <= said.batches < 24  # 24 requests in batches of at most 16
            assert said.waited_s > 0
            await (await ctl.delete("scorer")).wait()
            nursery.cancel_scope.cancel()
