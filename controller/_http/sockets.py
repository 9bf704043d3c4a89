"""Non-blocking sockets driven by trio's lowest level: try the call, and only if the kernel
says it would block, wait for the socket with ``trio.lowlevel.wait_readable`` /
``wait_writable``.

Why not ``trio.SocketStream``: a proxied request is a handful of reads and writes, and a
stream's checkpoints, conflict detectors and per-call cancel scopes cost more than the
kernel's work for them (measured: about half of the ingress's time per request). These calls
wait only when they must, so a call that finds data (or room) at once is no checkpoint; the
callers' loops each wait at least once per request (for the replica's answer, or for the
client's next request), which is where they yield to other tasks and can be cancelled.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket

import trio

READ_SIZE = 65536


async def receive(sock: socket.socket, *, wait_first: bool = True) -> bytes:
    """The next bytes (``b""`` at the end). `wait_first`: wait for the socket before trying,
    when nothing can be there yet (it saves a failed call)."""
    if wait_first:
        await trio.lowlevel.wait_readable(sock)
    while True:
        try:
            return sock.recv(READ_SIZE)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
        except (ConnectionResetError, ConnectionAbortedError, TimeoutError):
            return b""  # reset by the peer: the same end, said rudely


def receive_now(sock: socket.socket) -> bytes | None:
    """What the socket holds now, without waiting: None if nothing (yet)."""
    try:
        return sock.recv(READ_SIZE)
    except BlockingIOError:
        return None
    except (ConnectionResetError, ConnectionAbortedError, TimeoutError):
        return b""


async def send_all(sock: socket.socket, data: bytes | bytearray | memoryview) -> None:
    """Send all of `data`, waiting for room only when the kernel's buffer is full. Raises
    ``OSError`` (``BrokenPipeError``, ``ConnectionResetError``) if the peer is gone."""
    try:
        sent = sock.send(data)
    except BlockingIOError:
        sent = 0
    if sent == len(data):
        return
    view = memoryview(data)[sent:]
    while view:
        await trio.lowlevel.wait_writable(sock)
        try:
            sent = sock.send(view)
        except BlockingIOError:
            continue
        view = view[sent:]


#: As a plain int: the flags are an enum, and or-ing enums on every call costs microseconds.
_PEEK = int(socket.MSG_PEEK | socket.MSG_DONTWAIT)


def is_idle_and_open(sock: socket.socket) -> bool:
    """Whether a kept connection is still open and silent: one peek that does not wait. A
    closed one (EOF or a reset) or one with stray bytes is neither."""
    try:
        sock.recv(1, _PEEK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


async def connect(host: str, port: int) -> socket.socket:
    """A non-blocking TCP connection to `host`:`port` (a name is looked up first). Raises
    ``OSError`` if it cannot be made; the caller bounds the wait."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
        address: tuple[str, int] = (host, port)
    except ValueError:
        infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        if not infos:
            raise OSError(errno.EHOSTUNREACH, f"{host} has no address") from None
        family, _, _, _, sockaddr = infos[0]
        address = (str(sockaddr[0]), int(sockaddr[1]))
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.connect(address)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if error:
                raise OSError(error, os.strerror(error)) from None
    except BaseException:
        close(sock)
        raise
    return sock


def close(sock: socket.socket) -> None:
    """Close, telling trio first (a task waiting on it is woken, not left on a dead fd)."""
    if sock.fileno() >= 0:
        trio.lowlevel.notify_closing(sock)
    sock.close()


async def receive_upstream(sock: socket.socket) -> bytes:
    """The replica's next bytes (``b""``: it closed, or reset).

    Other tasks run first, and only then is the socket tried: under load, by the time they
    have, the answer is in, and the socket need not be registered with epoll and waited on
    (a system call and a good part of a request's scheduling, saved)."""
    await trio.lowlevel.checkpoint()
    while True:
        try:
            return sock.recv(READ_SIZE)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
        except OSError:
            return b""
