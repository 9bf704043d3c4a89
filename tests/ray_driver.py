"""A Ray driver of its own, for the adoption test: deploys through RayRuntime and RayKVStore,
leaves a stray actor in the namespace, prints what it made as JSON, and exits."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import ray
import trio

import controller
from controller.ray import RayKVStore, RayRuntime

HERE = Path(__file__).parent


async def main(namespace: str, record: str) -> None:
    runtime = RayRuntime(namespace=namespace, pythonpath=[HERE])
    store = RayKVStore(namespace)
    async with controller.open_controller(runtime=runtime, store=store) as ctl:
        goal = await ctl.deploy(
            "a",
            controller.BackendConfig(num_replicas=2, version="v1"),
            controller.ReplicaConfig("replicas:BlockingRecorder", init_kwargs={"path": record}),
        )
        await goal.wait()
        tags = sorted(r.tag for r in ctl.status("a").replicas)
    # An actor in the namespace that no intent names: the next controller must kill it.
    stray = RayRuntime(namespace=namespace, pythonpath=[HERE])
    async with trio.open_nursery() as nursery:
        await nursery.start(stray.serve, lambda tag, reason: None)
        await stray.start_replica(
            controller.ReplicaSpec(
                tag="stray#0",
                backend="stray",
                version="v1",
                replica_config=controller.ReplicaConfig("replicas:Trivial"),
                user_config=None,
                resources={},
            )
        )
        nursery.cancel_scope.cancel()
    print(json.dumps({"tags": tags}))


if __name__ == "__main__":
    address, namespace, record = sys.argv[1:4]
    ray.init(address=address, namespace=namespace, logging_level=logging.WARNING)
    trio.run(main, namespace, record)
