"""The benchmark: reaction latency, throughput, idle cost, recovery time and memory per replica.

Run with ``nox -s bench`` (or ``python bench/bench.py``); ``--quick`` runs CI-sized versions of
every section (fewer samples, 2 s idle windows, 10,000 replicas where the full run has 100,000):
a smoke test of the harness, not figures to quote. Prints a table and writes the figures to
``bench/results.json``, with how long each section took. Real clock throughout; the runtime is
``FakeRuntime`` (or a do-nothing runtime for memory), the store a SQLite file, so the figures
are the controller's own cost (the reaction a user feels, a crash to its replacement serving,
is measured with the store's durable write in it, SQLite FULL and the memory store side by
side: ``--only reaction`` runs it alone); but for sections 6 and 7, on real worker processes (7: a
worker's start, forked by the fork server against spawned; ``--only fork-server`` runs it alone
and updates only its figures).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import reaper
import trio
import trio.testing

import controller
from controller._backend.watch import TOMBSTONES_KEPT
from controller._core.gc import tune_gc
from controller.testing import FakeRuntime, FakeState

RC = controller.ReplicaConfig("bench.replica:Noop")
#: How many backends of no replica the memory section holds, for the cost of a backend.
SMALL_BACKENDS = 1000


def cfg(n: int, *, health_check_period_s: float = 0.0) -> controller.BackendConfig:
    # Health checks off unless asked: the "nothing changing" figures measure the controller at
    # rest, and a check every 10 s of each of 10,000 replicas is 1,000 calls a second of work.
    return controller.BackendConfig(
        num_replicas=n,
        version="v1",
        graceful_shutdown_timeout_s=1,
        health_check_period_s=health_check_period_s,
    )


def pct(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def wait_serving(ctl: controller.Controller, want: Mapping[str, int]) -> None:
    """Wait, on the watch, until every backend serves exactly the wanted number of replicas."""
    known = dict.fromkeys(want, 0)
    while True:
        for name, snap in (await ctl.listen_for_change(known)).items():
            known[name] = snap.snapshot_id
        if all(len(ctl.snapshot(n).replicas) == k for n, k in want.items()):
            return


# -- 1. reaction latency --------------------------------------------------------------------


async def trio_latency(replicas: int, samples: int, db: Path) -> dict[str, float]:
    # The replicas come up on their own (auto_ready): finishing 10,000 starts one by one, each
    # after a scan of the runtime's replicas, would cost minutes of set-up at 10,000. The
    # measured starts are then finished by hand.
    rt = FakeRuntime(auto_ready=True, record_history=False)
    ready: list[float] = []
    died: list[float] = []
    # Replace at once: this measures reaction, and 250 crashes in a row would otherwise (rightly)
    # back off to a minute between restarts.
    no_backoff = controller.RestartPolicy(initial_delay_s=0.0, jitter=0.0)
    with controller.SQLiteStore(db) as store:
        async with controller.open_controller(
            runtime=rt, store=store, restart_policy=no_backoff
        ) as ctl:
            await (await ctl.deploy("lat", cfg(replicas), RC)).wait()
            await wait_serving(ctl, {"lat": replicas})
            rt.auto_ready = False
            # Let the trailing work of the scale-up (its checkpoint writes) end first, so that
            # the first samples do not pay for it.
            await trio.sleep(0.2)
            for _ in range(samples):
                known = ctl.snapshot("lat").snapshot_id
                victim = random.choice(rt.tags(FakeState.READY))
                t0 = time.perf_counter()
                rt.crash(victim)
                snap = (await ctl.listen_for_change({"lat": known}))["lat"]
                died.append(time.perf_counter() - t0)
                assert victim not in {r.tag for r in snap.replicas}
                await rt.wait_until(lambda r: bool(r.tags(FakeState.STARTING)))
                (new,) = rt.tags(FakeState.STARTING)
                known = ctl.snapshot("lat").snapshot_id
                t0 = time.perf_counter()
                rt.finish_start(new)
                snap = (await ctl.listen_for_change({"lat": known}))["lat"]
                ready.append(time.perf_counter() - t0)
                assert new in {r.tag for r in snap.replicas}
    both = ready + died
    return {
        "p50_ms": pct(both, 0.5) * 1e3,
        "p99_ms": pct(both, 0.99) * 1e3,
        "ready_p50_ms": pct(ready, 0.5) * 1e3,
        "ready_p99_ms": pct(ready, 0.99) * 1e3,
        "died_p50_ms": pct(died, 0.5) * 1e3,
        "died_p99_ms": pct(died, 0.99) * 1e3,
        "samples": len(both),
    }


async def crash_to_serving(
    replicas: int, samples: int, db: Path | None
) -> dict[str, float | int | str]:
    """What a user feels of a crash: one replica of a backend of `replicas` dies, and the clock
    runs until the watch serves its replacement, whose intent (the new replica's tag, before its
    start) is then durable: the store's write is inside the figure. `db`: a SQLite file
    (``synchronous=FULL``, one fsync per commit); None: the ``MemoryStore``.

    The runtime is ``FakeRuntime(auto_ready=True)``: a start finishes at once, so the figure is
    the controller's and the store's own, not a replica's start. Between samples the backend is
    let go quiet (the replacement's own trailing write lands), so each sample is one crash on a
    quiet backend; ``commits`` is the store's transactions (or writes) per sample."""
    rt = FakeRuntime(auto_ready=True, record_history=False)
    no_backoff = controller.RestartPolicy(initial_delay_s=0.0, jitter=0.0)
    sqlite = None if db is None else controller.SQLiteStore(db, synchronous="FULL")
    memory = controller.MemoryStore()
    store: controller.SQLiteStore | controller.MemoryStore = sqlite or memory

    def commits() -> int:
        return memory.writes if sqlite is None else sqlite.transactions

    async def quiet() -> None:
        # Until no write has landed for 20 ms: the last sample's trailing writes are done.
        seen = -1
        while seen != commits():
            seen = commits()
            await trio.sleep(0.02)

    took: list[float] = []
    cpu: list[float] = []
    written = 0
    try:
        async with controller.open_controller(
            runtime=rt, store=store, restart_policy=no_backoff
        ) as ctl:
            await (await ctl.deploy("lat", cfg(replicas), RC)).wait()
            await wait_serving(ctl, {"lat": replicas})
            for _ in range(samples):
                await quiet()
                snap = ctl.snapshot("lat")
                victim = random.choice(snap.replicas).tag
                known, before = snap.snapshot_id, commits()
                c0, t0 = time.thread_time(), time.perf_counter()
                rt.crash(victim)
                while True:
                    snap = (await ctl.listen_for_change({"lat": known}))["lat"]
                    known = snap.snapshot_id
                    if len(snap.replicas) == replicas:
                        break
                took.append(time.perf_counter() - t0)
                cpu.append(time.thread_time() - c0)
                written += commits() - before
                assert victim not in {r.tag for r in snap.replicas}
    finally:
        if sqlite is not None:
            sqlite.close()
    return {
        "p50_ms": pct(took, 0.5) * 1e3,
        "p99_ms": pct(took, 0.99) * 1e3,
        # The trio thread's own CPU time (not the store's worker thread, not time lost to other
        # processes on a busy machine): what the controller spends per crash.
        "cpu_p50_ms": pct(cpu, 0.5) * 1e3,
        "commits_per_crash": written / len(took),
        "samples": len(took),
        "store": "memory" if db is None else "sqlite_full",
    }


async def reaction_table(sizes: Sequence[int], samples: int, d: Path) -> dict[str, Any]:
    """`crash_to_serving` at each size, SQLite FULL and the memory store, one fresh controller
    each. Run it with the collector as the daemon sets it (``tuned_gc``): with Python's
    defaults, a backend of 10,000 replicas pays a full collection every few dozen crashes,
    which is the p99 of an embedding that did not tune it, not the controller's reaction."""
    out: dict[str, Any] = {"sqlite_full": {}, "memory": {}}
    for n in sizes:
        for kind in ("sqlite_full", "memory"):
            print(f"  crash -> replacement serving, {n:,}, {kind} ...", file=sys.stderr)
            db = d / f"reaction{n}.db" if kind == "sqlite_full" else None
            out[kind][str(n)] = await crash_to_serving(n, samples, db)
    out["how"] = (
        "crash -> replacement serving (its intent durable); FakeRuntime(auto_ready=True), "
        "one backend, a quiet backend before each crash; the collector set as the daemon "
        "sets it (tune_gc)"
    )
    return out


def print_reaction_table(r: dict[str, Any]) -> None:
    for kind, label in (("sqlite_full", "FULL"), ("memory", "memory")):
        for n, f in sorted(r[kind].items(), key=lambda kv: int(kv[0])):
            print(
                f"{f'crash->serving {int(n):,} {label}':<30} "
                f"{f['p50_ms']:.2f} / {f['p99_ms']:.2f} ms{'':>3}"
                f"  p50 <= 2, p99 <= 5 ms; {f['commits_per_crash']:.1f} commits, "
                f"CPU p50 {f['cpu_p50_ms']:.2f} ms"
            )


class SeedPoller:
    """The seed's design (``BackendState.update`` in /work/shared/seeds/backend_state.py.txt),
    for comparison: an asyncio loop that every 0.1 s checks every backend's goal (is its count of
    replicas the wanted one?), then checks the futures of the replicas that are starting (here;
    stopping ones are alike) with ``asyncio.wait(timeout=0)``, and notifies long-poll waiters
    when any is done. Like the seed, it skips the wait when nothing is starting: at rest its
    tick is the goal check alone."""

    def __init__(self, backends: Mapping[str, int] | None = None) -> None:
        backends = backends or {}
        self.wanted = dict(backends)
        # The seed keeps a handle per running replica, by backend, and a goal per backend.
        self.running: dict[str, dict[str, str]] = {
            b: {f"{b}#{i}": f"{b}#{i}" for i in range(n)} for b, n in backends.items()
        }
        self.goals = {b: f"goal-{b}" for b in backends}
        self.completed: set[str] = set()
        self.starting: dict[asyncio.Future[None], str] = {}
        self.changed = asyncio.Event()

    def completed_goals(self) -> list[str]:
        # As the seed's `_completed_goals`: every backend, every tick.
        done = []
        for name in set(self.running).union(self.wanted):
            have = self.running.get(name)
            if have is not None and self.wanted.get(name) == len(have):
                done.append(self.goals[name])
        return done

    async def loop(self) -> None:
        while True:
            self.completed.update(self.completed_goals())
            if self.starting:
                done, _ = await asyncio.wait(list(self.starting), timeout=0)
                for fut in done:
                    tag = self.starting.pop(fut)
                    self.running.setdefault("new", {})[tag] = tag
                if done:
                    self.changed.set()
                    self.changed = asyncio.Event()
            await asyncio.sleep(0.1)


def seed_poller(replicas: int, *, at_rest: bool) -> SeedPoller:
    """`at_rest`: `replicas` running over 100 backends, nothing pending; else `replicas` start
    futures pending at once (the seed during a mass start). Call from the running loop."""
    if at_rest:
        return SeedPoller({f"b{i:03d}": replicas // 100 for i in range(100)})
    poller = SeedPoller()
    loop = asyncio.get_running_loop()
    for i in range(replicas):
        poller.starting[loop.create_future()] = f"r{i}"
    return poller


async def poller_latency(replicas: int, samples: int, *, at_rest: bool) -> dict[str, float]:
    """`at_rest`: `replicas` running over 100 backends and one start pending at a time (the seed
    replacing one replica); else `replicas` starts pending at once (the seed during a mass
    start)."""
    poller = seed_poller(replicas, at_rest=at_rest)
    task = asyncio.ensure_future(poller.loop())
    out: list[float] = []
    for _ in range(samples):
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        poller.starting[fut] = "again"
        await asyncio.sleep(random.uniform(0, 0.1))  # arrive at a random point of the period
        if not at_rest:
            fut = random.choice(list(poller.starting))
        changed = poller.changed
        t0 = time.perf_counter()
        fut.set_result(None)
        await changed.wait()
        out.append(time.perf_counter() - t0)
    task.cancel()
    return {"p50_ms": pct(out, 0.5) * 1e3, "p99_ms": pct(out, 0.99) * 1e3, "samples": len(out)}


# -- 2. throughput and 4. recovery --------------------------------------------------------------


async def deploy_all(
    ctl: controller.Controller, names: Sequence[str], replicas: int, health_s: float = 0.0
) -> None:
    """Deploy every backend concurrently (as many clients would), then wait for every goal."""
    goals: list[controller.Goal] = []
    config = cfg(replicas, health_check_period_s=health_s)

    async def deploy(name: str) -> None:
        goals.append(await ctl.deploy(name, config, RC))

    async with trio.open_nursery() as nursery:
        for name in names:
            nursery.start_soon(deploy, name)
    for goal in goals:
        await goal.wait()


async def throughput_and_recovery(
    backends: int, per_backend: int, db: Path, listings: int = 0, health_s: float = 0.0
) -> dict[str, float]:
    """Scale-up, recovery, then scale-down of `backends` x `per_backend`; with `listings`, also
    that many ``GET /api/v1/backends`` while the recovered controller holds every replica.
    Also the time Python's cycle collector took meanwhile (`gc_s`), under whatever thresholds
    the caller set. `health_s`: the replicas' health check period (0: no checks)."""
    with gc_timer() as gc_time:
        figures = await _throughput_and_recovery(backends, per_backend, db, listings, health_s)
    figures["gc_s"] = gc_time[0]
    figures["gc_thresholds"] = list(gc.get_threshold())  # type: ignore[assignment]
    return figures


@contextlib.contextmanager
def gc_timer() -> Iterator[list[float]]:
    """Seconds spent in the cycle collector within the block (in the list it yields)."""
    took = [0.0]
    started = [0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            took[0] += time.perf_counter() - started[0]

    gc.callbacks.append(timed)
    try:
        yield took
    finally:
        gc.callbacks.remove(timed)


def tuned_gc(fn: Any, *args: Any) -> Any:
    """`trio.run(fn, *args)` with the collector set as the daemon sets it (``tune_gc``)."""
    old = tune_gc()
    try:
        return trio.run(fn, *args)
    finally:
        gc.set_threshold(*old)


async def _throughput_and_recovery(
    backends: int, per_backend: int, db: Path, listings: int, health_s: float
) -> dict[str, float]:
    rt = FakeRuntime(auto_ready=True, record_history=False)
    names = [f"b{i:04d}" for i in range(backends)]
    replicas = backends * per_backend
    figures: dict[str, float] = {"health_check_period_s": health_s}
    with controller.SQLiteStore(db) as store:
        async with controller.open_controller(runtime=rt, store=store) as ctl:
            gc.collect()
            rss0 = rss_bytes()["now"]
            t0, c0 = time.perf_counter(), time.process_time()
            await deploy_all(ctl, names, per_backend, health_s)
            figures["up_s"] = time.perf_counter() - t0
            figures["up_cpu_us_per_replica"] = (time.process_time() - c0) / replicas * 1e6
            gc.collect()
            # The whole process's growth: the FakeRuntime's record of each replica, SQLite's
            # cache and the high-water of 1,000 deploys at once included (section 5b has the
            # controller's own).
            rss = rss_bytes()
            figures["up_rss_bytes_per_replica"] = (rss["now"] - rss0) / replicas
            assert sum(len(ctl.snapshot(n).replicas) for n in names) == backends * per_backend
            figures["up_sqlite_transactions"] = store.transactions
    # Recovery: a fresh controller, a fresh store object, the same file and runtime.
    with controller.SQLiteStore(db) as store:
        t0 = time.perf_counter()
        async with controller.open_controller(runtime=rt, store=store) as ctl:
            await wait_serving(ctl, dict.fromkeys(names, per_backend))
            figures["recovery_s"] = time.perf_counter() - t0
            recovered_at = trio.current_time()
            assert len(rt.replicas) == backends * per_backend  # none restarted
            if listings:
                # After the recovery's trailing work (its checkpoint writes), so the listing is
                # timed at rest.
                await trio.sleep(0.5)
                for key, value in (await api_listing(ctl, listings)).items():
                    figures[f"listing_{key}"] = value
                # The same backends without each one's replicas and events (view=summary):
                # what a listing of many backends is for.
                summary = await api_listing(ctl, listings, b"view=summary")
                for key, value in summary.items():
                    figures[f"listing_summary_{key}"] = value
            if health_s > 0:
                # The adopted replicas' first checks fall due one period after the recovery, all
                # at once: the scale-down starts as they do, so that it meets a wave of checks
                # of every replica (the worst case), not a quiet gap between two.
                await trio.sleep_until(recovered_at + health_s)
            t0, c0 = time.perf_counter(), time.process_time()
            await deploy_all(ctl, names, 0, health_s)
            figures["down_s"] = time.perf_counter() - t0
            # The CPU a replica's stop costs the process: its drain and kill tasks, the runtime's
            # part (FakeRuntime's), the loop's passes and the checkpoints, and any health
            # checks that fall due meanwhile.
            figures["down_cpu_us_per_replica"] = (time.process_time() - c0) / replicas * 1e6
            assert rt.tags() == []
    figures["replicas"] = replicas
    figures["backends"] = backends
    return figures


# -- 2b. the status listing over the API ------------------------------------------------------


async def api_listing(
    ctl: controller.Controller, requests: int, query: bytes = b""
) -> dict[str, float]:
    """``GET /api/v1/backends`` through the daemon's ASGI app (``controller._api.app.Api``) in this
    process, as hypercorn would call it (as tests/asgi.py does): routing, the token check,
    building every backend's status and encoding the JSON body. No socket, no HTTP parsing: a
    real server adds those, about the same for any body of this size."""
    from controller._api.app import Api

    token = "bench-token"
    app = Api(ctl, token=token, render_metrics=lambda: b"", request_shutdown=lambda: None)
    scope: dict[str, Any] = {
        "type": "http",
        "method": "GET",
        "path": "/api/v1/backends",
        "raw_path": b"/api/v1/backends",
        "query_string": query,
        "headers": [(b"authorization", b"Bearer " + token.encode())],
    }
    times: list[float] = []
    size = 0
    for _ in range(requests):
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any], sent: list[dict[str, Any]] = sent) -> None:
            sent.append(message)

        t0 = time.perf_counter()
        await app(scope, receive, send)  # type: ignore[arg-type]
        times.append(time.perf_counter() - t0)
        assert sent[0]["status"] == 200, sent
        size = sum(len(m.get("body", b"")) for m in sent[1:])
    return {
        "p50_ms": statistics.median(times) * 1e3,
        "p90_ms": pct(times, 0.9) * 1e3,
        "body_bytes": size,
        "requests": requests,
    }


async def api_listing_small(backends: int, requests: int) -> dict[str, float]:
    """The listing of `backends` backends of one replica each (the per-backend cost without
    the replicas' entries), memory store."""
    rt = FakeRuntime(auto_ready=True, record_history=False)
    async with controller.open_controller(runtime=rt, store=controller.MemoryStore()) as ctl:
        await deploy_all(ctl, [f"b{i:04d}" for i in range(backends)], 1)
        await trio.sleep(0.2)
        figures = await api_listing(ctl, requests)
    figures["backends"] = backends
    figures["per_backend_us"] = figures["p50_ms"] * 1e3 / backends
    return figures


# -- 3. idle cost ------------------------------------------------------------------------------


async def trio_idle(
    replicas: int, seconds: float, db: Path, health_s: float = 0.0, backends: int = 100
) -> float:
    rt = FakeRuntime(auto_ready=True, record_history=False)
    with controller.SQLiteStore(db) as store:
        async with controller.open_controller(runtime=rt, store=store) as ctl:
            per = replicas // backends
            config = cfg(per, health_check_period_s=health_s)
            goals = [await ctl.deploy(f"b{i:03d}", config, RC) for i in range(backends)]
            for goal in goals:
                await goal.wait()
            gc.collect()
            if health_s > 0:
                # Replicas that started together are checked together, one wave a period
                # (checks are not spread). The window is one whole period starting half a
                # period after the scale-up, so it holds exactly one wave, whole, whatever the
                # window's length would otherwise catch.
                seconds = health_s
                await trio.sleep(health_s / 2)
            c0, t0 = time.process_time(), time.perf_counter()
            await trio.sleep(seconds)
            return (time.process_time() - c0) / (time.perf_counter() - t0) * 100


async def poller_idle(replicas: int, seconds: float, *, at_rest: bool) -> float:
    """`at_rest`: the seed holding `replicas` running over 100 backends, nothing starting or
    stopping (its tick: the goal check of 100 backends, no wait). Else the seed during a mass
    start: `replicas` start futures pending, every one waited on each tick."""
    poller = seed_poller(replicas, at_rest=at_rest)
    task = asyncio.ensure_future(poller.loop())
    await asyncio.sleep(0.2)
    c0, t0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    cpu = (time.process_time() - c0) / (time.perf_counter() - t0) * 100
    task.cancel()
    return cpu


# -- 5. memory -----------------------------------------------------------------------------------


class NullRuntime:
    """A runtime that keeps nothing, so that traced memory is the controller's alone."""

    async def serve(
        self,
        on_death: controller.DeathListener,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        task_status.started()
        await trio.sleep_forever()

    async def capacity(self) -> None:
        return None

    async def list_replicas(self) -> list[str]:
        return []

    async def start_replica(self, spec: controller.ReplicaSpec) -> str | None:
        await trio.lowlevel.checkpoint()
        return None

    async def adopt_replica(self, tag: str) -> str | None:
        raise controller.ReplicaGoneError(tag)

    async def reconfigure_replica(self, tag: str, user_config: controller.JSON) -> None:
        await trio.lowlevel.checkpoint()

    async def check_health_replica(self, tag: str) -> None:
        await trio.lowlevel.checkpoint()

    async def drain_replica(self, tag: str) -> None:
        await trio.lowlevel.checkpoint()

    async def kill_replica(self, tag: str) -> None:
        await trio.lowlevel.checkpoint()

    def fence(self, epoch: int) -> None:
        pass


async def memory_per_replica(replicas: int, backends: int = 100) -> float:
    """The Python objects the controller holds per replica (tracemalloc), `replicas` over
    `backends`; with no replicas, per backend instead."""
    store = controller.MemoryStore()
    async with controller.open_controller(runtime=NullRuntime(), store=store) as ctl:
        per = replicas // backends
        await (await ctl.deploy("warm", cfg(1), RC)).wait()
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        # With health checks on: each replica then also holds its place in the backend's
        # schedule of checks. The period is an hour, not the default 10 s, for the same entry
        # per replica with no check running while measured: at 100,000 replicas, checks every
        # 10 s under tracemalloc keep the controller busy without end, and the wait for every
        # task to block below would never return.
        config = cfg(per, health_check_period_s=3600.0)
        goals = [await ctl.deploy(f"b{i:04d}", config, RC) for i in range(backends)]
        for goal in goals:
            await goal.wait()
        await trio.testing.wait_all_tasks_blocked()
        # The store's copy of the checkpoint is the store's, not the controller's memory.
        store_bytes = sum(len(v) + len(k) + 100 for k, v in store.data.items())
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
        return (grown - store_bytes) / (replicas or backends)


def rss_bytes() -> dict[str, int]:
    """The process's resident set now and its high-water mark (VmRSS and VmHWM)."""
    fields = {"VmRSS": "now", "VmHWM": "peak"}
    out: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in fields:
            out[fields[key]] = int(value.split()[0]) * 1024  # in kB
    return out


async def rss_probe(replicas: int, backends: int) -> dict[str, float]:
    """Memory as the OS counts it: the process's RSS before and after deploying `replicas` over
    `backends` (per replica; with no replicas, per backend), set up as `memory_per_replica`
    (the do-nothing runtime, the memory store, whose copy is taken off) but untraced, since
    tracemalloc's own records would be counted. Run in a fresh process (`memory_rss`): one
    whose heap had grown before would take the new objects into room it already holds."""
    store = controller.MemoryStore()
    async with controller.open_controller(runtime=NullRuntime(), store=store) as ctl:
        await (await ctl.deploy("warm", cfg(1), RC)).wait()
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        before = rss_bytes()
        t0 = time.perf_counter()
        config = cfg(replicas // backends, health_check_period_s=3600.0)
        goals = [await ctl.deploy(f"b{i:04d}", config, RC) for i in range(backends)]
        for goal in goals:
            await goal.wait()
        await trio.testing.wait_all_tasks_blocked()
        took = time.perf_counter() - t0
        gc.collect()
        after = rss_bytes()
        store_bytes = sum(len(v) + len(k) + 100 for k, v in store.data.items())
    n = replicas or backends
    return {
        "replicas": replicas,
        "backends": backends,
        "rss_bytes_per": (after["now"] - before["now"] - store_bytes) / n,
        # The most it held on the way (the high-water of the process, from this start).
        "peak_bytes_per": (after["peak"] - before["now"] - store_bytes) / n,
        "store_bytes_per": store_bytes / n,
        "rss_before_mib": before["now"] / 2**20,
        "took_s": took,
    }


def memory_rss(replicas: int, backends: int) -> dict[str, float]:
    """`rss_probe` in a fresh Python process."""
    out = subprocess.run(
        [sys.executable, __file__, "--rss-probe", str(replicas), str(backends)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    figures: dict[str, float] = json.loads(out)
    return figures


async def name_churn(names: int, batch: int = 100) -> dict[str, float]:
    """Create and delete `names` backend names (one replica each, `batch` at a time): the memory
    the controller holds must not grow with them (no lock, tombstone or series per name kept
    beyond a bound). Measured over the last `window` names: the traced memory at the end less
    that `window` names before, tracing from another `window` before that. A window is
    TOMBSTONES_KEPT names, so both points hold a full set of traced tombstones (each new one
    replaces one traced); tracing only the last two windows spares the rest its 3x slowdown."""
    store = controller.MemoryStore()
    async with controller.open_controller(runtime=NullRuntime(), store=store) as ctl:

        async def one(name: str) -> None:
            await (await ctl.deploy(name, cfg(1), RC)).wait()
            await (await ctl.delete(name)).wait()

        async def churn(first: int, last: int) -> None:
            for start in range(first, last, batch):
                async with trio.open_nursery() as nursery:
                    for i in range(start, min(start + batch, last)):
                        nursery.start_soon(one, f"n{i}")

        window = TOMBSTONES_KEPT
        assert names >= 2 * window, "too few names to measure"
        t0 = time.perf_counter()
        await churn(0, names - 2 * window)
        took_untraced = time.perf_counter() - t0
        tracemalloc.start()
        await churn(names - 2 * window, names - window)
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        await churn(names - window, names)
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        return {
            "names": names,
            "window": window,
            "grown_bytes": grown,
            "seconds": time.perf_counter() - t0,
            "untraced_ms_per_name": took_untraced / (names - 2 * window) * 1e3,
            "left": len(store.data),
        }


# -- 6. local processes --------------------------------------------------------------------------


async def local_processes(trials: int) -> dict[str, float]:
    """8 replicas of a trivial class: through the controller, against the same 8 worker processes
    started directly through LocalRuntime (no controller); then stopping 8 that drain at once."""
    here = Path(__file__).parent
    entry = controller.ReplicaConfig("noop_replica:Noop")
    direct: list[float] = []
    via_controller: list[float] = []
    stop: list[float] = []

    # Spawned workers, as this section has always measured: a fork server booting beside the
    # 8 starts would only add noise (section 7 measures the fork server).
    async def run_direct(d: Path) -> None:
        rt = controller.LocalRuntime(d / "d", pythonpath=[here], fork_server=False)
        async with trio.open_nursery() as nursery:
            await nursery.start(rt.serve, lambda tag, reason: None)
            specs = [
                controller.ReplicaSpec(f"direct#{i}", "direct", "v1", entry, None, {})
                for i in range(8)
            ]
            t0 = time.perf_counter()
            async with trio.open_nursery() as starts:
                for spec in specs:
                    starts.start_soon(rt.start_replica, spec)
            direct.append(time.perf_counter() - t0)
            async with trio.open_nursery() as kills:
                for spec in specs:
                    kills.start_soon(rt.kill_replica, spec.tag)
            nursery.cancel_scope.cancel()

    async def run_controller(d: Path) -> None:
        rt = controller.LocalRuntime(d / "c", pythonpath=[here], fork_server=False)
        with controller.SQLiteStore(d / "c.db") as store:
            async with controller.open_controller(runtime=rt, store=store) as ctl:
                t0 = time.perf_counter()
                await (await ctl.deploy("noop", cfg(8), entry)).wait()
                via_controller.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await (await ctl.delete("noop")).wait()
                stop.append(time.perf_counter() - t0)

    for trial in range(trials):
        with tempfile.TemporaryDirectory(prefix="bench", dir="/tmp") as tmp:
            # Alternate which goes first, so neither always meets a warmer page cache.
            order = [run_direct, run_controller] if trial % 2 else [run_controller, run_direct]
            for fn in order:
                await fn(Path(tmp))
    return {
        "direct_s": statistics.median(direct),
        "controller_s": statistics.median(via_controller),
        "ratio": statistics.median(via_controller) / statistics.median(direct),
        "stop_8_s": statistics.median(stop),
        "trials": trials,
    }


# -- 7. fork server vs spawn ---------------------------------------------------------------------


async def fork_vs_spawn(starts: int) -> dict[str, Any]:
    """One replica's start to ready (what the controller then marks RUNNING), directly through
    LocalRuntime.start_replica (no controller): its worker spawned as a fresh Python, against
    forked by the fork server. The no-op replica, one start at a time, each worker killed after
    its start (untimed), spawn and fork alternating, after one untimed start of each."""
    here = Path(__file__).parent
    entry = controller.ReplicaConfig("noop_replica:Noop")
    times: dict[str, list[float]] = {"spawn": [], "fork": []}
    with tempfile.TemporaryDirectory(prefix="bench", dir="/tmp") as tmp:
        runtimes = {
            "spawn": controller.LocalRuntime(Path(tmp) / "s", pythonpath=[here], fork_server=False),
            "fork": controller.LocalRuntime(Path(tmp) / "f", pythonpath=[here]),
        }
        async with trio.open_nursery() as nursery:
            t0 = time.perf_counter()
            await nursery.start(runtimes["fork"].serve, lambda tag, reason: None)
            assert await runtimes["fork"].wait_fork_server_ready()
            ready_s = time.perf_counter() - t0
            await nursery.start(runtimes["spawn"].serve, lambda tag, reason: None)
            for i in range(-1, starts):
                for how, rt in runtimes.items():
                    spec = controller.ReplicaSpec(f"{how}#{i}", how, "v1", entry, None, {})
                    t0 = time.perf_counter()
                    await rt.start_replica(spec)
                    took = time.perf_counter() - t0
                    if i >= 0:
                        times[how].append(took)
                    await rt.kill_replica(spec.tag)
            nursery.cancel_scope.cancel()
    figures: dict[str, Any] = {}
    for how, samples in times.items():
        figures[f"{how}_p50_ms"] = statistics.median(samples) * 1e3
        figures[f"{how}_p90_ms"] = pct(samples, 0.9) * 1e3
    figures["ratio_p50"] = figures["fork_p50_ms"] / figures["spawn_p50_ms"]
    figures["fork_server_ready_ms"] = ready_s * 1e3
    figures["starts"] = starts
    figures["how"] = "LocalRuntime.start_replica directly, no controller; noop replica"
    return figures


def print_fork_table(f: dict[str, Any]) -> None:
    rows = [
        ("start, spawned p50 / p90", f"{f['spawn_p50_ms']:.1f} / {f['spawn_p90_ms']:.1f} ms", ""),
        ("start, forked p50 / p90", f"{f['fork_p50_ms']:.1f} / {f['fork_p90_ms']:.1f} ms", ""),
        ("forked / spawned (p50)", f"{f['ratio_p50']:.2f}", "<= 0.2"),
        ("fork server ready after", f"{f['fork_server_ready_ms']:.0f} ms", ""),
    ]
    for name, figure, target in rows:
        print(f"{name:<30} {figure:>22}  {target}")


def git_head() -> str:
    """The checked-out commit, with "+dirty" if controller/ differs from it ("" outside git)."""
    here = Path(__file__).parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--", "../controller"], cwd=here
        ).returncode
    except OSError:
        return ""
    return head + ("+dirty" if head and dirty else "")


class Steps:
    """Announces each section on stderr and keeps how long each took, so that the run's
    length can be kept in check (``nox -s bench`` should stay within about 15 minutes)."""

    def __init__(self) -> None:
        self.began = self.at = time.perf_counter()
        self.name = ""
        self.took: dict[str, float] = {}

    def step(self, name: str) -> None:
        self._close()
        self.name = name
        print(f"{name} ...", file=sys.stderr)

    def _close(self) -> None:
        now = time.perf_counter()
        if self.name:
            self.took[self.name] = now - self.at
            print(f"  ({now - self.at:.0f} s)", file=sys.stderr)
        self.at = now

    def total(self) -> float:
        self._close()
        self.name = ""
        return time.perf_counter() - self.began


# -- main ----------------------------------------------------------------------------------------


def keep_section(out: Path, key: str, figures: dict[str, Any]) -> None:
    """Put one section's `figures` in the results file `out` under `key`, keeping the rest (a
    section run alone updates only its own figures)."""
    kept = json.loads(out.read_text()) if out.exists() else {}
    kept[key] = figures
    out.write_text(json.dumps(kept, indent=2) + "\n")


def only_section(name: str, out: Path, quick: bool) -> None:
    """``--only scale``: the 100,000 replicas' scale-up, recovery and scale-down, with health
    checks off (no listing) and on; ``--only memory``: the memory section, traced and RSS.
    Printed as JSON, and updated in `out` under their own keys (``only_scale``,
    ``only_memory``), apart from a whole run's."""
    backends, per = (1000, 10) if quick else (1000, 100)
    figures: dict[str, Any] = {"load_before": os.getloadavg(), "commit": git_head()}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        if name == "scale":
            for key, health_s in (("checks_off", 0.0), ("checks_10s", 10.0)):
                print(f"{backends * per:,} replicas, {key} ...", file=sys.stderr)
                figures[key] = tuned_gc(
                    throughput_and_recovery, backends, per, d / f"{key}.db", 0, health_s
                )
        else:
            figures["traced_10000"] = trio.run(memory_per_replica, 10000)
            figures["traced_big"] = trio.run(memory_per_replica, backends * per, backends)
            figures["traced_backend"] = trio.run(memory_per_replica, 0, SMALL_BACKENDS)
            figures["rss_10000"] = memory_rss(10000, 100)
            figures["rss_big"] = memory_rss(backends * per, backends)
            figures["rss_backend"] = memory_rss(0, SMALL_BACKENDS)
    figures["load_after"] = os.getloadavg()
    figures["date"] = time.strftime("%Y-%m-%d %H:%M")
    keep_section(out, f"only_{name}", figures)
    print(json.dumps(figures, indent=1))


def main() -> None:
    reaper.leave_nothing()
    parser = argparse.ArgumentParser(description="controller benchmark")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="CI-sized: fewer samples, 2 s idle windows, 10,000 replicas instead of 100,000",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    parser.add_argument(
        "--only",
        choices=["fork-server", "scale", "memory", "reaction"],
        help="run one section, and update its figures only in the results file",
    )
    parser.add_argument(
        "--rss-probe",
        nargs=2,
        type=int,
        metavar=("REPLICAS", "BACKENDS"),
        help="print, as JSON, the RSS a fresh process grows by per replica (per backend if "
        "REPLICAS is 0) for REPLICAS over BACKENDS (the memory section runs this)",
    )
    parser.add_argument(
        "--samples",
        type=int,
        help="crashes per size and store of the crash -> serving section (default 250, --quick 50)",
    )
    parser.add_argument(
        "--churn-names",
        type=int,
        help="backend names created and deleted by the name churn (default 100,000, --quick "
        "24,000; the growth is measured over the last 10,000 either way)",
    )
    args = parser.parse_args()
    if args.rss_probe:
        print(json.dumps(trio.run(rss_probe, *args.rss_probe)))
        return
    # The latency runs crash replicas on purpose; their warnings are not news here.
    logging.getLogger("controller").setLevel(logging.ERROR)
    if args.only == "fork-server":
        print("fork server vs spawn: 20 starts each ...", file=sys.stderr)
        figures = trio.run(fork_vs_spawn, 20)
        figures["command"] = "python bench/bench.py --only fork-server"
        figures["date"] = time.strftime("%Y-%m-%d")
        keep_section(args.out, "fork_server", figures)
        print(f"{'measure':<30} {'figure':>22}  target")
        print_fork_table(figures)
        return
    if args.only in ("scale", "memory"):
        only_section(args.only, args.out, args.quick)
        return
    if args.only == "reaction":
        samples = args.samples or (50 if args.quick else 250)
        print(f"crash -> replacement serving: {samples} crashes each ...", file=sys.stderr)
        load_before = os.getloadavg()
        with tempfile.TemporaryDirectory() as tmp:
            figures = tuned_gc(reaction_table, (100, 1000, 10000), samples, Path(tmp))
        figures["command"] = "python bench/bench.py --only reaction"
        figures["date"] = time.strftime("%Y-%m-%d")
        figures["commit"] = git_head()
        figures["loadavg_before"] = load_before
        figures["loadavg_after"] = os.getloadavg()
        keep_section(args.out, "reaction", figures)
        print(f"{'measure':<30} {'figure':>22}  target")
        print_reaction_table(figures)
        return
    quick = args.quick
    steps = Steps()
    load_before = os.getloadavg()
    # --quick: CI-sized: fewer samples, shorter idle windows, 10,000 replicas where the full
    # run has 100,000. Its figures are a smoke test of the harness, not ones to quote.
    idle_s = 2.0 if quick else 3.0
    rounds = 50 if quick else 250  # reaction rounds: two samples each
    big_backends, big_per = (1000, 10) if quick else (1000, 100)
    random.seed(1)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        steps.step("reaction latency, one backend of 1,000")
        results["latency_trio"] = trio.run(trio_latency, 1000, rounds, d / "lat.db")
        by_size = {"1000": results["latency_trio"]}
        for n in (100, 10000):
            steps.step(f"reaction latency, one backend of {n:,}")
            by_size[str(n)] = trio.run(trio_latency, n, rounds, d / f"lat{n}.db")
        results["latency_by_size"] = by_size
        steps.step("crash -> replacement serving, durable: 100 / 1,000 / 10,000")
        crashes = args.samples or rounds
        results["reaction"] = tuned_gc(reaction_table, (100, 1000, 10000), crashes, d)
        steps.step("seed-style poller latency")
        samples = 30 if quick else 50
        results["latency_poller"] = asyncio.run(poller_latency(1000, samples, at_rest=False))
        results["latency_poller_at_rest"] = asyncio.run(poller_latency(1000, samples, at_rest=True))
        steps.step("throughput and recovery, 10,000 replicas over 100 backends")
        results["throughput"] = trio.run(throughput_and_recovery, 100, 100, d / "tp.db")
        n_big = big_backends * big_per
        steps.step(f"throughput, recovery, listing: {n_big:,} over {big_backends:,} backends")
        # As the daemon runs it (``controller run`` calls ``tune_gc``), then with Python's
        # default collector settings, as an application embedding a controller has them.
        results["throughput_big"] = tuned_gc(
            throughput_and_recovery, big_backends, big_per, d / "big.db", 10 if quick else 20
        )
        steps.step(f"the same, {n_big:,} replicas, the collector at Python's defaults")
        results["throughput_big_default_gc"] = trio.run(
            throughput_and_recovery, big_backends, big_per, d / "big_gc.db"
        )
        steps.step(f"the same, {n_big:,} replicas, health checks every 10 s (no listing)")
        # The 10 s default period: each replica checked from 10 s after it is running.
        results["throughput_big_checks"] = tuned_gc(
            throughput_and_recovery, big_backends, big_per, d / "big_hc.db", 0, 10.0
        )
        steps.step("listing 1,000 backends of 1 replica")
        results["api_listing_1000x1"] = trio.run(api_listing_small, 1000, 10 if quick else 50)
        steps.step(f"idle cost ({idle_s:g} s windows; one 10 s period with checks)")
        idle: dict[str, float] = {
            "trio_1000": trio.run(trio_idle, 1000, idle_s, d / "i1.db"),
            "trio_10000": trio.run(trio_idle, 10000, idle_s, d / "i2.db"),
            "trio_1000_checks_10s": trio.run(trio_idle, 1000, idle_s, d / "i3.db", 10.0),
            "trio_10000_checks_10s": trio.run(trio_idle, 10000, idle_s, d / "i4.db", 10.0),
        }
        if not quick:
            idle["trio_10000_one_backend_checks_10s"] = trio.run(
                trio_idle, 10000, idle_s, d / "i5.db", 10.0, 1
            )
        for n in (1000, 10000):
            idle[f"poller_at_rest_{n}"] = asyncio.run(poller_idle(n, idle_s, at_rest=True))
            idle[f"poller_mass_start_{n}"] = asyncio.run(poller_idle(n, idle_s, at_rest=False))
        results["idle_cpu_percent"] = idle
        steps.step("memory per replica, 10,000 over 100 backends")
        results["memory_bytes_per_replica"] = trio.run(memory_per_replica, 10000)
        steps.step(f"memory per replica, {n_big:,} over {big_backends:,} backends")
        results["memory_big"] = {
            "replicas": n_big,
            "backends": big_backends,
            "bytes_per_replica": trio.run(memory_per_replica, n_big, big_backends),
        }
        steps.step(f"memory per backend, {SMALL_BACKENDS:,} backends of no replica")
        results["memory_bytes_per_backend"] = trio.run(memory_per_replica, 0, SMALL_BACKENDS)
        # The same three, as the OS counts them: each in a fresh process.
        steps.step("RSS: 10,000 over 100 backends, then the others (fresh processes)")
        results["memory_rss"] = {
            "replicas_10000": memory_rss(10000, 100),
            "replicas_big": memory_rss(n_big, big_backends),
            "backends": memory_rss(0, SMALL_BACKENDS),
        }
        steps.step("name churn: backends created and deleted")
        # Measured over the last 10,000 names (TOMBSTONES_KEPT), traced from 10,000 before.
        churn = args.churn_names or (24_000 if quick else 100_000)
        results["name_churn"] = trio.run(name_churn, churn)
        steps.step("local processes: 8 replicas")
        results["local"] = trio.run(local_processes, 3 if quick else 7)
        starts = 5 if quick else 20
        steps.step(f"fork server vs spawn: {starts} starts each")
        results["fork_server"] = trio.run(fork_vs_spawn, starts)
    results["machine"] = {
        "python": platform.python_version(),
        "trio": trio.__version__,
        "cpus": os.cpu_count(),
        "command": "nox -s bench" + (" -- --quick" if args.quick else ""),
        "date": time.strftime("%Y-%m-%d"),
        "took_s": steps.total(),
        "section_s": steps.took,
        # The core changes under this harness: say which code was measured.
        "commit": git_head(),
        # Others may share the machine: the load before and after says how much.
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)


def print_table(r: dict[str, Any]) -> None:
    lt, lp, lr, tp, big, idle = (
        r["latency_trio"],
        r["latency_poller"],
        r["latency_poller_at_rest"],
        r["throughput"],
        r["throughput_big"],
        r["idle_cpu_percent"],
    )
    gd = r["throughput_big_default_gc"]
    hc = r["throughput_big_checks"]
    ratio = lp["p50_ms"] / lt["p50_ms"]
    rss = r["memory_rss"]
    n_big = f"{big['replicas']:,}"
    rows = [
        ("reaction p50 (trio)", f"{lt['p50_ms']:.3f} ms", ""),
        ("reaction p99 (trio)", f"{lt['p99_ms']:.3f} ms", "<= 1 ms"),
        ("  ready p50 / p99", f"{lt['ready_p50_ms']:.3f} / {lt['ready_p99_ms']:.3f} ms", ""),
        ("  died  p50 / p99", f"{lt['died_p50_ms']:.3f} / {lt['died_p99_ms']:.3f} ms", ""),
    ]
    for n, lat in sorted(r["latency_by_size"].items(), key=lambda kv: int(kv[0])):
        rows.append(
            (
                f"reaction, 1 backend of {int(n):,}",
                f"{lat['p50_ms']:.3f} / {lat['p99_ms']:.3f} ms",
                "p99 <= 1 ms, flat",
            )
        )
    rows += [
        ("poller, 1,000 starts pending", f"{lp['p50_ms']:.1f} / {lp['p99_ms']:.1f} ms", ""),
        ("poller, at rest, 1 pending", f"{lr['p50_ms']:.1f} / {lr['p99_ms']:.1f} ms", ""),
        ("poller p50 / trio p50", f"{ratio:.0f}x", ">= 50x"),
        ("0 -> 10,000 replicas", f"{tp['up_s']:.3f} s", "<= 1.0 s"),
        ("10,000 -> 0 replicas", f"{tp['down_s']:.3f} s", "<= 1.0 s"),
        ("recovery, 10,000 live", f"{tp['recovery_s']:.3f} s", "<= 1.0 s"),
        (f"0 -> {n_big} (1,000 backends)", f"{big['up_s']:.3f} s", "<= 5 s"),
        (f"{n_big} -> 0", f"{big['down_s']:.3f} s", "<= 5 s"),
        (f"recovery, {n_big} live", f"{big['recovery_s']:.3f} s", "<= 5 s"),
        ("  of which the collector", f"{big['gc_s']:.3f} s", ""),
        (
            f"  {n_big} -> 0: CPU a replica",
            f"{big['down_cpu_us_per_replica']:.0f} us",
            "",
        ),
        (
            "  the same, checks every 10 s",
            " / ".join(f"{hc[k]:.1f}" for k in ("up_s", "down_s", "recovery_s")) + " s",
            "up / down / rec, <= 5 s",
        ),
        (
            f"    its {n_big} -> 0: CPU a replica",
            f"{hc['down_cpu_us_per_replica']:.0f} us",
            "",
        ),
        (
            "  the same, default collector",
            " / ".join(f"{gd[k]:.1f}" for k in ("up_s", "down_s", "recovery_s", "gc_s")) + " s",
            "up / down / rec / gc",
        ),
        (
            f"GET backends, 1,000 ({n_big})",
            f"{big['listing_p50_ms']:.1f} / {big['listing_p90_ms']:.1f} ms",
            "p50 <= 50 ms",
        ),
        (
            f"GET backends?view=summary, 1,000 ({n_big})",
            f"{big['listing_summary_p50_ms']:.1f} / {big['listing_summary_p90_ms']:.1f} ms",
            "p50 <= 50 ms",
        ),
        (
            "GET backends, 1,000 x 1",
            f"{r['api_listing_1000x1']['p50_ms']:.1f} ms",
            "",
        ),
        ("idle CPU, 1,000 (trio)", f"{idle['trio_1000']:.3f} %", "<= 1 %"),
        ("idle CPU, 10,000 (trio)", f"{idle['trio_10000']:.3f} %", "<= 1 %"),
        ("idle, 1,000, checks 10 s", f"{idle['trio_1000_checks_10s']:.3f} %", ""),
        ("idle, 10,000, checks 10 s", f"{idle['trio_10000_checks_10s']:.3f} %", "<= 2 %"),
    ]
    if "trio_10000_one_backend_checks_10s" in idle:
        rows.append(
            (
                "  the same, one backend",
                f"{idle['trio_10000_one_backend_checks_10s']:.3f} %",
                "",
            )
        )
    for n in (1000, 10000):
        rows.append((f"idle, seed at rest, {n:,}", f"{idle[f'poller_at_rest_{n}']:.3f} %", ""))
        rows.append(
            (f"idle, seed mass start, {n:,}", f"{idle[f'poller_mass_start_{n}']:.3f} %", "")
        )
    rows += [
        ("memory per replica, 10,000", f"{r['memory_bytes_per_replica']:.0f} B", "<= 2048 B"),
        (
            f"memory per replica, {r['memory_big']['replicas']:,}",
            f"{r['memory_big']['bytes_per_replica']:.0f} B",
            "<= 1024 B",
        ),
        (
            f"memory per backend ({SMALL_BACKENDS:,} of 0)",
            f"{r['memory_bytes_per_backend']:.0f} B",
            "",
        ),
        (
            "RSS per replica, 10,000",
            f"{rss['replicas_10000']['rss_bytes_per']:.0f} B",
            "",
        ),
        (
            f"RSS per replica, {r['memory_big']['replicas']:,}",
            f"{rss['replicas_big']['rss_bytes_per']:.0f} B",
            "<= 2048 B",
        ),
        (
            f"RSS per backend ({SMALL_BACKENDS:,} of 0)",
            f"{rss['backends']['rss_bytes_per']:.0f} B",
            "<= 8192 B",
        ),
        (
            f"memory over the last {r['name_churn']['window']:,} of "
            f"{r['name_churn']['names']:,} names",
            f"{r['name_churn']['grown_bytes'] / 1024:+.0f} KiB",
            "flat",
        ),
        ("8 workers, direct", f"{r['local']['direct_s']:.3f} s", ""),
        ("8 replicas via controller", f"{r['local']['controller_s']:.3f} s", ""),
        ("controller / direct", f"{r['local']['ratio']:.2f}", "<= 1.2"),
        ("stop 8 draining replicas", f"{r['local']['stop_8_s']:.3f} s", "<= 0.5 s"),
    ]
    print(f"{'measure':<30} {'figure':>22}  target")
    for name, figure, target in rows:
        print(f"{name:<30} {figure:>22}  {target}")
    print_reaction_table(r["reaction"])
    print_fork_table(r["fork_server"])
    print(f"bench.py took {r['machine']['took_s']:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
