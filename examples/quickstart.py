"""Quickstart: real worker processes serving HTTP, a router following the controller, live traffic.

Deploys the ``echo`` backend (``examples/echo_replica.py``) on LocalRuntime with the SQLite store,
sends traffic through the router (``examples/router.py``) the whole time, scales up, changes the
user config in place, rolls a new version, scales down and deletes, printing each transition and
the request counts. Ctrl-C stops it cleanly: traffic stops, the backend is drained and deleted.

    python3 examples/quickstart.py [--state-dir DIR] [--clients N]
"""

from __future__ import annotations

import argparse
import collections
import logging
import signal
import sys
import tempfile
from pathlib import Path

import attrs
import trio

import controller

sys.path.insert(0, str(Path(__file__).parent))
from router import Router  # the example sits beside this file

log = logging.getLogger("quickstart")
HERE = Path(__file__).parent


async def traffic(router: Router, clients: int) -> None:
    async def client() -> None:
        while True:
            try:
                await router.request()
            except OSError as exc:
                log.warning("request failed: %s", exc)

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(client)


def counts(router: Router) -> str:
    by_replica = ", ".join(
        f"{tag.partition('#')[2][:6]}={n}" for tag, n in sorted(router.ok.items())
    )
    return (
        f"requests: {sum(router.ok.values())} ok, {router.failed} failed, "
        f"{router.retried} retried ({by_replica})"
    )


async def step(
    ctl: controller.Controller, router: Router | None, what: str, goal: controller.Goal
) -> None:
    log.info("---- %s", what)
    outcome = await goal.wait()
    if router is not None:
        await trio.sleep(0.5)  # let traffic flow on the new set for a moment, so counts show it
    log.info("goal   %s: %s", outcome.value.lower(), ctl.status(goal.backend).message)
    if router is not None:
        log.info("       %s", counts(router))
        router.ok = collections.Counter()


async def demo(ctl: controller.Controller, clients: int) -> None:
    echo = controller.ReplicaConfig("echo_replica:Echo", init_kwargs={"work_ms": 5})
    cfg = controller.BackendConfig(
        num_replicas=2,
        version="v1",
        user_config={"greeting": "hello"},
        resources={"CPU": 0.25},
        graceful_shutdown_timeout_s=5,
    )
    await step(ctl, None, "deploy echo: 2 replicas", await ctl.deploy("echo", cfg, echo))
    router = Router(ctl, "echo")
    async with trio.open_nursery() as nursery:
        await nursery.start(router.follow)
        nursery.start_soon(traffic, router, clients)
        log.info("---- traffic: %d clients through the router", clients)
        await trio.sleep(1)
        log.info("       %s", counts(router))
        router.ok = collections.Counter()
        cfg = attrs.evolve(cfg, num_replicas=4)
        await step(ctl, router, "scale echo to 4", await ctl.deploy("echo", cfg, echo))
        cfg = attrs.evolve(cfg, user_config={"greeting": "hey"})
        await step(ctl, router, "new greeting (in place)", await ctl.deploy("echo", cfg, echo))
        reply = await router.request()
        log.info("       a replica now says %r", reply["greeting"])
        cfg = attrs.evolve(cfg, version="v2")
        await step(ctl, router, "roll echo to version v2", await ctl.deploy("echo", cfg, echo))
        cfg = attrs.evolve(cfg, num_replicas=1)
        await step(ctl, router, "scale echo down to 1", await ctl.deploy("echo", cfg, echo))
        nursery.cancel_scope.cancel()
    log.info("---- traffic stopped: %d requests failed in all", router.failed)


async def main(state_dir: Path, clients: int) -> None:
    runtime = controller.LocalRuntime(state_dir / "workers", pythonpath=[HERE])
    with controller.SQLiteStore(state_dir / "controller.db") as store:
        async with controller.open_controller(runtime=runtime, store=store) as ctl:
            await demo_then_clean_up(ctl, clients)


async def demo_then_clean_up(ctl: controller.Controller, clients: int) -> None:
    """The demo, stopped early by SIGINT or SIGTERM; then whatever it deployed is removed."""
    try:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def stop_on_signal() -> None:
                    async for _ in signals:
                        log.info("---- interrupted: cleaning up")
                        nursery.cancel_scope.cancel()

                nursery.start_soon(stop_on_signal)
                await demo(ctl, clients)
                nursery.cancel_scope.cancel()
    finally:
        # However the demo ended (done, interrupted, failed): drain and remove what it deployed,
        # so that no replica outlives the quickstart. Shielded, and bounded.
        with trio.move_on_after(30, shield=True) as cleanup:
            for name in [b.name for b in ctl.status().backends]:
                await delete(ctl, name)
        if cleanup.cancelled_caught:
            log.error("cleanup timed out; replicas may remain")


async def delete(ctl: controller.Controller, name: str) -> None:
    log.info("---- delete %s", name)
    await (await ctl.delete(name)).wait()
    log.info("goal   completed: %s deleted", name)


def run() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--state-dir", type=Path, help="SQLite file and worker sockets (default: temp)"
    )
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients sending traffic")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)6.0fms %(message)s")
    if args.state_dir is not None:
        args.state_dir.mkdir(parents=True, exist_ok=True)
        trio.run(main, args.state_dir.resolve(), args.clients)
    else:
        # In /tmp, because Unix socket paths must stay short.
        with tempfile.TemporaryDirectory(prefix="quickstart", dir="/tmp") as tmp:
            trio.run(main, Path(tmp), args.clients)


if __name__ == "__main__":
    run()
