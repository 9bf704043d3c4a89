"""``controller ingress``: the ingress in processes of its own, following a daemon over HTTP.

Several processes may serve one port (``--workers N``, or several commands with the same
``--listen``): each binds it with ``SO_REUSEPORT`` and the kernel spreads connections over
them, so the ingress uses every core. Each reports its own load; the daemon sums them."""

from __future__ import annotations

import argparse
import ctypes
import signal
import socket
import subprocess
import sys
from typing import Any

from .._daemon.log_format import setup_logging
from .client import CLIError, make_client


def cmd_ingress(args: argparse.Namespace) -> int:
    # Here, not at the top: every CLI call imports this module, and most never serve.
    import trio

    from .._daemon.ingress_process import serve
    from ..ingress import HTTPSource, IngressConfig

    setup_logging(args.log_format)
    client = make_client(args)
    if client.token is None:
        raise CLIError("controller ingress: no token (give --token or $CONTROLLER_TOKEN)", 1)
    host, _, port_text = args.listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        port = int(port_text)
        source = HTTPSource(client.url, client.token, tuple(args.also_url))
    except ValueError as exc:
        raise CLIError(f"controller ingress: {exc}", 2) from None
    if not args.share_port:
        port = _free_or_refused(host, port, args.listen)
    children = _spawn_others(args.workers, f"{host}:{port}")
    config = IngressConfig(access_log=args.access_log, prefer_host=args.prefer_host)
    try:
        trio.run(serve, source, config, host, port)
    except OSError as exc:
        raise CLIError(
            f"controller ingress: cannot listen on {args.listen}: {exc.strerror or exc}", 1
        ) from None
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
        for child in children:
            child.wait()
    return 0


def _free_or_refused(host: str, port: int, listen: str) -> int:
    """The port to serve, checked free: with ``SO_REUSEPORT`` another process could serve it
    beside us unnoticed (another daemon's ingress, say), so a port in use is refused unless
    --share-port says it is meant. Port 0: a free port, the same for every --workers process."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise CLIError(
                f"controller ingress: cannot listen on {listen}: {exc.strerror or exc}; to serve "
                "it beside other `controller ingress` processes that follow the same daemon, "
                "give --share-port",
                1,
            ) from None
        return int(probe.getsockname()[1])


def _spawn_others(workers: int, listen: str) -> list[subprocess.Popen[bytes]]:
    """`workers` - 1 more processes on the same port (`listen`), with this command's own
    arguments."""
    if workers <= 1:
        return []
    argv = [sys.executable, "-m", "controller", *_without(sys.argv[1:], "--workers", "--listen")]
    return [
        subprocess.Popen(
            [*argv, "--workers", "1", "--listen", listen, "--share-port"],
            preexec_fn=_die_with_parent,
        )
        for _ in range(workers - 1)
    ]


def _die_with_parent() -> None:
    """In the child, before it runs: a SIGTERM when this process dies, however it dies (a
    kill -9 included), so no worker is left holding the port. Linux's PR_SET_PDEATHSIG."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass  # not Linux: --workers children then outlive a killed parent


def _without(argv: list[str], *options: str) -> list[str]:
    """`argv` less the `options` (each with its value, as ``--x V`` or ``--x=V``)."""
    out: list[str] = []
    skip = False
    for item in argv:
        if skip:
            skip = False
            continue
        if item in options:
            skip = True
            continue
        if item.startswith(tuple(f"{option}=" for option in options)):
            continue
        out.append(item)
    return out


def add_ingress_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ingress = sub.add_parser(
        "ingress", help="route HTTP traffic to replicas, following a daemon (in its own process)"
    )
    ingress.add_argument(
        "--listen", default="127.0.0.1:8000", help="HOST:PORT to serve (default %(default)s)"
    )
    ingress.add_argument(
        "--also-url",
        action="append",
        default=[],
        metavar="URL",
        help="another daemon of the same store (a standby), followed while --url cannot be "
        "reached (repeatable)",
    )
    ingress.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes serving the port (SO_REUSEPORT); one per core uses them all (default "
        "%(default)s)",
    )
    ingress.add_argument(
        "--share-port",
        action="store_true",
        help="serve the port beside other `controller ingress` processes already on it (they "
        "must follow the same daemon); without it, a port in use is refused",
    )
    ingress.add_argument("--access-log", action="store_true", help="one line per request")
    ingress.add_argument(
        "--prefer-host",
        metavar="HOST",
        help="locality: send requests to replicas serving at HOST (this node's address) while "
        "one has room, and to the others only beyond that",
    )
    ingress.add_argument(
        "--log-format",
        choices=["human", "json"],
        default="human",
        help="log lines for people, or one JSON object each (default %(default)s)",
    )
    ingress.set_defaults(func=cmd_ingress)


#: The most ingress processes a daemon runs: many more than cores only adds scheduling.
MAX_INGRESS_WORKERS = 64


def ingress_workers(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_INGRESS_WORKERS:
        raise argparse.ArgumentTypeError(
            f"must be a whole number from 1 to {MAX_INGRESS_WORKERS} (got {text!r})"
        )
    return value


def describe_ingress(ingress: dict[str, Any]) -> str:
    """One line: where the daemon's ingress processes serve, how many do, and any trouble."""
    processes = ingress.get("processes") or []
    serving = [p for p in processes if p.get("state") == "serving"]
    line = (
        f"ingress: {len(serving)}/{len(processes)} processes serving on "
        f"http://{ingress['listen']} (pids {', '.join(str(p['pid']) for p in serving) or '-'})"
    )
    restarts = sum(int(p.get("restarts", 0)) for p in processes)
    if restarts:
        last = [p["last_exit"] for p in processes if p.get("last_exit")]
        line += f"; {restarts} restarted" + (f" (last: {last[-1]})" if last else "")
    lost = [str(p["slot"]) for p in serving if not p.get("following")]
    if lost:
        slots = "slot" if len(lost) == 1 else "slots"
        line += f"; not following this daemon yet: {slots} {', '.join(lost)}"
    return line
