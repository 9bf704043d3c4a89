"""The asyncio web app with the controller under trio-asyncio: the entry point is
``trio_asyncio.run``, and asyncio (aiohttp here) runs on trio-asyncio's loop inside trio.

    python3 examples/aio_trio_asyncio_app.py [--port 8080] [--demo]

``--demo`` drives the app's own endpoints (deploy, scale, list, delete) and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

import trio
import trio_asyncio

sys.path.insert(0, str(Path(__file__).parent))
from aio_app import clean_up, run, runtime_and_store, temp_dir  # beside this file

from controller.aio import open_under_trio_asyncio


async def app_main(port: int, demo_only: bool) -> None:
    with temp_dir() as tmp:
        runtime, store = runtime_and_store(tmp)
        with store:
            async with open_under_trio_asyncio(runtime=runtime, store=store) as ctl:
                try:
                    await run(ctl, port, demo_only)
                finally:
                    await asyncio.shield(clean_up(ctl))


async def main(port: int, demo_only: bool) -> None:
    # trio_asyncio.run calls a trio function: from here on, asyncio code enters via aio_as_trio.
    # Ctrl-C is trio's to handle here: it cancels the app, whose cleanup then runs.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for _ in signals:
                    nursery.cancel_scope.cancel()

            nursery.start_soon(stop_on_signal)
            await trio_asyncio.aio_as_trio(app_main)(port, demo_only)
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--demo", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)6.0fms %(message)s")
    trio_asyncio.run(main, args.port, args.demo)
