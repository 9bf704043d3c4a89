"""The race on Ray: this controller (RayRuntime) against Ray Serve and against raw Ray.

One local cluster, one trivial replica class (``noop_replica.Noop``) for all three, the same
resources per replica. Each contender scales one backend 0 -> 4 -> 8 -> 2 and we time each step
to its converged state:

- controller: ``deploy`` with the new ``num_replicas``, done when the goal completes (RayKVStore
  holds the intent, so every step also writes to the cluster's KV store);
- Ray Serve: ``serve.run`` of the deployment with ``num_replicas`` (which returns once the
  application runs), then done when ``serve.status()`` shows exactly that many replicas RUNNING
  and the deployment HEALTHY (polled every 10 ms);
- raw Ray: named detached actors of the same class created (done when each answers a call) or
  killed (done when each is dead), directly with Ray's API.

- Ray Serve, declarative: the same, through a config (``import_path`` plus ``num_replicas``, what
  ``serve deploy`` sends). ``serve.run`` gives every call a new code version, so each of its
  steps replaces every replica; a config that changes only ``num_replicas`` keeps them.

Rounds alternate the order of the first three; the table gives the median per step.
Ray Serve is a benchmark-only dependency: ``nox -s bench`` installs it.

    python bench/ray_race.py [--rounds N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import ray
import trio

import controller
from controller.ray import RayKVStore, RayRuntime
from controller.ray._await import wait_ref

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from noop_replica import Noop  # noqa: E402  # beside this file

STEPS = (4, 8, 2)
CPU_PER_REPLICA = 0.25  # the same for everyone; 8 replicas fit on the cluster's 4 CPUs
Step = Callable[[int], Awaitable[None]]


async def race_controller(rounds_out: list[list[float]]) -> None:
    namespace = f"race{len(rounds_out)}"
    runtime = RayRuntime(namespace=namespace, pythonpath=[HERE])
    store = RayKVStore(namespace)
    replica = controller.ReplicaConfig("noop_replica:Noop")
    async with controller.open_controller(runtime=runtime, store=store) as ctl:

        async def step(n: int) -> None:
            cfg = controller.BackendConfig(
                num_replicas=n,
                version="v1",
                resources={"CPU": CPU_PER_REPLICA},
                health_check_period_s=0,
            )
            await (await ctl.deploy("noop", cfg, replica)).wait()

        rounds_out.append(await timed(step))
        await (await ctl.delete("noop")).wait()


async def race_raw(rounds_out: list[list[float]]) -> None:
    namespace = f"raw{len(rounds_out)}"
    actor_class = ray.remote(Noop)
    actors: list[Any] = []
    counter = iter(range(10**6))

    async def step(n: int) -> None:
        if n > len(actors):
            new: list[Any] = [
                actor_class.options(
                    name=f"noop#{next(counter)}",
                    namespace=namespace,
                    lifetime="detached",
                    num_cpus=CPU_PER_REPLICA,
                ).remote()
                for _ in range(n - len(actors))
            ]
            async with trio.open_nursery() as nursery:
                for actor in new:
                    nursery.start_soon(wait_ref, actor.__ray_ready__.remote())
            actors.extend(new)
        else:
            gone = [actors.pop() for _ in range(len(actors) - n)]
            for actor in gone:
                ray.kill(actor, no_restart=True)
            async with trio.open_nursery() as nursery:
                for actor in gone:
                    nursery.start_soon(wait_dead, actor)

    rounds_out.append(await timed(step))
    await step(0)


async def wait_dead(actor: Any) -> None:
    # Noop has no method that waits forever, so ask again until the answer is that it is dead:
    # the quickest a caller of raw Ray can learn it (a call sent before the kill still answers).
    while True:
        try:
            await wait_ref(actor.__ray_ready__.remote())
        except ray.exceptions.RayActorError:
            return


async def race_serve(rounds_out: list[list[float]]) -> None:
    from ray import serve

    deployment = serve.deployment(name="Noop", ray_actor_options={"num_cpus": CPU_PER_REPLICA})(
        Noop
    )

    async def step(n: int) -> None:
        await trio.to_thread.run_sync(
            lambda: serve.run(deployment.options(num_replicas=n).bind(), name="race")
        )
        # Serve offers no event for this: poll, as `serve status` users do.
        while not await trio.to_thread.run_sync(serve_settled, n):  # noqa: ASYNC110
            await trio.sleep(0.01)

    rounds_out.append(await timed(step))
    await trio.to_thread.run_sync(lambda: serve.delete("race"))


async def race_serve_config(rounds_out: list[list[float]]) -> None:
    """Serve's declarative path (what ``serve deploy`` sends): a config with ``num_replicas``.
    Changing only that is a "lightweight" update: Serve keeps the replicas it has."""
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    client = _get_global_client()
    assert client is not None, "serve.start() first"

    async def step(n: int) -> None:
        config = ServeDeploySchema.model_validate(
            {
                "applications": [
                    {
                        "name": "race",
                        "route_prefix": "/",
                        "import_path": "serve_app:app",
                        "runtime_env": {"env_vars": {"PYTHONPATH": str(HERE)}},
                        "deployments": [
                            {
                                "name": "Noop",
                                "num_replicas": n,
                                "ray_actor_options": {"num_cpus": CPU_PER_REPLICA},
                            }
                        ],
                    }
                ]
            }
        )
        await trio.to_thread.run_sync(client.deploy_apps, config)
        # Serve offers no event for this: poll, as `serve status` users do.
        while not await trio.to_thread.run_sync(serve_settled, n):  # noqa: ASYNC110
            await trio.sleep(0.01)

    rounds_out.append(await timed(step))
    await trio.to_thread.run_sync(lambda: client.delete_apps(["race"]))


def serve_settled(n: int) -> bool:
    from ray import serve

    app = serve.status().applications.get("race")
    if app is None:
        return False
    status = app.deployments.get("Noop")
    if status is None:
        return False
    return str(status.status) in ("HEALTHY", "DeploymentStatus.HEALTHY") and dict(
        status.replica_states
    ) in ({"RUNNING": n}, {"ReplicaState.RUNNING": n})


async def timed(step: Step) -> list[float]:
    times = []
    for n in STEPS:
        started = time.perf_counter()
        await step(n)
        times.append(time.perf_counter() - started)
    return times


async def race(rounds: int) -> dict[str, list[list[float]]]:
    from ray import serve

    results: dict[str, list[list[float]]] = {
        "controller": [],
        "serve": [],
        "raw": [],
        "serve_config": [],
    }
    serve.start(http_options={"host": "127.0.0.1", "port": 0})  # not timed: once per cluster
    contenders: list[tuple[str, Callable[[list[list[float]]], Awaitable[None]]]] = [
        ("controller", race_controller),
        ("serve", race_serve),
        ("raw", race_raw),
    ]
    # A warm-up round each, not counted: the first actors of a cluster pay for its worker pool.
    for name, run in contenders:
        await run([])
        print(f"warm-up {name} done", file=sys.stderr)
    for r in range(rounds):
        order = contenders[r % 3 :] + contenders[: r % 3]
        for name, run in order:
            await run(results[name])
            print(f"round {r + 1} {name}: {fmt(results[name][-1])}", file=sys.stderr)
    # Serve does not mix applications made by serve.run with ones from a config, so its
    # declarative path runs last, in a phase of its own, on the same cluster.
    await race_serve_config([])
    for r in range(rounds):
        await race_serve_config(results["serve_config"])
        print(f"round {r + 1} serve_config: {fmt(results['serve_config'][-1])}", file=sys.stderr)
    serve.shutdown()  # type: ignore[no-untyped-call]
    return results


def fmt(times: Sequence[float]) -> str:
    return " ".join(f"{t:.2f}s" for t in times)


def summarize(results: dict[str, list[list[float]]]) -> dict[str, Any]:
    median = {
        name: [statistics.median(r[i] for r in rounds) for i in range(len(STEPS))]
        for name, rounds in results.items()
    }
    rows = []
    previous = 0
    for i, n in enumerate(STEPS):
        ours, raw = median["controller"][i], median["raw"][i]
        serve_run, serve_config = median["serve"][i], median["serve_config"][i]
        rows.append(
            {
                "step": f"{previous}->{n}",
                "controller_s": ours,
                "serve_run_s": serve_run,
                "serve_config_s": serve_config,
                "raw_ray_s": raw,
                "serve_run_over_controller": serve_run / ours,
                "serve_config_over_controller": serve_config / ours,
                "controller_over_raw": ours / raw,
            }
        )
        previous = n
    return {"rounds": results, "median": rows}


def print_table(summary: dict[str, Any]) -> None:
    print(
        "| step | controller (RayRuntime) | Ray Serve, serve.run | Ray Serve, config | raw Ray "
        "| Serve / controller (target >= 3) | controller / raw (target <= 1.15) |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in summary["median"]:
        print(
            f"| {row['step']} | {row['controller_s']:.3f} s | {row['serve_run_s']:.3f} s | "
            f"{row['serve_config_s']:.3f} s | {row['raw_ray_s']:.3f} s | "
            f"{row['serve_run_over_controller']:.1f}x / "
            f"{row['serve_config_over_controller']:.1f}x | {row['controller_over_raw']:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description="controller vs Ray Serve vs raw Ray")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=HERE / "ray_results.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rayb", dir="/tmp") as tmp:
        os.environ.setdefault("RAY_TMPDIR", tmp)  # short: Ray's Unix socket paths
        ray.init(num_cpus=4, include_dashboard=False, logging_level=logging.WARNING)
        try:
            summary = summarize(trio.run(race, args.rounds))
        finally:
            ray.shutdown()
    summary["machine"] = {"cpus": os.cpu_count(), "ray": ray.__version__}
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print_table(summary)


if __name__ == "__main__":
    main()
