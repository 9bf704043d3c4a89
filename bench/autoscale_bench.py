"""The autoscaling benchmarks: what the autoscaler costs, and how fast a backend at zero answers.

1. **Autoscaler cost**: a controller in this process (FakeRuntime, a real SQLite store) holding
   10,000 autoscaled replicas, each of whose in-flight count changes 10 times a second, as an
   ingress reports them (one report per backend per 100 ms, every replica's count in it).
   Measured: this process's CPU time over the window, as a share of one core (an upper bound
   for the controller's: the driver that hands it the prepared reports is in it too).
2. **Scale from zero**: a daemon with its ingress and a backend autoscaled to zero; the time
   from a request sent through the ingress to its answer, with LocalRuntime's fork server and
   without it (each worker a fresh Python). Then Ray Serve's scale from zero (``min_replicas=0``)
   on a local Ray cluster, as the race on Ray starts it.

Writes ``bench/autoscale_results.json``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import reaper
import trio

import controller
from controller.testing import FakeRuntime

HERE = Path(__file__).parent
ROOT = HERE.parent


def pct(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


# -- 1. the autoscaler's cost ---------------------------------------------------------------


async def autoscaler_cost(backends: int, per_backend: int, seconds: float, db: Path) -> float:
    """CPU share of one core while every replica's load changes 10 times a second."""
    rng = random.Random(1)
    # Load near the target (2 per replica), so the count holds, as in a steady service.
    scaling = controller.AutoscalingConfig(
        min_replicas=1, max_replicas=per_backend * 2, target_ongoing_requests=2
    )
    store = controller.SQLiteStore(db)
    runtime = FakeRuntime(auto_ready=True)
    with store:
        async with controller.open_controller(runtime=runtime, store=store) as ctl:
            names = [f"b{i}" for i in range(backends)]
            cfg = controller.BackendConfig(
                num_replicas=per_backend,
                version="v1",
                health_check_period_s=0,
                autoscaling=scaling,
            )
            rc = controller.ReplicaConfig("app:Replica")
            goals = [await ctl.deploy(n, cfg, rc) for n in names]
            for goal in goals:
                await goal.wait()
            # Ten report sets per backend, made beforehand: the driver only hands them over.
            # Each replica's count moves among 1, 2 and 3 from one to the next (a shuffle of
            # one multiset), while the backend's total stays on target, as in a steady service.
            variants: dict[str, list[controller.LoadReport]] = {}
            for name in names:
                tags = [r.tag for r in ctl.status(name).replicas]
                counts = [1, 3] * (len(tags) // 2) + [2] * (len(tags) % 2)
                variants[name] = []
                for _ in range(10):
                    rng.shuffle(counts)
                    report = dict(zip(tags, counts, strict=True))
                    variants[name].append(controller.LoadReport("ingress-1", name, report))
            for name in names:
                ctl.report_load(variants[name][0])
            await trio.sleep(1)  # the first reports' passes, before the window
            tick, started = 0, trio.current_time()
            cpu0 = time.process_time()
            while trio.current_time() - started < seconds:
                tick += 1
                for name in names:
                    ctl.report_load(variants[name][tick % 10])
                await trio.sleep_until(started + tick * 0.1)
            cpu = time.process_time() - cpu0
            wall = trio.current_time() - started
            held = {ctl.status(n).desired_replicas for n in names}
            assert held == {per_backend}, held  # steady: the count held
    return cpu / wall


# -- 2. scale from zero ---------------------------------------------------------------------

MANIFEST = """
[backends.cold]
entrypoint = "ingress_replica:Trivial"
route_prefix = "/cold"
num_replicas = 0
version = "v1"

[backends.cold.autoscaling]
min_replicas = 0
max_replicas = 1
target_ongoing_requests = 1
downscale_stabilization_s = 0
scale_to_zero_delay_s = 0
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def get(host: str, port: int, path: str, token: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        conn.request("GET", path, headers=headers)
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


@contextmanager
def daemon(fork_server: bool) -> Iterator[tuple[int, int, str]]:
    """A daemon with the cold backend: (api port, ingress port, token)."""
    state = Path(tempfile.mkdtemp(prefix="asb", dir="/tmp"))
    (state / "cold.toml").write_text(MANIFEST)
    api, ingress = free_port(), free_port()
    argv = [
        sys.executable,
        "-m",
        "controller",
        "--state-dir",
        str(state),
        "run",
        "--listen",
        f"127.0.0.1:{api}",
        "--ingress-listen",
        f"127.0.0.1:{ingress}",
        "--config",
        str(state / "cold.toml"),
        "--pythonpath",
        str(HERE),
    ]
    if not fork_server:
        argv.append("--no-fork-server")
    log = (state / "daemon.log").open("wb")
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not (state / "daemon.json").exists():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the daemon did not start: see {state / 'daemon.log'}")
            time.sleep(0.05)
        time.sleep(0.5)  # its fork server, its ingress
        yield api, ingress, (state / "token").read_text().strip()
    finally:
        subprocess.run(
            [sys.executable, "-m", "controller", "--state-dir", str(state), "shutdown"],
            check=False,
            timeout=60,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        log.close()
        shutil.rmtree(state, ignore_errors=True)


def replicas(api: int, token: str, backend: str = "cold") -> int:
    status, body = get("127.0.0.1", api, f"/api/v1/backends/{backend}", token)
    assert status == 200, body
    return len(json.loads(body)["replicas"])


def first_answer(api: int, ingress: int, token: str, backend: str, path: str) -> float:
    """Wait until `backend` (autoscaled, no zero delay) has no replica, then time one request
    to `path` through the ingress, from its send to its answer (seconds)."""
    deadline = time.monotonic() + 30
    while replicas(api, token, backend):  # back at zero (the delay is 0)
        if time.monotonic() > deadline:
            raise RuntimeError(f"the backend {backend!r} did not scale to zero")
        time.sleep(0.05)
    time.sleep(0.3)  # the zero settled: no replica still stopping
    start = time.perf_counter()
    status, body = get("127.0.0.1", ingress, path)
    took = time.perf_counter() - start
    assert status == 200, body
    return took


def cold_starts(fork_server: bool, trials: int) -> list[float]:
    """First request to its answer, through the ingress, from zero replicas each time."""
    with daemon(fork_server) as (api, ingress, token):
        return [first_answer(api, ingress, token, "cold", "/cold") for _ in range(trials)]


class ServeCold:
    """The Ray Serve deployment: a small JSON answer."""

    async def __call__(self, request: Any) -> dict[str, Any]:
        return {"ok": True, "pid": os.getpid()}


def serve_cold_starts(trials: int, *, tuned: bool) -> list[float]:
    """Ray Serve's scale from zero: min_replicas 0, the same request through its proxy; no
    delays, and `tuned`: its load metrics sampled and pushed every 0.1 s over a 0.5 s window
    (its defaults are 10 s and 30 s)."""
    import logging

    import ray
    from ray import serve

    tmp = Path(tempfile.mkdtemp(prefix="asr", dir="/tmp"))
    os.environ["RAY_TMPDIR"] = str(tmp)
    ray.init(num_cpus=4, include_dashboard=False, logging_level=logging.WARNING)
    port = free_port()
    out = []
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        deployment = serve.deployment(
            name="Cold",
            max_ongoing_requests=100,
            ray_actor_options={"num_cpus": 0.25},
            autoscaling_config={
                "min_replicas": 0,
                "initial_replicas": 0,
                "max_replicas": 1,
                "target_ongoing_requests": 1,
                "upscale_delay_s": 0,
                "downscale_delay_s": 0,
                "downscale_to_zero_delay_s": 0,
                **({"metrics_interval_s": 0.1, "look_back_period_s": 0.5} if tuned else {}),
            },
        )(ServeCold)
        serve.run(deployment.bind(), name="cold", route_prefix="/cold", blocking=False)

        def running() -> int:
            app = serve.status().applications.get("cold")
            if app is None:
                return -1
            dep = app.deployments.get("Cold")
            return (
                -1 if dep is None else sum(dep.replica_states.get(s, 0) for s in dep.replica_states)
            )

        for _ in range(trials):
            deadline = time.monotonic() + 120
            while running() != 0:
                if time.monotonic() > deadline:
                    raise RuntimeError("Serve did not scale to zero")
                time.sleep(0.05)
            time.sleep(0.3)
            start = time.perf_counter()
            status, body = get("127.0.0.1", port, "/cold")
            out.append(time.perf_counter() - start)
            assert status == 200, body
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def summary(samples: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(samples),
        "median_ms": round(statistics.median(samples) * 1000, 1),
        "p90_ms": round(pct(samples, 0.9) * 1000, 1),
        "min_ms": round(min(samples) * 1000, 1),
        "max_ms": round(max(samples) * 1000, 1),
    }


def main() -> None:
    reaper.leave_nothing()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="the cost window")
    parser.add_argument("--trials", type=int, default=10, help="cold starts per side")
    parser.add_argument(
        "--serve-trials",
        type=int,
        default=None,
        help="Ray Serve's cold starts at its defaults (default: --trials); each takes ~35 s",
    )
    parser.add_argument("--no-ray", action="store_true", help="skip Ray Serve")
    parser.add_argument("--only-ray", action="store_true", help="only Ray Serve")
    parser.add_argument("--out", type=Path, default=HERE / "autoscale_results.json")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="asc") as tmp:
        for backends, per in () if args.only_ray else ((100, 100), (1, 10_000)):
            share = trio.run(
                autoscaler_cost, backends, per, args.seconds, Path(tmp) / f"{backends}.db"
            )
            key = f"autoscaler_cpu_{backends}x{per}"
            results[key] = round(share * 100, 2)
            print(
                f"autoscaler cost, {backends} backends x {per} replicas, 10 load changes/s each: "
                f"{share * 100:.2f} % of a core (target <= 5 %)",
                flush=True,
            )
    for fork in () if args.only_ray else (True, False):
        samples = cold_starts(fork, args.trials)
        key = "cold_start_fork" if fork else "cold_start_spawn"
        results[key] = summary(samples)
        print(
            f"scale from zero, first request to answer, {'fork server' if fork else 'spawn'}: "
            f"{results[key]} (target <= 100 ms with the fork server)",
            flush=True,
        )
    if not args.no_ray:
        for tuned in (False, True):
            key = "cold_start_serve_tuned" if tuned else "cold_start_serve"
            trials = args.trials if tuned or args.serve_trials is None else args.serve_trials
            results[key] = summary(serve_cold_starts(trials, tuned=tuned))
            print(f"scale from zero, Ray Serve{' tuned' if tuned else ''}: {results[key]}")
    if args.out.exists():
        results = {**json.loads(args.out.read_text()), **results}  # a partial run keeps the rest
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
