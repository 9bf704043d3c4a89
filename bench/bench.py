"""The benchmark: reaction latency, throughput, idle cost, recovery time and memory per replica.

Run with ``nox -s bench`` (or ``python bench/bench.py``); ``--quick`` shortens the idle
measurement. Prints a table and writes the figures to ``bench/results.json``. Real clock
throughout; the runtime is ``FakeRuntime`` (or a do-nothing runtime for memory), the store a
SQLite file, so the figures are the controller's own cost; but for sections 6 and 7, on real
worker processes (7: a worker's start, forked by the fork server against spawned; ``--only
fork-server`` runs it alone and updates only its figures).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import platform
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trio
import trio.testing

import controller
from controller._watch import TOMBSTONES_KEPT
from controller.testing import FakeRuntime, FakeState

RC = controller.ReplicaConfig("bench.replica:Noop")


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
    rt = FakeRuntime(record_history=False)
    ready: list[float] = []
    died: list[float] = []
    # Replace at once: this measures reaction, and 250 crashes in a row would otherwise (rightly)
    # back off to a minute between restarts.
    no_backoff = controller.RestartPolicy(initial_delay_s=0.0, jitter=0.0)
    with controller.SQLiteStore(db) as store:
        async with controller.open_controller(
            runtime=rt, store=store, restart_policy=no_backoff
        ) as ctl:
            await ctl.deploy("lat", cfg(replicas), RC)
            await rt.wait_until(lambda r: len(r.tags(FakeState.STARTING)) == replicas)
            for tag in rt.tags(FakeState.STARTING):
                rt.finish_start(tag)
            await wait_serving(ctl, {"lat": replicas})
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


class SeedPoller:
    """The seed's design, for comparison: an asyncio loop that every 0.1 s checks every pending
    start future with ``asyncio.wait(timeout=0)`` and then notifies long-poll waiters."""

    def __init__(self) -> None:
        self.starting: dict[asyncio.Future[None], str] = {}
        self.running: set[str] = set()
        self.changed = asyncio.Event()

    async def loop(self) -> None:
        while True:
            if self.starting:
                done, _ = await asyncio.wait(list(self.starting), timeout=0)
                for fut in done:
                    self.running.add(self.starting.pop(fut))
                if done:
                    self.changed.set()
                    self.changed = asyncio.Event()
            await asyncio.sleep(0.1)


async def poller_latency(replicas: int, samples: int) -> dict[str, float]:
    poller = SeedPoller()
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(poller.loop())
    # Keep `replicas` starts pending, as the seed would while replicas come up.
    for i in range(replicas):
        poller.starting[loop.create_future()] = f"r{i}"
    out: list[float] = []
    for _ in range(samples):
        await asyncio.sleep(random.uniform(0, 0.1))  # arrive at a random point of the period
        fut = random.choice(list(poller.starting))
        changed = poller.changed
        t0 = time.perf_counter()
        fut.set_result(None)
        await changed.wait()
        out.append(time.perf_counter() - t0)
        poller.starting[loop.create_future()] = "again"
    task.cancel()
    return {"p50_ms": pct(out, 0.5) * 1e3, "p99_ms": pct(out, 0.99) * 1e3, "samples": len(out)}


# -- 2. throughput and 4. recovery --------------------------------------------------------------


async def deploy_all(ctl: controller.Controller, names: Sequence[str], replicas: int) -> None:
    """Deploy every backend concurrently (as many clients would), then wait for every goal."""
    goals: list[controller.Goal] = []

    async def deploy(name: str) -> None:
        goals.append(await ctl.deploy(name, cfg(replicas), RC))

    async with trio.open_nursery() as nursery:
        for name in names:
            nursery.start_soon(deploy, name)
    for goal in goals:
        await goal.wait()


async def throughput_and_recovery(backends: int, per_backend: int, db: Path) -> dict[str, float]:
    rt = FakeRuntime(auto_ready=True, record_history=False)
    names = [f"b{i:03d}" for i in range(backends)]
    with controller.SQLiteStore(db) as store:
        async with controller.open_controller(runtime=rt, store=store) as ctl:
            t0 = time.perf_counter()
            await deploy_all(ctl, names, per_backend)
            up = time.perf_counter() - t0
            assert sum(len(ctl.snapshot(n).replicas) for n in names) == backends * per_backend
            up_transactions = store.transactions
    # Recovery: a fresh controller, a fresh store object, the same file and runtime.
    with controller.SQLiteStore(db) as store:
        t0 = time.perf_counter()
        async with controller.open_controller(runtime=rt, store=store) as ctl:
            await wait_serving(ctl, dict.fromkeys(names, per_backend))
            recovery = time.perf_counter() - t0
            assert len(rt.replicas) == backends * per_backend  # none restarted
            t0 = time.perf_counter()
            await deploy_all(ctl, names, 0)
            down = time.perf_counter() - t0
            assert rt.tags() == []
    return {
        "up_s": up,
        "down_s": down,
        "recovery_s": recovery,
        "replicas": backends * per_backend,
        "up_sqlite_transactions": up_transactions,
    }


# -- 3. idle cost ------------------------------------------------------------------------------


async def trio_idle(replicas: int, seconds: float, db: Path, health_s: float = 0.0) -> float:
    rt = FakeRuntime(auto_ready=True, record_history=False)
    with controller.SQLiteStore(db) as store:
        async with controller.open_controller(runtime=rt, store=store) as ctl:
            per = replicas // 100
            config = cfg(per, health_check_period_s=health_s)
            goals = [await ctl.deploy(f"b{i:03d}", config, RC) for i in range(100)]
            for goal in goals:
                await goal.wait()
            gc.collect()
            c0, t0 = time.process_time(), time.perf_counter()
            await trio.sleep(seconds)
            return (time.process_time() - c0) / (time.perf_counter() - t0) * 100


async def poller_idle(replicas: int, seconds: float) -> float:
    poller = SeedPoller()
    loop = asyncio.get_running_loop()
    # The seed keeps a future per replica it watches; hold them all pending.
    for i in range(replicas):
        poller.starting[loop.create_future()] = f"r{i}"
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


async def memory_per_replica(replicas: int) -> float:
    store = controller.MemoryStore()
    async with controller.open_controller(runtime=NullRuntime(), store=store) as ctl:
        per = replicas // 100
        await (await ctl.deploy("warm", cfg(1), RC)).wait()
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        # With the default health checks on: each replica then also holds its place in the
        # backend's schedule of checks.
        config = cfg(per, health_check_period_s=10.0)
        goals = [await ctl.deploy(f"b{i:03d}", config, RC) for i in range(100)]
        for goal in goals:
            await goal.wait()
        await trio.testing.wait_all_tasks_blocked()
        # The store's copy of the checkpoint is the store's, not the controller's memory.
        store_bytes = sum(len(v) + len(k) + 100 for k, v in store.data.items())
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
        return (grown - store_bytes) / replicas


async def name_churn(names: int, batch: int = 100) -> dict[str, float]:
    """Create and delete `names` backend names (one replica each, `batch` at a time): the memory
    the controller holds must not grow with them (no lock, tombstone or series per name kept
    beyond a bound). Measured between half-way and the end, both well past the point where the
    kept tombstones reach their cap (dict tables then only resize within a bound)."""
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

        # Traced from the start, so that what the warm-up made and the churn frees counts too.
        tracemalloc.start()
        warm = max(names // 2, 2 * TOMBSTONES_KEPT)
        await churn(0, warm)
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        await churn(warm, names)
        took = time.perf_counter() - t0
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        return {"names": names, "grown_bytes": grown, "seconds": took, "left": len(store.data)}


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


# -- main ----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description="controller benchmark")
    parser.add_argument("--quick", action="store_true", help="2 s idle windows instead of 10 s")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    parser.add_argument(
        "--only",
        choices=["fork-server"],
        help="run one section, and update its figures only in the results file",
    )
    args = parser.parse_args()
    # The latency runs crash replicas on purpose; their warnings are not news here.
    logging.getLogger("controller").setLevel(logging.ERROR)
    if args.only == "fork-server":
        print("fork server vs spawn: 20 starts each ...", file=sys.stderr)
        figures = trio.run(fork_vs_spawn, 20)
        figures["command"] = "python bench/bench.py --only fork-server"
        figures["date"] = time.strftime("%Y-%m-%d")
        kept = json.loads(args.out.read_text()) if args.out.exists() else {}
        kept["fork_server"] = figures
        args.out.write_text(json.dumps(kept, indent=2) + "\n")
        print(f"{'measure':<30} {'figure':>22}  target")
        print_fork_table(figures)
        return
    idle_s = 2.0 if args.quick else 10.0
    random.seed(1)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        print("reaction latency (1,000 replicas) ...", file=sys.stderr)
        results["latency_trio"] = trio.run(trio_latency, 1000, 250, d / "lat.db")
        results["latency_poller"] = asyncio.run(poller_latency(1000, 100))
        print("throughput and recovery (10,000 replicas over 100 backends) ...", file=sys.stderr)
        results["throughput"] = trio.run(throughput_and_recovery, 100, 100, d / "tp.db")
        print(f"idle cost ({idle_s:g} s windows) ...", file=sys.stderr)
        results["idle_cpu_percent"] = {
            "trio_1000": trio.run(trio_idle, 1000, idle_s, d / "i1.db"),
            "trio_10000": trio.run(trio_idle, 10000, idle_s, d / "i2.db"),
            "trio_1000_health_10s": trio.run(trio_idle, 1000, idle_s, d / "i3.db", 10.0),
            "poller_1000": asyncio.run(poller_idle(1000, idle_s)),
            "poller_10000": asyncio.run(poller_idle(10000, idle_s)),
        }
        print("memory per replica ...", file=sys.stderr)
        results["memory_bytes_per_replica"] = trio.run(memory_per_replica, 10000)
        print("name churn: backends created and deleted ...", file=sys.stderr)
        results["name_churn"] = trio.run(name_churn, 40_000 if args.quick else 100_000)
        print("local processes: 8 replicas ...", file=sys.stderr)
        results["local"] = trio.run(local_processes, 3 if args.quick else 7)
        print("fork server vs spawn: 20 starts each ...", file=sys.stderr)
        results["fork_server"] = trio.run(fork_vs_spawn, 20)
    results["machine"] = {
        "python": platform.python_version(),
        "trio": trio.__version__,
        "cpus": __import__("os").cpu_count(),
        "command": "nox -s bench" + (" -- --quick" if args.quick else ""),
        "date": time.strftime("%Y-%m-%d"),
    }
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)


def print_table(r: dict[str, Any]) -> None:
    lt, lp, tp, idle = (
        r["latency_trio"],
        r["latency_poller"],
        r["throughput"],
        r["idle_cpu_percent"],
    )
    ratio = lp["p50_ms"] / lt["p50_ms"]
    rows = [
        ("reaction p50 (trio)", f"{lt['p50_ms']:.3f} ms", ""),
        ("reaction p99 (trio)", f"{lt['p99_ms']:.3f} ms", "<= 1 ms"),
        ("  ready p50 / p99", f"{lt['ready_p50_ms']:.3f} / {lt['ready_p99_ms']:.3f} ms", ""),
        ("  died  p50 / p99", f"{lt['died_p50_ms']:.3f} / {lt['died_p99_ms']:.3f} ms", ""),
        ("reaction p50 / p99 (poller)", f"{lp['p50_ms']:.1f} / {lp['p99_ms']:.1f} ms", ""),
        ("poller p50 / trio p50", f"{ratio:.0f}x", ">= 50x"),
        ("0 -> 10,000 replicas", f"{tp['up_s']:.3f} s", "<= 1.0 s"),
        ("10,000 -> 0 replicas", f"{tp['down_s']:.3f} s", "<= 1.0 s"),
        ("recovery, 10,000 live", f"{tp['recovery_s']:.3f} s", "<= 1.0 s"),
        ("idle CPU, 1,000 (trio)", f"{idle['trio_1000']:.3f} %", "<= 1 %"),
        ("idle CPU, 10,000 (trio)", f"{idle['trio_10000']:.3f} %", "<= 1 %"),
        ("idle CPU, 1,000, checks every 10 s", f"{idle['trio_1000_health_10s']:.3f} %", ""),
        ("idle CPU, 1,000 (poller)", f"{idle['poller_1000']:.3f} %", ""),
        ("idle CPU, 10,000 (poller)", f"{idle['poller_10000']:.3f} %", ""),
        ("memory per replica", f"{r['memory_bytes_per_replica']:.0f} B", "<= 2048 B"),
        (
            f"memory after {r['name_churn']['names']:,} names",
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
    print_fork_table(r["fork_server"])


if __name__ == "__main__":
    main()
