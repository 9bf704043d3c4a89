"""Quickstart: deploy, scale, roll and delete backends, printing every transition.

Runs on the embedded SQLite store and, for now, on ``controller.testing.FakeRuntime`` with a
simulated start delay (the local-process runtime replaces it in a later release). Run it with
``python examples/quickstart.py``; it takes a few seconds and stops cleanly on Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import random
import tempfile
from pathlib import Path

import attrs
import trio

import controller
from controller.testing import FakeRuntime, FakeState

log = logging.getLogger("quickstart")


async def simulate_starts(runtime: FakeRuntime, delay_s: float) -> None:
    """Stand in for real processes: each pending start finishes after about `delay_s`."""
    pending: set[str] = set()
    async with trio.open_nursery() as nursery:
        while True:
            await runtime.wait_until(lambda rt: bool(set(rt.tags(FakeState.STARTING)) - pending))
            for tag in set(runtime.tags(FakeState.STARTING)) - pending:
                pending.add(tag)
                nursery.start_soon(finish_later, runtime, tag, delay_s * random.uniform(0.5, 1.5))


async def finish_later(runtime: FakeRuntime, tag: str, delay_s: float) -> None:
    await trio.sleep(delay_s)
    if runtime.replicas[tag].state is FakeState.STARTING:
        runtime.finish_start(tag)


async def print_changes(ctl: controller.Controller) -> None:
    """Follow every backend's watch snapshots, as a router would."""
    known: dict[str, int] = {}
    while True:
        for name, snapshot in sorted(
            (await ctl.listen_for_change(known, all_backends=True)).items()
        ):
            known[name] = snapshot.snapshot_id
            if snapshot.exists:
                tags = ", ".join(r.tag.partition("#")[2][:6] for r in snapshot.replicas) or "-"
                log.info("watch  %-6s serving %d: %s", name, len(snapshot.replicas), tags)
            else:
                log.info("watch  %-6s gone", name)


async def step(ctl: controller.Controller, what: str, goal: controller.Goal) -> None:
    log.info("---- %s", what)
    outcome = await goal.wait()
    try:
        log.info("goal   %s: %s", outcome.value.lower(), ctl.status(goal.backend).message)
    except controller.UnknownBackendError:
        log.info("goal   %s: %s deleted", outcome.value.lower(), goal.backend)


async def main(state_dir: Path, delay_s: float) -> None:
    runtime = FakeRuntime(capacity={"CPU": 8})
    with controller.SQLiteStore(state_dir / "controller.db") as store:
        async with (
            controller.open_controller(runtime=runtime, store=store) as ctl,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(simulate_starts, runtime, delay_s)
            nursery.start_soon(print_changes, ctl)
            echo = controller.ReplicaConfig("app.echo:Echo", init_kwargs={"greeting": "hi"})
            cfg = controller.BackendConfig(
                num_replicas=2,
                version="v1",
                user_config={"greeting": "hello"},
                resources={"CPU": 1},
                graceful_shutdown_timeout_s=1,
            )
            await step(ctl, "deploy echo: 2 replicas", await ctl.deploy("echo", cfg, echo))
            await step(
                ctl,
                "deploy stats: 1 replica",
                await ctl.deploy(
                    "stats",
                    controller.BackendConfig(num_replicas=1, version="s1"),
                    controller.ReplicaConfig("app.stats:Stats"),
                ),
            )
            cfg = attrs.evolve(cfg, num_replicas=4)
            await step(ctl, "scale echo to 4", await ctl.deploy("echo", cfg, echo))
            cfg = attrs.evolve(cfg, user_config={"greeting": "hey"})
            await step(
                ctl, "new user config for echo (in place)", await ctl.deploy("echo", cfg, echo)
            )
            cfg = attrs.evolve(cfg, version="v2")
            await step(ctl, "roll echo to version v2", await ctl.deploy("echo", cfg, echo))
            try:
                too_big = attrs.evolve(cfg, num_replicas=20)
                await ctl.deploy("echo", too_big, echo)
            except controller.InfeasibleError as exc:
                log.info("---- scale echo to 20 refused: %s", exc)
            cfg = attrs.evolve(cfg, num_replicas=1)
            await step(ctl, "scale echo down to 1", await ctl.deploy("echo", cfg, echo))
            await step(ctl, "delete stats", await ctl.delete("stats"))
            await step(ctl, "delete echo", await ctl.delete("echo"))
            log.info("done: %d replicas were started in all", len(runtime.replicas))
            nursery.cancel_scope.cancel()


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", type=Path, help="where the SQLite file goes (default: temp)")
    parser.add_argument("--start-delay", type=float, default=0.3, help="simulated start time (s)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)6.0fms %(message)s")
    try:
        if args.state_dir is not None:
            args.state_dir.mkdir(parents=True, exist_ok=True)
            trio.run(main, args.state_dir, args.start_delay)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                trio.run(main, Path(tmp), args.start_delay)
    except KeyboardInterrupt:
        log.info("interrupted; replicas are left for the next controller to adopt")


if __name__ == "__main__":
    run()
