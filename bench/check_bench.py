"""What a health check costs the controller, on real workers and on LocalRuntime's wire (issue 31).

Three figures (a fourth, Ray's, when asked), each of the controller's own process CPU
(``time.process_time``; the workers' CPU is theirs, not counted), with the collector set as the
daemon sets it (``tune_gc``) unless ``--default-gc``:

(a) ``per_check``: one real LocalRuntime check, median and p90 over waves. `--workers` real
    workers (forked by the fork server) are checked together in a wave; a wave's CPU over its
    checks is one sample. Three ways take turns, so that all meet the same machine load: the
    wave as the controller checks it now (``wave``: one ``check_health_replicas`` call, one task,
    every request written before any answer is awaited); a task a check over the monitor
    connection (``monitor``: the controller's path earlier in issue 31); and a task a check over
    a new connection each (``new_connection``: the path before issue 31, which workers started
    by an older version still take).
(b) ``idle_real``: a controller holding `--idle-workers` real workers (one backend of them, the
    default 10 s check period) at rest, over one whole period; scaled to 10,000 replicas.
(c) ``idle_wire``: a controller holding 10,000 replicas (100 backends of 100, the default
    period) whose workers are served by two helper processes that answer on the same wire, one
    Unix connection per replica: the controller's side is LocalRuntime's (``MonitorLink``), the
    workers' the real ``Worker`` class, each helper holding thousands of them.
(d) ``per_check_ray`` (``--only ray``; not in the default run, which stays near a minute): one
    check of a RayRuntime actor, as (a), on a local Ray cluster started here: the wave in one
    call (the controller's path now) taking turns with a task a check (the path before).

Prints a table and writes bench/check_results.json. ``--old-wire`` runs (b) with every check
over a new connection, to compare; ``--no-checks`` runs (b) and (c) with checks off. (b) also
runs against the package as it was before issue 31 (with that package first on the path): the
modules only (a) and (c) need are imported where they are used.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import reaper
import trio

import controller
from controller._core.gc import tune_gc
from controller._local.commands import command
from controller._local.wire import LineStream
from controller._local.worker import Worker
from controller._ports.wrap import RuntimeWrapper

if TYPE_CHECKING:
    from controller._local.link import MonitorLink
    from controller._local.link_reader import LinkReader

HERE = Path(__file__).parent
NOOP = controller.ReplicaConfig("noop_replica:Noop")
#: The target: 2 % of a core for 10,000 replicas' checks every 10 s, i.e. 20 us a check.
PERIOD_S = 10.0


def pct(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def config(n: int, checks: bool = True) -> controller.BackendConfig:
    # The default check period (10 s) and timeout: what a user who says nothing gets; or none,
    # for the cost of holding the replicas without checks, to compare.
    return controller.BackendConfig(
        num_replicas=n,
        version="v1",
        graceful_shutdown_timeout_s=1,
        **({} if checks else {"health_check_period_s": 0.0}),
    )


async def old_check(rt: controller.LocalRuntime, tag: str) -> None:
    """A check as LocalRuntime made it before issue 31: a new connection and a JSON command
    (what it still does for a worker started by an older version)."""
    await command(rt.runtime_dir, tag, rt.epoch, {"op": "check_health"})


class OldWire(RuntimeWrapper):
    """LocalRuntime with every check made as before issue 31 (`old_check`)."""

    def __init__(self, inner: controller.LocalRuntime):
        super().__init__(inner)
        self.local = inner

    async def check_health_replica(self, tag: str) -> None:
        await old_check(self.local, tag)


# -- (a) one check -----------------------------------------------------------------------------


async def per_check(workers: int, waves: int, d: Path) -> dict[str, Any]:
    rt = controller.LocalRuntime(d / "a", pythonpath=[HERE])

    async def wave_of(tags: list[str]) -> None:
        # As the controller checks a wave now: one call, one task (``check_wave``).
        answered: list[tuple[str, Exception | None]] = []
        await rt.check_health_replicas(tags, answered.extend)
        assert len(answered) == len(tags)
        assert not any(error for _, error in answered)

    async def each(how: Any, tags: list[str]) -> None:
        async with trio.open_nursery() as checks:
            for tag in tags:
                checks.start_soon(how, rt, tag)

    paths: dict[str, Any] = {
        "wave": wave_of,
        "monitor": partial(each, controller.LocalRuntime.check_health_replica),
        "new_connection": partial(each, old_check),
    }
    samples: dict[str, list[float]] = {name: [] for name in paths}
    async with trio.open_nursery() as nursery:
        await nursery.start(rt.serve, lambda tag, reason: None)
        await rt.wait_fork_server_ready()
        tags = [f"a#{i}" for i in range(workers)]
        limit = trio.CapacityLimiter(16)

        async def start(tag: str) -> None:
            async with limit:
                await rt.start_replica(controller.ReplicaSpec(tag, "a", "v1", NOOP, None, {}))

        async with trio.open_nursery() as starts:
            for tag in tags:
                starts.start_soon(start, tag)
        gc.collect()
        for wave in range(len(paths) * (waves + 1)):
            name = list(paths)[wave % len(paths)]
            c0 = time.process_time()
            await paths[name](tags)
            spent = time.process_time() - c0
            if wave >= len(paths):  # the first of each: warming up
                samples[name].append(spent / workers * 1e6)
        async with trio.open_nursery() as kills:
            for tag in tags:
                kills.start_soon(rt.kill_replica, tag)
        nursery.cancel_scope.cancel()
    return {
        "workers": workers,
        "waves": waves,
        **{
            name: {"median_us": statistics.median(s), "p90_us": pct(s, 0.9)}
            for name, s in samples.items()
        },
    }


# -- (b) idle, real workers --------------------------------------------------------------------


async def idle_real(workers: int, d: Path, *, old_wire: bool, checks: bool) -> dict[str, Any]:
    rt = controller.LocalRuntime(d / "b", pythonpath=[HERE], max_replicas=workers + 10)
    used: controller.Runtime = OldWire(rt) if old_wire else rt
    with controller.SQLiteStore(d / "b.db") as store:
        async with controller.open_controller(runtime=used, store=store) as ctl:
            await rt.wait_fork_server_ready()
            t0 = time.perf_counter()
            await (await ctl.deploy("idle", config(workers, checks), NOOP)).wait()
            started_s = time.perf_counter() - t0
            gc.collect()
            # Replicas that started together are checked together: the window is one whole
            # period, from half a period after the last start, so it holds each check once.
            await trio.sleep(PERIOD_S / 2)
            cpu = await _window(PERIOD_S)
            await (await ctl.delete("idle")).wait()
    return {
        "workers": workers,
        "wire": "no checks" if not checks else "new connection" if old_wire else "monitor",
        "start_s": started_s,
        "cpu_percent": cpu,
        "per_10000_percent": cpu * 10000 / workers,
        "us_per_check": cpu / 100 * PERIOD_S / workers * 1e6,
    }


async def _window(seconds: float) -> float:
    c0, t0 = time.process_time(), time.perf_counter()
    await trio.sleep(seconds)
    return (time.process_time() - c0) / (time.perf_counter() - t0) * 100


# -- (c) idle, 10,000 on the wire ----------------------------------------------------------------


def helper_main(path: str) -> None:
    """A helper process: each connection to `path` is the monitor connection of a worker of its
    own (the real ``Worker``, its replica a class without ``check_health``, ready)."""

    async def serve() -> None:
        count = 0

        async def handle(stream: trio.SocketStream) -> None:
            nonlocal count
            count += 1
            worker = Worker({"tag": f"w#{count}", "epoch": 0})
            worker.instance = object()
            worker.ready.set()
            await worker.handle(stream)

        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(path)
        sock.listen(4096)
        print("ready", flush=True)
        await trio.serve_listeners(handle, [trio.SocketListener(sock)])

    trio.run(serve)


class WireRuntime:
    """A runtime whose replicas are workers in helper processes, each reached over a monitor
    connection of its own, read and checked as LocalRuntime reads and checks them (``LinkReader``,
    ``check_wave``)."""

    def __init__(self, helpers: Sequence[str]):
        self._helpers = helpers
        self._links: dict[str, MonitorLink] = {}
        self._reader: LinkReader | None = None
        self._nursery: trio.Nursery | None = None
        self._started = 0

    async def serve(
        self,
        on_death: controller.DeathListener,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        from controller._local.link_reader import LinkReader  # see the module docstring

        async with trio.open_nursery() as nursery:
            self._reader = LinkReader()
            await nursery.start(self._reader.serve)
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def capacity(self) -> None:
        return None

    async def list_replicas(self) -> list[str]:
        return []

    async def start_replica(self, spec: controller.ReplicaSpec) -> str | None:
        from controller._local.link import MonitorLink  # see the module docstring

        assert self._nursery is not None
        path = self._helpers[self._started % len(self._helpers)]
        self._started += 1
        lines = LineStream(await trio.open_unix_socket(path))
        await lines.send({"op": "monitor"})
        link = self._links[spec.tag] = MonitorLink(spec.tag, lines, checks=True)
        assert self._reader is not None
        self._nursery.start_soon(self._reader.read, link, lambda load, served, models: None)
        return None

    async def adopt_replica(self, tag: str) -> str | None:
        raise controller.ReplicaGoneError(tag)

    async def reconfigure_replica(self, tag: str, user_config: controller.JSON) -> None:
        await trio.lowlevel.checkpoint()

    async def check_health_replica(self, tag: str) -> None:
        # LocalRuntime.check_health_replica's own path for a worker that answers on its link.
        from controller._local.commands import refused  # see the module docstring
        from controller._local.link import ENDED

        answer = await self._links[tag].check(0)
        if answer is ENDED:
            raise controller.ReplicaError(tag, "WorkerDied", "its monitor connection ended")
        if answer is not None:
            raise refused(tag, 0, "check_health", answer)

    async def check_health_replicas(
        self, tags: Sequence[str], report: controller.CheckReport
    ) -> None:
        # LocalRuntime.check_health_replicas's own path for workers that answer on their links.
        from controller._local.check_wave import check_wave  # see the module docstring

        await check_wave([(tag, self._links[tag]) for tag in tags], 0, Path("/nonexistent"), report)

    async def drain_replica(self, tag: str) -> None:
        await trio.lowlevel.checkpoint()

    async def kill_replica(self, tag: str) -> None:
        link = self._links.pop(tag, None)
        if link is not None:
            await link.lines.aclose()

    def fence(self, epoch: int) -> None:
        pass


def start_helpers(d: Path, count: int = 2) -> tuple[list[str], list[subprocess.Popen[str]]]:
    """`count` helper processes (`helper_main`), serving; their socket paths."""
    paths = [str(d / f"h{i}.sock") for i in range(count)]
    helpers = [
        subprocess.Popen(
            [sys.executable, __file__, "--helper", path], stdout=subprocess.PIPE, text=True
        )
        for path in paths
    ]
    for helper in helpers:
        assert helper.stdout is not None
        assert helper.stdout.readline().strip() == "ready"
    return paths, helpers


async def idle_wire(
    paths: Sequence[str], replicas: int, backends: int, d: Path, checks: bool
) -> dict[str, Any]:
    rt = WireRuntime(paths)
    with controller.SQLiteStore(d / "c.db") as store:
        async with controller.open_controller(runtime=rt, store=store) as ctl:
            per = replicas // backends
            goals = [
                await ctl.deploy(f"b{i:03d}", config(per, checks), NOOP) for i in range(backends)
            ]
            for goal in goals:
                await goal.wait()
            gc.collect()
            await trio.sleep(PERIOD_S / 2)
            cpu = await _window(PERIOD_S)
            failing = sum(
                1
                for i in range(backends)
                for r in ctl.status(f"b{i:03d}").replicas
                if not r.healthy
            )
    return {
        "replicas": replicas,
        "backends": backends,
        "cpu_percent": cpu,
        "us_per_check": cpu / 100 * PERIOD_S / replicas * 1e6,
        "replicas_not_healthy": failing,
    }


# -- (d) Ray ----------------------------------------------------------------------------------


async def per_check_ray(actors: int, waves: int) -> dict[str, Any]:
    """(d): one check of a RayRuntime actor, as (a) measures LocalRuntime's: the controller's
    process CPU per check over waves of `actors` checks (Ray's own threads in this process
    count: they are the driver's). Needs a local Ray cluster, started here."""
    import ray  # only here: the other sections need no Ray

    from controller.ray import RayRuntime

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR)
    try:
        rt = RayRuntime(namespace="check-bench", pythonpath=[HERE])
        samples: dict[str, list[float]] = {"wave": [], "task_each": []}
        async with trio.open_nursery() as nursery:
            await nursery.start(rt.serve, lambda tag, reason: None)
            tags = [f"r#{i}" for i in range(actors)]

            async def wave_of() -> None:
                answered: list[tuple[str, Exception | None]] = []
                await rt.check_health_replicas(tags, answered.extend)
                assert len(answered) == len(tags)
                assert not any(error for _, error in answered)

            async def each() -> None:
                async with trio.open_nursery() as checks:
                    for tag in tags:
                        checks.start_soon(rt.check_health_replica, tag)

            async with trio.open_nursery() as starts:
                for tag in tags:
                    starts.start_soon(
                        rt.start_replica, controller.ReplicaSpec(tag, "r", "v1", NOOP, None, {})
                    )
            gc.collect()
            for wave in range(2 * (waves + 1)):
                name, how = ("wave", wave_of) if wave % 2 else ("task_each", each)
                c0 = time.process_time()
                await how()
                if wave >= 2:
                    samples[name].append((time.process_time() - c0) / actors * 1e6)
            async with trio.open_nursery() as kills:
                for tag in tags:
                    kills.start_soon(rt.kill_replica, tag)
            nursery.cancel_scope.cancel()
    finally:
        ray.shutdown()
    return {
        "actors": actors,
        "waves": waves,
        # The wave, as the controller checks now; and a task a check, as before.
        "median_us": statistics.median(samples["wave"]),
        "p90_us": pct(samples["wave"], 0.9),
        "task_each": {
            "median_us": statistics.median(samples["task_each"]),
            "p90_us": pct(samples["task_each"], 0.9),
        },
    }


def main() -> None:
    reaper.leave_nothing()
    parser = argparse.ArgumentParser(description="health check costs (issue 31)")
    parser.add_argument("--helper", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=100, help="(a): real workers checked")
    parser.add_argument("--waves", type=int, default=20, help="(a): waves of each path")
    parser.add_argument("--idle-workers", type=int, default=300, help="(b): real workers held")
    parser.add_argument("--old-wire", action="store_true", help="(b): checks as before")
    parser.add_argument("--no-checks", action="store_true", help="(b), (c): checks off, to compare")
    parser.add_argument(
        "--only",
        choices=["a", "b", "c", "ray"],
        action="append",
        help="run these sections (default: a, b and c; ray only when named)",
    )
    parser.add_argument("--actors", type=int, default=16, help="ray: actors checked")
    parser.add_argument(
        "--default-gc",
        action="store_true",
        help="Python's collector settings, as an embedding application has them (default: the "
        "daemon's, tune_gc)",
    )
    parser.add_argument("--out", type=Path, default=HERE / "check_results.json")
    args = parser.parse_args()
    if args.helper:
        helper_main(args.helper)
        return
    logging.getLogger("controller").setLevel(logging.ERROR)
    only = set(args.only or ["a", "b", "c"])
    if not args.default_gc:
        tune_gc()  # as `controller run` does
    results: dict[str, Any] = {
        "loadavg_before": os.getloadavg(),
        "gc": "default" if args.default_gc else "tuned",
    }
    with tempfile.TemporaryDirectory(prefix="chk", dir="/tmp") as tmp:
        d = Path(tmp)
        if "a" in only:
            print(f"(a) one check, {args.workers} real workers ...", file=sys.stderr)
            results["per_check"] = trio.run(per_check, args.workers, args.waves, d)
        if "b" in only:
            print(f"(b) idle, {args.idle_workers} real workers ...", file=sys.stderr)
            results["idle_real"] = trio.run(
                lambda: idle_real(
                    args.idle_workers, d, old_wire=args.old_wire, checks=not args.no_checks
                )
            )
        if "c" in only:
            print("(c) idle, 10,000 replicas on the wire ...", file=sys.stderr)
            paths, helpers = start_helpers(d)
            try:
                results["idle_wire"] = trio.run(idle_wire, paths, 10000, 100, d, not args.no_checks)
            finally:
                for helper in helpers:
                    helper.kill()
                    helper.wait()
        if "ray" in only:
            print(f"(d) one check, {args.actors} Ray actors ...", file=sys.stderr)
            results["per_check_ray"] = trio.run(per_check_ray, args.actors, args.waves)
    results["loadavg_after"] = os.getloadavg()
    results["date"] = time.strftime("%Y-%m-%d %H:%M")
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)


def print_table(r: dict[str, Any]) -> None:
    print(f"{'measure':<58} {'figure':>14}  target")
    if "per_check" in r:
        a = r["per_check"]
        for name, label in (
            ("wave", "a wave in one call"),
            ("monitor", "a task a check, monitor connection"),
            ("new_connection", "a task a check, new connection"),
        ):
            f = a.get(name)
            if f is None:
                continue
            print(
                f"{'(a) CPU per real check, ' + label + ', median / p90':<58} "
                f"{f['median_us']:>6.0f} / {f['p90_us']:<5.0f}us  <= 50 us (median)"
            )
    if "idle_real" in r:
        b = r["idle_real"]
        print(
            f"{'(b) idle, ' + str(b['workers']) + ' real workers, ' + b['wire']:<58} "
            f"{b['cpu_percent']:>13.2f}%"
        )
        print(f"{'    scaled to 10,000':<58} {b['per_10000_percent']:>13.2f}%  <= 2 %")
    if "idle_wire" in r:
        c = r["idle_wire"]
        print(f"{'(c) idle, 10,000 on the wire':<58} {c['cpu_percent']:>13.2f}%  <= 2 %")
    if "per_check_ray" in r:
        f = r["per_check_ray"]
        print(
            f"{'(d) CPU per Ray check, a wave in one call, median / p90':<58} "
            f"{f['median_us']:>6.0f} / {f['p90_us']:<5.0f}us"
        )
        e = f["task_each"]
        print(
            f"{'(d) CPU per Ray check, a task a check, median / p90':<58} "
            f"{e['median_us']:>6.0f} / {e['p90_us']:<5.0f}us"
        )
    la, lb = r["loadavg_before"], r["loadavg_after"]
    print(f"load average before {la[0]:.2f}, after {lb[0]:.2f}")


if __name__ == "__main__":
    main()
