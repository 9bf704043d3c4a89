"""The Ray actor that runs one node's ingress: ``controller ingress`` in a process of its own on
that node, following the daemon over its API as any ingress does, and listening on the node's
address. The actor only starts it, tells when it ends, and stops it; the process dies with the
actor (Ray kills an actor's children, and the process also asks the kernel for a signal should
its parent die).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import sys
import tempfile
from typing import Any, final

import ray

from ._host import free_port

#: How long the process may take to listen once started.
_LISTEN_S = 30.0
#: How long a stopped process may drain its requests (the ingress's own bound, and a margin).
_STOP_S = 12.0


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


async def _copy(process: asyncio.subprocess.Process, fd: int, serving: asyncio.Event) -> None:
    """Append `process`'s output to the file `fd` (closed at its end); set `serving` at its
    line that says it serves, or at its end (it exited: the caller reads why)."""
    assert process.stdout is not None
    try:
        async for line in process.stdout:
            os.write(fd, line)
            if b" serving on http" in line:
                serving.set()
    finally:
        os.close(fd)
        serving.set()


@final
class IngressHost:
    """Built by the daemon's node ingresses as a named actor pinned to its node."""

    def __init__(self) -> None:
        self._spec: dict[str, Any] = {}
        self._process: asyncio.subprocess.Process | None = None
        self._address = ""
        self._log = ""
        self._copier: asyncio.Future[None] | None = None

    async def start(self, spec_json: str) -> str:
        """Start the ingress process and answer once it listens. Once: a daemon that adopts
        the actor gets the process running, unless it follows another daemon's API (a new
        leader, or one restarted on another port), which is then stopped and started anew."""
        spec = json.loads(spec_json)
        if self._process is not None and self._process.returncode is None:
            if spec == self._spec:
                return self._reply()
            await self.stop()
        self._spec = spec
        host = spec["host"] or ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        port = spec["port"] or free_port(host)
        self._address = f"{host}:{port}"
        argv = [sys.executable, "-m", "controller", "ingress", "--url", spec["url"]]
        for url in spec["also_urls"]:
            argv += ["--also-url", url]
        argv += ["--listen", self._address, "--prefer-host", host]
        self._forget_log()  # an earlier process's, whose end was told (`wait_exit`)
        fd, self._log = tempfile.mkstemp(prefix="controller-ingress-", suffix=".log")
        env = {**os.environ, "CONTROLLER_TOKEN": spec["token"]}
        self._process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            preexec_fn=_die_with_parent,
        )
        # Its output is copied to its log file by a task of the actor's, which also says when
        # the process has logged that it serves: no polling of the port.
        serving = asyncio.Event()
        self._copier = asyncio.ensure_future(_copy(self._process, fd, serving))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(serving.wait(), _LISTEN_S)
        if serving.is_set() and self._process.returncode is None:
            return self._reply()
        return json.dumps({"ok": False, "error": f"it did not serve: {self._tail()}"})

    async def wait_exit(self) -> str:
        """Answers when the process ends: how it ended, and the end of its log."""
        process = self._process
        if process is None:
            return json.dumps({"exit": "never started", "log": ""})
        code = await process.wait()
        said = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        return json.dumps({"exit": said, "log": self._tail()})

    async def stop(self) -> str:
        """SIGTERM: the ingress stops taking connections and finishes those under way."""
        process = self._process
        if process is not None and process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), _STOP_S)
            except TimeoutError:
                process.kill()
                await process.wait()
        self._forget_log()  # stopped on purpose: nothing of it is left on the node
        return json.dumps({"ok": True})

    def _forget_log(self) -> None:
        if self._log:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._log)
            self._log = ""

    def _reply(self) -> str:
        process = self._process
        assert process is not None
        node = ray.get_runtime_context().get_node_id()
        return json.dumps(
            {
                "ok": True,
                "address": self._address,
                "pid": process.pid,
                "node": node,
                "log": self._log,
            }
        )

    def _tail(self) -> str:
        try:
            with open(self._log, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 2000))
                lines = f.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(lines[-5:])
