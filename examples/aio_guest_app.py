"""The asyncio web app with the controller in trio's guest mode: a stock ``asyncio.run`` owns
the loop, and trio runs as its guest. No trio_asyncio anywhere in this process.

    python3 examples/aio_guest_app.py [--port 8080] [--demo]

``--demo`` drives the app's own endpoints (deploy, scale, list, delete) and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from aio_app import clean_up, run, runtime_and_store, temp_dir  # beside this file

from controller.aio import open_in_guest_mode


async def main(port: int, demo_only: bool) -> None:
    with temp_dir() as tmp:
        runtime, store = runtime_and_store(tmp)
        with store:
            async with open_in_guest_mode(runtime=runtime, store=store) as ctl:
                try:
                    await run(ctl, port, demo_only)
                finally:
                    await asyncio.shield(clean_up(ctl))
    logging.getLogger("aio_app").info("trio_asyncio imported: %s", "trio_asyncio" in sys.modules)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--demo", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)6.0fms %(message)s")
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: main's cleanup has run
        asyncio.run(main(args.port, args.demo))
