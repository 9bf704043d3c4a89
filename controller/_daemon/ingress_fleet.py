"""The daemon's ingress, in processes of its own: started, supervised and adopted by the daemon,
so that nothing a client of the ingress sends runs on the controller's thread.

`workers` processes (``controller._daemon.ingress_process``) each bind the ingress port with
``SO_REUSEPORT`` (the kernel spreads connections over them) and follow the daemon over its
API. Each has its own session: a Ctrl-C at the daemon's terminal does not reach it, and it
outlives the daemon, routing on the last snapshot, as replicas do; the next daemon on the same
state dir adopts the processes its records (``ingress/N.json``) name, if they are still the
same processes (pid and start time) and serve what it would start. One that exits is started
again (backoff 0.1 s to 5 s, forgiven after a minute of service) and its end is logged with the
last lines of its log. ``controller shutdown`` stops them; so does a daemon started with
another ingress address, or without one (``--no-ingress``), once its own serve.

Each process also answers on a Unix socket of its own (``ingress/N.PID.sock``): the daemon
reads its health and metrics there, and serves their sum on ``/metrics``. A process replacing
one of an earlier daemon on the same port takes over its listening sockets (handed over on
``ingress/N.PID.listeners``): closing a socket of a ``SO_REUSEPORT`` group resets the
connections queued on it, so the old process's are never closed while they hold any.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Mapping
from typing import Any, final

import trio

from .._api.views import iso
from .._files import private_dir
from .._model.values.errors import StartupError
from .._procfs import describe_exit
from .ingress_process import DRAIN_S
from .ingress_records import (
    STOP_MARGIN_S,
    Handle,
    Record,
    ask,
    forget_sockets,
    hold,
    max_slot,
    split,
    stop_records,
    tail,
    take_listeners,
)
from .ingress_slot import START_TIMEOUT_S, FleetOptions, Launcher, Member
from .metrics_merge import fleet_metrics, merge_metrics
from .process_watch import KILLED_EXIT_S, ProcessWatch
from .statedir import StateDir

logger = logging.getLogger("controller.daemon")

#: The backlog of the port the daemon listens on until its first processes serve (as theirs).
LISTEN_BACKLOG = 1024
#: Waits between starts of a process that keeps exiting.
BACKOFF_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
#: A process that served this long has its earlier exits forgiven.
FORGIVE_AFTER_S = 60.0


@final
class Fleet:
    """The ingress processes of one daemon (its state dir)."""

    def __init__(self, state: StateDir, options: FleetOptions, env: Mapping[str, str]):
        self.state = state
        self.options = options
        self.env = dict(env)
        self.members = [Member(slot) for slot in range(options.workers)]
        self.address = ""
        """The port the processes serve, ``HOST:PORT`` (known once `claim`ed)."""
        self._digest = options.digest()
        self._launcher = Launcher(state, options, self.env, self._digest, self._stopped)
        self._adopt: dict[int, Record] = {}
        self._retire: list[Record] = []
        self._heirs: dict[int, Record] = {}
        """Per slot, the retired process on this port whose listening socket its next process
        takes over (so that stopping it resets no queued connection)."""
        self._holder: socket.socket | None = None
        self._shared: int | None = None
        """The holder's descriptor, when it listens (a fresh start, ``claim``): the socket the
        processes share, kept while the daemon runs."""
        self.stopping = False
        """Set by `stop`: an exit is then the end, not a cause to start another."""
        self._handles: dict[int, Handle] = {}
        self._exited: dict[int, trio.Event] = {}
        """Per slot whose process runs: set once it has exited (the supervisor waits on it)."""
        self._reapers: trio.Nursery | None = None
        """Where a killed process that did not exit is waited for (`run`'s nursery)."""

    # -- start-up --

    def claim(self) -> None:
        """Find the processes an earlier daemon left (adopted if they serve what this one
        would, else retired once the new ones serve), and make sure the port is free or
        theirs. ``StartupError`` if another process holds it."""
        try:
            private_dir(self.state.ingress, "--state-dir")
        except (OSError, ValueError) as exc:
            raise StartupError(f"cannot use {self.state.ingress}: {exc}") from None
        host, port = split(self.options.listen)
        live = []
        for record in self._records():
            if record.slot < len(self.members):
                self.members[record.slot].restarts = record.restarts
            if record.alive(self.state):
                live.append(record)
                continue
            # Gone while no daemon watched it (killed, or the machine restarted).
            logger.warning(
                "ingress process %d (pid %d) exited while no daemon ran; %s",
                record.slot,
                record.pid,
                "starting another" if record.slot < len(self.members) else "not needed now",
            )
            if record.slot < len(self.members):
                member = self.members[record.slot]
                member.restarts += 1
                member.last_exit = "exited while no daemon ran"
            record.forget(self.state)
        for record in live:
            r_host, r_port = split(record.listen)
            same = r_host == host and (port in (0, r_port))
            if same and record.digest == self._digest and record.slot < self.options.workers:
                self._adopt[record.slot] = record
            else:
                self._retire.append(record)
        if self._adopt:
            self.address = next(iter(self._adopt.values())).listen
        else:
            ours = {r.listen for r in self._retire}
            self._holder, self.address = hold(host, port, self.options.listen, ours)
            if not self._retire:
                # Nothing serves the port yet: it accepts from now on, and the first processes
                # serve this socket's queue (`spawn`), so a client that connects as soon as
                # the daemon has started waits for them rather than being refused.
                self._holder.listen(LISTEN_BACKLOG)
                self._shared = self._holder.fileno()
        # Those on another port go; those on this one are replaced in place, each slot's new
        # process on its predecessor's socket (one a slot: a slot that is no more closes its
        # socket when its process stops, or the port's group of sockets would grow with every
        # change of the count, each taking its share of the connections).
        for record in self._retire:
            if record.listen == self.address and record.slot < len(self.members):
                self._heirs[record.slot] = record  # one record a slot

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Supervise the processes until cancelled (they keep running). Started once each
        serves (or `START_TIMEOUT_S` passed: late ones are logged and go on starting)."""
        async with trio.open_nursery() as nursery:
            self._reapers = nursery
            serving = [trio.Event() for _ in self.members]
            for member, event in zip(self.members, serving, strict=True):
                nursery.start_soon(self._supervise, member, event)
            with trio.move_on_after(START_TIMEOUT_S):
                for event in serving:
                    await event.wait()
            late = [m.slot for m in self.members if m.state != "serving"]
            if late and not self.stopping:
                logger.error(
                    "ingress: process(es) %s not serving after %gs; still trying (see %s)",
                    ", ".join(map(str, late)),
                    START_TIMEOUT_S,
                    self.state.ingress,
                )
            if self._shared is None:
                await self._share_theirs()
            # (The daemon's own listening socket, the processes' shared one, is kept while it
            # runs: a process started later serves it too, and while every process is being
            # replaced at once (all stopped, say) connections wait in its queue.)
            # Those of an earlier daemon that this one does not adopt go, now that the new
            # ones serve (on the same port, they overlap for a moment: no gap).
            retired, self._retire = self._retire, []
            await stop_records(retired, self.state)
            task_status.started()

    async def _share_theirs(self) -> None:
        """Hold a copy of the listening socket the processes serve (adopted, or taken over from
        an earlier daemon's) as the one later processes share: a process killed or stopping
        then leaves the connections queued on it to its siblings, where one on a socket of its
        own (``SO_REUSEPORT``) would have them reset."""
        if self._holder is not None:
            # Held only for the port's sake while the processes started: they hold it now.
            self._holder.close()
            self._holder = None
        serving = {handle.pid for handle in self._handles.values()}
        for record in self._records():
            if record.pid not in serving:
                continue
            fds = await take_listeners(self.state, record)
            for fd in fds[1:]:
                os.close(fd)
            if fds:
                self._holder = socket.socket(fileno=fds[0])
                self._shared = fds[0]
                return

    async def _supervise(self, member: Member, serving: trio.Event) -> None:
        try:
            await self._keep_serving(member, serving)
        finally:
            serving.set()  # or never will: the fleet's start waits for it no longer

    async def _keep_serving(self, member: Member, serving: trio.Event) -> None:
        record = self._adopt.pop(member.slot, None)
        failures, up_since = 0, 0.0
        if record is not None and not await self._answers(member.slot, record.pid):
            # Alive but not answering (still starting, or hung): not to be trusted with the
            # port. A new one is started, and this one stopped once the new ones serve.
            self._retire.append(record)
            record = None
        while not self.stopping:
            handle = Handle.adopt(record) if record is not None else None
            record = None
            if handle is not None:
                member.adopted = True
            else:
                member.adopted = False
                heir = self._heirs.pop(member.slot, None)
                handle = await self._launcher.spawn(member, self.address, heir, self._shared)
            if handle is not None:
                exited = self._exited[member.slot] = trio.Event()
                self._handles[member.slot] = handle
                member.pid, member.state, member.since = handle.pid, "serving", time.time()
                up_since = trio.current_time()
                serving.set()
                if member.restarts:
                    logger.info(
                        "ingress process %d serving again (pid %d)", member.slot, handle.pid
                    )
                if self._stopped():
                    handle.signal(signal.SIGTERM)  # started while the fleet began to stop
                watch = ProcessWatch(self.state, member, handle, self._stopped)
                try:
                    gone, status = await watch.until_exit()
                finally:
                    self._handles.pop(member.slot, None)
                    exited.set()
                if not gone:
                    # Killed, but not gone (frozen: it dies once thawed). Its slot is served
                    # again now; it is reaped, and its sockets forgotten, once it has gone.
                    logger.warning(
                        "ingress process %d (pid %d) has not exited %gs after its SIGKILL "
                        "(frozen?); starting another beside it",
                        member.slot,
                        handle.pid,
                        KILLED_EXIT_S,
                    )
                    assert self._reapers is not None
                    self._reapers.start_soon(self._reap, member.slot, handle)
                else:
                    # It has exited (not just this daemon stopped watching it): if killed, it
                    # could not remove its sockets itself.
                    forget_sockets(self.state, member.slot, handle.pid)
                if self._stopped():
                    return
                member.last_exit = watch.killed or describe_exit(status).removeprefix(
                    "worker process "
                )
            elif self._stopped():
                return  # told to stop as it started
            member.restarts += 1
            self._launcher.write_record(member, self.address)
            member.state, member.since = "restarting", time.time()
            if trio.current_time() - up_since > FORGIVE_AFTER_S:
                failures = 0
            failures += 1
            wait = BACKOFF_S[min(failures, len(BACKOFF_S)) - 1]
            logger.warning(
                "ingress process %d (pid %s) %s; starting another in %gs%s",
                member.slot,
                member.pid,
                member.last_exit,
                wait,
                tail(self.state.ingress_log(member.slot)),
            )
            await trio.sleep(wait)

    async def _reap(self, slot: int, handle: Handle) -> None:
        await handle.wait()
        forget_sockets(self.state, slot, handle.pid)
        logger.info("ingress process %d (pid %d), killed before, has exited", slot, handle.pid)

    def _stopped(self) -> bool:
        # A method, not the attribute: it changes across the awaits of one supervisor's loop.
        return self.stopping

    # -- stopping --

    async def stop(self) -> None:
        """Stop every process (a shutdown, or no ingress wanted): each drains first."""
        self.stopping = True
        if self._holder is not None:
            # No new connection is to wait for a process: the port closes with them.
            self._holder.close()
            self._holder, self._shared = None, None
        handles = dict(self._handles)
        for member in self.members:
            if member.slot in handles:
                member.state, member.since = "stopping", time.time()
        for handle in handles.values():
            handle.signal(signal.SIGTERM)
        for member in self.members:
            if member.state == "starting" and member.pid is not None:
                # Waiting for its first routes from an API that is closing: it would not serve.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member.pid, signal.SIGTERM)
        # Those this daemon does not supervise (an earlier daemon's, left unadopted).
        pids = {h.pid for h in handles.values()}
        records = [r for r in self._records() if r.alive(self.state) and r.pid not in pids]
        await stop_records(records, self.state)
        # Their supervisors see them exit (and start no other).
        with trio.move_on_after(DRAIN_S + STOP_MARGIN_S):
            for slot in handles:
                await self._exited[slot].wait()
        for slot, handle in handles.items():
            if not self._exited[slot].is_set():
                handle.signal(signal.SIGKILL)
        with trio.move_on_after(STOP_MARGIN_S):
            for slot in handles:
                await self._exited[slot].wait()
        for slot in range(max(len(self.members), max_slot(self.state) + 1)):
            with contextlib.suppress(FileNotFoundError):
                self.state.ingress_record(slot).unlink()

    def _records(self) -> list[Record]:
        found = []
        with contextlib.suppress(FileNotFoundError):
            for path in sorted(self.state.ingress.glob("*.json")):
                record = Record.read(path)
                if record is not None:
                    found.append(record)
        return found

    # -- what the API shows --

    async def status(self) -> dict[str, Any]:
        """Each process: slot, pid, state, since, restarts, last exit, and what it says of
        itself (whether it follows the daemon)."""
        health = await self._ask_all("/-/healthz")
        processes = []
        for member in self.members:
            said = health.get(member.slot)
            processes.append(
                {
                    "slot": member.slot,
                    "pid": member.pid,
                    "state": member.state,
                    "since": iso(member.since),
                    "restarts": member.restarts,
                    "last_exit": member.last_exit,
                    "adopted": member.adopted,
                    "answers": said is not None,
                    "following": bool(json.loads(said).get("connected")) if said else False,
                }
            )
        return {"listen": self.address, "workers": len(self.members), "processes": processes}

    async def metrics(self) -> bytes:
        """The processes' metrics summed (as if one ingress), and the fleet's own."""
        texts = await self._ask_all("/-/metrics")
        merged = merge_metrics(t.decode() for t in texts.values())
        states = [m.state for m in self.members]
        own = fleet_metrics(states, sum(m.restarts for m in self.members))
        return (merged + own).encode()

    async def _answers(self, slot: int, pid: int) -> bool:
        """Whether the process `pid` of `slot` answers on its own socket (it is up, not hung)."""
        return await ask(self.state, slot, pid, "/-/healthz") is not None

    async def _ask_all(self, target: str) -> dict[int, bytes]:
        """What each serving process answers to `target`, asked all at once."""
        answers: dict[int, bytes] = {}

        async def one(slot: int, pid: int) -> None:
            said = await ask(self.state, slot, pid, target)
            if said is not None:
                answers[slot] = said

        async with trio.open_nursery() as nursery:
            for member in self.members:
                if member.state == "serving" and member.pid is not None:
                    nursery.start_soon(one, member.slot, member.pid)
        return answers
