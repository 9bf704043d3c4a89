"""The daemon's listening sockets (its API, its ingress), bound before anything else is opened:
a port already in use stops the start before it touches the store or any replica."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import socket
from collections.abc import Iterator

from .._model.values.errors import StartupError

logger = logging.getLogger("controller.daemon")


@contextlib.contextmanager
def bound(listen: str, flag: str, *, warn_remote: bool) -> Iterator[socket.socket]:
    """A socket listening on `listen` (``HOST:PORT``), named `flag` in errors; closed on exit
    unless taken over. Close-on-exec and not inheritable (Python's default): no worker keeps a
    port open after the daemon exits."""
    host, _, port_text = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        port = int(port_text)
        if not 0 <= port <= 65535:
            raise ValueError("a port is 0 to 65535")
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (ValueError, OSError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise StartupError(
            f"{flag} {listen!r}: not a HOST:PORT this machine can use ({reason})"
        ) from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        advice = {
            errno.EADDRINUSE: "another process holds the port (another daemon?): stop it, or "
            f"pick another port with {flag}",
            errno.EADDRNOTAVAIL: f"this machine has no such address: pick one of its own with "
            f"{flag}",
            errno.EACCES: f"ports below 1024 need privileges: pick a higher one with {flag}",
        }.get(exc.errno or 0, f"pick another address with {flag}")
        raise StartupError(f"cannot listen on {listen}: {exc.strerror or exc}; {advice}") from None
    if warn_remote and not is_loopback(sock.getsockname()[0]):
        logger.warning(
            "listening on %s, beyond loopback: the API is plain HTTP, so the bearer token and "
            "every request cross the network unencrypted, and whoever holds the token runs code "
            "as this user. Put TLS in front (a reverse proxy) or keep to a trusted network; "
            "--allow-remote says it is meant and silences this warning",
            listen,
        )
    try:
        yield sock
    finally:
        if sock.fileno() != -1:
            sock.close()


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
