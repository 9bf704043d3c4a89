"""The race on Ray: this controller (RayRuntime) against Ray Serve and against raw Ray.

One local cluster, one trivial replica class (``noop_replica.DrainingNoop``: its ``drain`` returns
at once) for all, the same resources per replica, every contender at its defaults (health checks
on: every 10 s for us and for Serve). Each contender scales one backend 0 -> 4 -> 8 -> 2 and we
time each step to its converged state:

- controller: ``deploy`` with the new ``num_replicas``, done when the goal completes (RayKVStore
  holds the intent, so every step also writes to the cluster's KV store); a stop calls the
  class's ``drain``, then kills;
- Ray Serve, ``serve.run``: the deployment with ``num_replicas`` sent without waiting
  (``serve.run_many`` with both waits off: ``serve.run`` blocks in the Serve client's wait, which
  polls once a second), then done when ``serve.status()`` shows the application RUNNING, the
  deployment HEALTHY and exactly that many replicas RUNNING, polled every `POLL_S`;
- Ray Serve, config: the same through a config (``import_path`` plus ``num_replicas``, what
  ``serve deploy`` sends; it does not wait). ``serve.run`` gives every call a new code version, so
  each of its steps replaces every replica; a config that changes only ``num_replicas`` keeps them;
- each way of driving Serve twice: at Serve's defaults, and tuned with
  ``graceful_shutdown_wait_loop_s=0`` (by default each stopping replica sleeps 2 s before it
  looks for requests in flight);
- raw Ray: named detached actors of the same class created (done when each answers a call) or
  drained, killed and waited for (done when each is dead), directly with Ray's API.

Rounds rotate the order of the contenders of each phase; the table gives the median per step.
Ray Serve is a benchmark-only dependency: ``nox -s bench`` installs it.

    python bench/ray_race.py [--rounds N | --quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
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
import reaper  # noqa: E402  # beside this file
from noop_replica import DrainingNoop  # noqa: E402  # beside this file

STEPS = (4, 8, 2)
CPU_PER_REPLICA = 0.25  # the same for everyone; 8 replicas fit on the cluster's 4 CPUs
POLL_S = 0.01  # how often Serve's status is asked for: Serve offers no event for convergence
Step = Callable[[int], Awaitable[None]]
Race = Callable[[list[list[float]]], Awaitable[None]]
#: Serve's tuned variant: stopping replicas look for requests in flight at once instead of after
#: Serve's default 2 s sleep (``graceful_shutdown_wait_loop_s``).
SERVE_TUNED: dict[str, Any] = {"graceful_shutdown_wait_loop_s": 0}
#: The contenders in table order (the keys of the JSON's "rounds").
CONTENDERS = ("controller", "raw", "serve", "serve_tuned", "serve_config", "serve_config_tuned")


async def race_controller(rounds_out: list[list[float]]) -> None:
    namespace = f"race{len(rounds_out)}"
    runtime = RayRuntime(namespace=namespace, pythonpath=[HERE])
    store = RayKVStore(namespace)
    replica = controller.ReplicaConfig("noop_replica:DrainingNoop")
    async with controller.open_controller(runtime=runtime, store=store) as ctl:

        async def step(n: int) -> None:
            # Defaults otherwise, as Serve runs with its own: health checks every 10 s, 20 s
            # to drain.
            cfg = controller.BackendConfig(
                num_replicas=n, version="v1", resources={"CPU": CPU_PER_REPLICA}
            )
            await (await ctl.deploy("noop", cfg, replica)).wait()

        rounds_out.append(await timed(step))
        await (await ctl.delete("noop")).wait()


async def race_raw(rounds_out: list[list[float]]) -> None:
    namespace = f"raw{len(rounds_out)}"
    actor_class = ray.remote(DrainingNoop)
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
            # The same graceful stop as the controller's, without its bookkeeping: drain
            # each, then kill it.
            async with trio.open_nursery() as nursery:
                for actor in gone:
                    nursery.start_soon(wait_ref, actor.drain.remote())
            for actor in gone:
                ray.kill(actor, no_restart=True)
            async with trio.open_nursery() as nursery:
                for actor in gone:
                    nursery.start_soon(wait_dead, actor)

    rounds_out.append(await timed(step))
    await step(0)


async def wait_dead(actor: Any) -> None:
    # The class has no method that waits forever, so ask again until the answer is that it is
    # dead: the quickest a caller of raw Ray can learn it (a call sent before the kill still
    # answers).
    while True:
        try:
            await wait_ref(actor.__ray_ready__.remote())
        except ray.exceptions.RayActorError:
            return


def race_serve(options: dict[str, Any]) -> Race:
    """Serve driven by ``serve.run``'s API, with `options` for the deployment (Serve's
    defaults if empty)."""

    async def run(rounds_out: list[list[float]]) -> None:
        from ray import serve

        deployment = serve.deployment(
            name="Noop", ray_actor_options={"num_cpus": CPU_PER_REPLICA}, **options
        )(DrainingNoop)

        def deploy(n: int) -> None:
            # serve.run, minus its waits: it would block in the Serve client's wait for the
            # application, which sleeps a hard-coded 1 s between polls (CLIENT_POLLING_INTERVAL_S
            # in serve/_private/constants.py), and so round Serve's times up to whole seconds.
            # run_many is what serve.run calls, with both of those waits as arguments.
            target = serve.RunTarget(deployment.options(num_replicas=n).bind(), name="race")
            serve.run_many(
                [target],
                wait_for_ingress_deployment_creation=False,
                wait_for_applications_running=False,
            )

        async def step(n: int) -> None:
            await trio.to_thread.run_sync(deploy, n)
            await wait_serve_settled(n)

        rounds_out.append(await timed(step))
        await trio.to_thread.run_sync(lambda: serve.delete("race"))

    return run


def race_serve_config(options: dict[str, Any]) -> Race:
    """Serve's declarative path (what ``serve deploy`` sends): a config with ``num_replicas``
    and `options`. Changing only the number is a "lightweight" update: Serve keeps the replicas
    it has."""

    async def run(rounds_out: list[list[float]]) -> None:
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
                                    **options,
                                }
                            ],
                        }
                    ]
                }
            )
            # deploy_apps does not wait (its _blocking defaults to False): the poll below does.
            await trio.to_thread.run_sync(client.deploy_apps, config)
            await wait_serve_settled(n)

        rounds_out.append(await timed(step))
        await trio.to_thread.run_sync(lambda: client.delete_apps(["race"]))

    return run


async def wait_serve_settled(n: int) -> None:
    # Polled, as `serve status` users do: Serve offers no event for this.
    while not await trio.to_thread.run_sync(serve_settled, n):  # noqa: ASYNC110
        await trio.sleep(POLL_S)


def serve_settled(n: int) -> bool:
    """Whether the race's application is what ``serve.run`` waits for (RUNNING) and its one
    deployment HEALTHY with exactly `n` replicas, all RUNNING (none starting or stopping)."""
    from ray import serve

    app = serve.status().applications.get("race")
    if app is None or not _is(app.status, "RUNNING"):
        return False
    status = app.deployments.get("Noop")
    if status is None or not _is(status.status, "HEALTHY"):
        return False
    states = {getattr(k, "value", k): v for k, v in dict(status.replica_states).items()}
    return states == {"RUNNING": n}


def _is(status: Any, name: str) -> bool:
    # Serve's statuses are str enums: compare their values, whatever str() makes of them.
    value: object = getattr(status, "value", status)
    return value == name


async def timed(step: Step) -> list[float]:
    times = []
    for n in STEPS:
        started = time.perf_counter()
        await step(n)
        times.append(time.perf_counter() - started)
    return times


async def race(rounds: int) -> dict[str, list[list[float]]]:
    from ray import serve

    results: dict[str, list[list[float]]] = {name: [] for name in CONTENDERS}
    serve.start(http_options={"host": "127.0.0.1", "port": 0})  # not timed: once per cluster
    # Serve does not mix applications made by serve.run with ones from a config, so its
    # declarative path runs in a phase of its own, after the first, on the same cluster.
    phases: list[list[tuple[str, Race]]] = [
        [
            ("controller", race_controller),
            ("serve", race_serve({})),
            ("serve_tuned", race_serve(SERVE_TUNED)),
            ("raw", race_raw),
        ],
        [
            ("serve_config", race_serve_config({})),
            ("serve_config_tuned", race_serve_config(SERVE_TUNED)),
        ],
    ]
    for contenders in phases:
        # A warm-up round each, not counted: the first actors of a cluster pay for its worker
        # pool, and Serve's config path builds its application in a new runtime environment.
        for name, run in contenders:
            await run([])
            print(f"warm-up {name} done", file=sys.stderr)
        for r in range(rounds):
            # Each contender goes first in turn: no one always runs right after the same one.
            k = r % len(contenders)
            for name, run in contenders[k:] + contenders[:k]:
                await run(results[name])
                print(f"round {r + 1} {name}: {fmt(results[name][-1])}", file=sys.stderr)
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
        ours = median["controller"][i]
        row: dict[str, Any] = {"step": f"{previous}->{n}"}
        row.update({f"{name}_s": median[name][i] for name in CONTENDERS})
        row.update({f"{name}_over_controller": median[name][i] / ours for name in CONTENDERS[2:]})
        row["controller_over_raw"] = ours / median["raw"][i]
        rows.append(row)
        previous = n
    return {"rounds": results, "median": rows}


def print_table(summary: dict[str, Any]) -> None:
    print(
        "| step | controller (RayRuntime) | raw Ray | controller / raw (target <= 1.15) "
        "| Serve, serve.run: default / tuned | Serve, config: default / tuned |"
    )
    print("|---|---|---|---|---|---|")
    for row in summary["median"]:
        print(
            f"| {row['step']} | {row['controller_s']:.3f} s | {row['raw_s']:.3f} s | "
            f"{row['controller_over_raw']:.2f} | "
            f"{row['serve_s']:.3f} / {row['serve_tuned_s']:.3f} s | "
            f"{row['serve_config_s']:.3f} / {row['serve_config_tuned_s']:.3f} s |"
        )
    print()
    print(
        "| step | Serve / controller (target >= 3): serve.run default | serve.run tuned "
        "| config default | config tuned |"
    )
    print("|---|---|---|---|---|")
    for row in summary["median"]:
        ratios = " | ".join(f"{row[f'{name}_over_controller']:.1f}x" for name in CONTENDERS[2:])
        print(f"| {row['step']} | {ratios} |")


def main() -> None:
    reaper.leave_nothing()
    parser = argparse.ArgumentParser(description="controller vs Ray Serve vs raw Ray")
    rounds = parser.add_mutually_exclusive_group()
    rounds.add_argument("--rounds", type=int, default=7, help="counted rounds (default 7)")
    rounds.add_argument("--quick", action="store_true", help="one counted round (CI-sized)")
    parser.add_argument("--out", type=Path, default=HERE / "ray_results.json")
    args = parser.parse_args()
    n_rounds = 1 if args.quick else args.rounds
    with tempfile.TemporaryDirectory(prefix="rayb", dir="/tmp") as tmp:
        os.environ.setdefault("RAY_TMPDIR", tmp)  # short: Ray's Unix socket paths
        # "local": a cluster of our own, never one that another `ray start` left on this host.
        ray.init(
            address="local", num_cpus=4, include_dashboard=False, logging_level=logging.WARNING
        )
        try:
            summary = summarize(trio.run(race, n_rounds))
        finally:
            ray.shutdown()
    summary["machine"] = {"cpus": os.cpu_count(), "ray": ray.__version__}
    summary["date"] = datetime.date.today().isoformat()
    summary["counted_rounds"] = n_rounds
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print_table(summary)


if __name__ == "__main__":
    main()
