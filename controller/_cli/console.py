"""``controller console`` and ``controller scale``: the web console's login link, and a count.

controller console [--no-open]
controller scale NAME REPLICAS [--wait]
controller scale NAME [--min N] [--max N] [--wait]     (an autoscaled backend's range)
"""

from __future__ import annotations

import argparse
import os
import sys
import webbrowser

from .client import CLIError, make_client
from .options import NAME_HELP, WAIT_TIMEOUT_HELP
from .rollout import backend_path, seconds
from .waiting import wait_for


def cmd_console(args: argparse.Namespace) -> int:
    client = make_client(args)
    if client.token is None:
        raise CLIError("controller console: no token (give --token or $CONTROLLER_TOKEN)")
    made = client.ok("POST", "/api/v1/console/links")
    # The code is in the fragment: the browser never sends it to a server or a Referer, and
    # the page takes it out of the address at once. It works once, within a minute.
    link = f"{client.url}{made['path']}"
    print(f"the console: {client.url}/")
    print(f"log in with this link (once, within a minute): {link}")
    if not args.no_open and _graphical():
        webbrowser.open(link)
    return 0


def _graphical() -> bool:
    """A browser to open: a terminal on a server has none, and webbrowser would start a text
    one in our terminal."""
    return sys.platform == "darwin" or bool(
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    )


def cmd_scale(args: argparse.Namespace) -> int:
    client = make_client(args)
    body: dict[str, int] = {}
    if args.replicas is not None:
        body["replicas"] = args.replicas
    if args.min is not None:
        body["min_replicas"] = args.min
    if args.max is not None:
        body["max_replicas"] = args.max
    if not body:
        raise CLIError("controller scale: give REPLICAS (or --min/--max for an autoscaled backend)")
    result = client.ok("POST", backend_path(args.name, "scale"), body)
    said = ", ".join(f"{k.replace('_replicas', '')} {v}" for k, v in body.items())
    print(f"backend/{args.name} scaled: {said} (generation {result['generation']})")
    if not args.wait:
        return 0
    return wait_for(client, [args.name], set(), args.timeout, {args.name: result["generation"]})


def add_console_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    console = sub.add_parser("console", help="a one-time login link to the web console")
    console.add_argument(
        "--no-open", action="store_true", help="print the link only; open no browser"
    )
    console.set_defaults(func=cmd_console)

    scale = sub.add_parser("scale", help="set a backend's replicas (or its autoscaling range)")
    scale.add_argument("name", help=NAME_HELP)
    scale.add_argument("replicas", nargs="?", type=int, help="how many replicas to run")
    scale.add_argument("--min", type=int, help="an autoscaled backend's min_replicas")
    scale.add_argument("--max", type=int, help="an autoscaled backend's max_replicas")
    scale.add_argument("--wait", action="store_true", help="show progress until it is done")
    scale.add_argument("--timeout", type=seconds, default=600.0, help=WAIT_TIMEOUT_HELP)
    scale.set_defaults(func=cmd_scale)
