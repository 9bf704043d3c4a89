"""One task that reads the monitor connections of every worker a runtime holds.

A task per connection, each parked in ``wait_readable``, would cost each answer to a health check
a wake-up of its own (a registration with trio's epoll both ways, a task switch): most of what a
check costs the controller. Here the connections are registered once in an epoll set of their
own, whose descriptor trio watches: when any has something to read, this one task wakes and
reads all that are ready, so a wave of answers that come together costs one wake-up. Each
connection's holder still waits for its end (``read``), which is the news of its worker's death.
Linux only, as ``LocalRuntime`` is.
"""

from __future__ import annotations

import contextlib
import select
from typing import final

import trio

from .link import MonitorLink, OnLoad


@final
class LinkReader:
    """The monitor connections of a runtime, read by ``serve``'s one task; ``read`` hands it
    one and returns when that ends. Without ``serve`` running, ``read`` reads its own."""

    def __init__(self) -> None:
        self._epoll: select.epoll | None = None
        self._links: dict[int, tuple[MonitorLink, OnLoad, trio.Event]] = {}

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read every connection handed to ``read`` as it has something, until cancelled."""
        with select.epoll() as epoll:
            self._epoll = epoll
            try:
                task_status.started()
                while True:
                    await trio.lowlevel.wait_readable(epoll.fileno())
                    for fd, _ in epoll.poll(0):
                        held = self._links.get(fd)
                        if held is not None and not held[0].pull(held[1]):
                            self._let_go(fd)
            finally:
                self._epoll = None
                for fd in list(self._links):
                    self._let_go(fd)

    async def read(self, link: MonitorLink, on_load: OnLoad) -> None:
        """As ``link.read``: until the connection ends, answers wake their checks and loads go
        to `on_load`; then it is closed."""
        if self._epoll is None:
            await link.read(on_load)
            return
        ended = trio.Event()
        try:
            if link.take(on_load, b""):  # what came with the worker's hello
                self._links[link.fd] = (link, on_load, ended)
                self._epoll.register(link.fd, select.EPOLLIN)
                await ended.wait()
        finally:
            held = self._links.get(link.fd)
            if held is not None and held[0] is link:
                self._let_go(link.fd)
            await link.close()

    def _let_go(self, fd: int) -> None:
        _, _, ended = self._links.pop(fd)
        if self._epoll is not None:
            with contextlib.suppress(OSError):  # already closed, or never registered
                self._epoll.unregister(fd)
        ended.set()
