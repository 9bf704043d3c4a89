"""Soak: live traffic through the router while a backend is scaled, reconfigured and rolled at
random, on real worker processes (LocalRuntime, SQLite). Drains are honoured (the echo replica
waits for a quiet moment before it closes), so not one request may fail.

    python bench/soak.py [--seconds 180] [--clients 4] [--seed N]

Prints the requests served, retried (a connection refused once, sent elsewhere) and failed, and
exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import tempfile
from pathlib import Path

import attrs
import trio

import controller

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))
import reaper  # noqa: E402  # beside this file
from router import Router  # noqa: E402  # the example router

log = logging.getLogger("soak")


async def soak(state: Path, seconds: float, clients: int, rng: random.Random) -> int:
    runtime = controller.LocalRuntime(state / "w", pythonpath=[EXAMPLES])
    echo = controller.ReplicaConfig("echo_replica:Echo", init_kwargs={"work_ms": 2})
    cfg = controller.BackendConfig(
        num_replicas=2,
        version="v1",
        user_config={"greeting": "g0"},
        resources={"CPU": 0.1},
        graceful_shutdown_timeout_s=5,
    )
    changes = 0
    with controller.SQLiteStore(state / "controller.db") as store:
        async with controller.open_controller(runtime=runtime, store=store) as ctl:
            await (await ctl.deploy("echo", cfg, echo)).wait()
            router = Router(ctl, "echo")
            async with trio.open_nursery() as nursery:
                await nursery.start(router.follow)

                async def client() -> None:
                    while True:
                        try:
                            await router.request()
                        except OSError as exc:
                            log.warning("request failed: %s", exc)

                for _ in range(clients):
                    nursery.start_soon(client)
                with trio.move_on_after(seconds):
                    while True:
                        what = rng.choice(["scale", "config", "roll"])
                        if what == "scale":
                            cfg = attrs.evolve(cfg, num_replicas=rng.randint(1, 5))
                        elif what == "config":
                            cfg = attrs.evolve(cfg, user_config={"greeting": f"g{changes}"})
                        else:
                            cfg = attrs.evolve(cfg, version=f"v{changes}")
                        await (await ctl.deploy("echo", cfg, echo)).wait()
                        changes += 1
                        log.info(
                            "change %d (%s): %s; %d served, %d failed so far",
                            changes,
                            what,
                            ctl.status("echo").message,
                            sum(router.ok.values()),
                            router.failed,
                        )
                        await trio.sleep(rng.uniform(0.2, 1.5))  # traffic between changes
                nursery.cancel_scope.cancel()
            with trio.move_on_after(30, shield=True):
                await (await ctl.delete("echo")).wait()
    served = sum(router.ok.values())
    print(
        f"soak: {seconds:g} s, {changes} changes, {served} requests served, "
        f"{router.retried} retried, {router.failed} failed"
    )
    return 1 if router.failed else 0


def main() -> None:
    reaper.leave_nothing()
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)7.0fms %(message)s")
    logging.getLogger("controller").setLevel(logging.WARNING)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"soak seed: {seed}")
    with tempfile.TemporaryDirectory(prefix="soak", dir="/tmp") as tmp:  # short socket paths
        sys.exit(trio.run(soak, Path(tmp), args.seconds, args.clients, random.Random(seed)))


if __name__ == "__main__":
    main()
