"""The quickstart on Ray: the same backends, router and traffic, with replicas as Ray actors.

Starts a local Ray cluster (its files in a temporary directory), keeps the controller's intent in
the cluster's key-value store (RayKVStore), and runs the quickstart's demo: deploy, live traffic
through the router, scale up, change the user config in place, roll a new version, scale down,
delete. Needs Ray: ``pip install ".[ray]"``.

    python3 examples/ray_quickstart.py [--clients N] [--address ADDRESS]

With ``--address`` it joins a running cluster instead of starting one.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

import ray
import trio

import controller
from controller.ray import RayKVStore, RayRuntime

sys.path.insert(0, str(Path(__file__).parent))
from quickstart import HERE, demo_then_clean_up  # the example sits beside this file


async def main(clients: int) -> None:
    runtime = RayRuntime(namespace="ray-quickstart", pythonpath=[HERE])
    store = RayKVStore(namespace="ray-quickstart")
    async with controller.open_controller(runtime=runtime, store=store) as ctl:
        await demo_then_clean_up(ctl, clients)


def run() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients sending traffic")
    parser.add_argument("--address", help="a running Ray cluster to join (default: start one)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)6.0fms %(message)s")
    with tempfile.TemporaryDirectory(prefix="rayqs", dir="/tmp") as tmp:
        if args.address is None:
            # A cluster of our own, its files (and Unix sockets: keep the path short) in tmp.
            os.environ.setdefault("RAY_TMPDIR", tmp)
            ray.init(num_cpus=4, include_dashboard=False, logging_level=logging.WARNING)
        else:
            ray.init(address=args.address, logging_level=logging.WARNING)
        try:
            trio.run(main, args.clients)
        finally:
            ray.shutdown()


if __name__ == "__main__":
    run()
