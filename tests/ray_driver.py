"""A Ray driver of its own, for the tests of a second driver taking over.

``adopt``: deploys through RayRuntime and RayKVStore, leaves a stray actor in the namespace,
prints what it made as JSON, and exits. ``rollout``: deploys v1, starts a rollout to a v2 whose
replicas take seconds to build, prints "rolling" and waits to be killed (kill -9)."""

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


async def rollout(namespace: str, record: str) -> None:
    runtime = RayRuntime(namespace=namespace, pythonpath=[HERE])
    async with controller.open_controller(runtime=runtime, store=RayKVStore(namespace)) as ctl:
        v1 = controller.ReplicaConfig("replicas:BlockingRecorder", init_kwargs={"path": record})
        await (await ctl.deploy("a", rollout_config("v1"), v1)).wait()
        v2 = controller.ReplicaConfig("replicas:SlowInit", init_kwargs={"seconds": 2})
        await ctl.deploy("a", rollout_config("v2"), v2)
        print("rolling", flush=True)
        await trio.sleep_forever()


def rollout_config(version: str) -> controller.BackendConfig:
    return controller.BackendConfig(num_replicas=3, version=version, max_surge=1)


if __name__ == "__main__":
    mode, address, namespace, record = sys.argv[1:5]
    ray.init(address=address, namespace=namespace, logging_level=logging.WARNING)
    trio.run(rollout if mode == "rollout" else main, namespace, record)
