"""The serving benchmark: backends as code, served by the worker, against what users would pick
instead, side by side in one run on this machine.

1. **Hello world** (``bench/serve_hello.py``: ``def hello(request)``), reached five ways:
   through our ingress to our worker (a backend whose entrypoint is the function); our worker
   alone (its port, no ingress); Ray Serve's ``@serve.deployment`` of the same function through
   its proxy; HAProxy in front of uvicorn serving the function as ASGI; uvicorn alone. One
   process a side: our ingress with ``--ingress-workers 1`` and one replica, HAProxy with
   ``nbthread 1`` and one uvicorn process, Serve's one proxy and one replica. Beside them, the
   same function as ``async def`` through our ingress: our worker calls a plain function in a
   thread (as Serve does), a coroutine on its loop, and the difference is the thread's cost.
2. **A FastAPI app** (``bench/serve_fastapi.py``), served by our worker (its port) and by
   ``uvicorn serve_fastapi:app``.
3. **First answer from zero replicas**: a function backend autoscaled with ``min_replicas = 0``,
   a request through the ingress from zero each time (as ``autoscale_bench.py`` measures it for
   the trivial replica class, which is measured beside it, alternating).

The contenders of 1 and 2 take turns (A B C ... A B C ...) for ``--rounds`` rounds; every
ratio is the median of its rounds' ratios. Each turn: one connection, closed loop, for the
unloaded p50 (the project's own generator, ``ingress_bench.load``), then ``wrk -t2 -c32 -d5s
--latency`` after a 1 s ``wrk`` warm-up, with each process's CPU from ``/proc/PID/stat`` over
the measured window (``ingress_bench.wrk_load``). Per core: requests a second over the cores
used by the serving side (proxy + app); the control planes (our daemon; Serve's controller
and Ray's own processes) are reported beside it.

    RAY_AUTH_MODE=disabled python bench/serve_bench.py [--rounds N] [--seconds S] [--no-serve]

Needs ``ray[serve]``, ``uvicorn[standard]``, ``fastapi``, ``wrk`` and ``haproxy`` (``nox -s
bench`` installs them). Prints Markdown tables; writes ``bench/serve_results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import autoscale_bench
import c_proxies
import ingress_bench
import reaper
from ingress_bench import free_port, wait_answers

HERE = Path(__file__).resolve().parent

BACKENDS = """
[backends.hello]
entrypoint = "serve_hello:hello"
route_prefix = "/hello"
num_replicas = 1
version = "v1"

[backends.hello_async]
entrypoint = "serve_hello:hello_async"
route_prefix = "/hello-async"
num_replicas = 1
version = "v1"

[backends.api]
entrypoint = "serve_fastapi:app"
route_prefix = "/api"
num_replicas = 1
version = "v1"

[backends.cold]
entrypoint = "serve_hello:hello"
route_prefix = "/cold"
num_replicas = 0
version = "v1"

[backends.cold.autoscaling]
min_replicas = 0
max_replicas = 1
target_ongoing_requests = 1
downscale_stabilization_s = 0
scale_to_zero_delay_s = 0

[backends.cancel]
entrypoint = "serve_sleeper:Sleeper"
route_prefix = "/cancel"
num_replicas = 1
version = "v1"

[backends.cold_class]
entrypoint = "ingress_replica:Trivial"
route_prefix = "/cold-class"
num_replicas = 0
version = "v1"

[backends.cold_class.autoscaling]
min_replicas = 0
max_replicas = 1
target_ongoing_requests = 1
downscale_stabilization_s = 0
scale_to_zero_delay_s = 0
"""
HELLO_PATH = "/hello?name=bench"
FASTAPI_PATH = "/items/42?q=bench"
#: The CPU groups: the proxy tier, the application servers, the control plane.
GROUPS = ("proxy", "app", "control")


@dataclass
class Contender:
    name: str
    label: str
    target: tuple[str, int, str]
    groups: dict[str, list[int]]
    section: str  # "hello" or "fastapi"
    unloaded: bool = True  # measure the one-connection latency too


# -- the contenders' servers ---------------------------------------------------------------


@contextmanager
def uvicorn(app: str, port: int, log: Path, *options: str) -> Iterator[list[int]]:
    """``uvicorn APP`` (one process, no access log) on `port`: yields its pid."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                app,
                *("--app-dir", str(HERE), "--host", "127.0.0.1", "--port", str(port)),
                *("--no-access-log", "--log-level", "warning", *options),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while not _listening(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn {app} did not start: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        yield [proc.pid]
    finally:
        ingress_bench.stop(proc)


def _title(pid: int) -> str:
    """A process's command line, shortened (Ray's workers name themselves ``ray::...``)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"{pid}: gone"
    text = " ".join(a.decode(errors="replace") for a in argv[:4] if a)
    return f"{pid}: {text[:100]}"


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def daemon() -> AbstractContextManager[ingress_bench.Daemon]:
    return ingress_bench.daemon_with(BACKENDS, "sbd")


@contextmanager
def ray_serve(tmp: Path) -> Iterator[tuple[int, dict[str, list[int]]]]:
    """A local Ray cluster and Serve's proxy with `hello` deployed (one replica, access log off,
    as our ingress has it) at ``/hello``: yields the port and the CPU groups (its proxy, its
    replica, and the rest of what the cluster runs: Serve's controller, the GCS, the raylet,
    Ray's other processes)."""
    import serve_hello

    before = set(reaper.descendants(os.getpid()))
    port = free_port()
    with (
        ingress_bench.ray_cluster(tmp),
        ingress_bench.serve_app(
            port,
            access_log=False,
            target=serve_hello.hello,
            name="hello",
            route_prefix="/hello",
            num_replicas=1,
        ),
    ):
        wait_answers(f"http://127.0.0.1:{port}{HELLO_PATH}", timeout_s=60)
        proxy = ingress_bench.ray_pids("ray::ProxyActor")
        app = ingress_bench.ray_pids("ray::ServeReplica")
        ray_side = set(reaper.descendants(os.getpid())) - before
        control = sorted(ray_side - set(proxy) - set(app))
        yield port, {"proxy": proxy, "app": app, "control": control}


# -- measuring -----------------------------------------------------------------------------


def measure(c: Contender, args: argparse.Namespace) -> dict[str, Any]:
    """One turn of `c`: the one-connection latency, then wrk with the CPU of each group."""
    out: dict[str, Any] = {}
    if c.unloaded:
        one = ingress_bench.load(
            c.target, conns=1, procs=1, warmup_s=0.3, seconds=args.idle_seconds
        )
        out["unloaded"] = {k: one[k] for k in ("rps", "p50_ms", "p90_ms", "p99_ms", "errors")}
    wrk_args = argparse.Namespace(conns=args.conns, warmup=args.warmup, seconds=args.seconds)
    loaded = ingress_bench.wrk_load(c.target, c.groups, wrk_args)
    cores = loaded["cores_used"]
    served = cores.get("proxy", 0.0) + cores.get("app", 0.0)
    rps = loaded["rps"]
    loaded["served_cores"] = served
    loaded["us_per_request"] = {
        "served": served / rps * 1e6,
        **{g: cores.get(g, 0.0) / rps * 1e6 for g in GROUPS},
        "machine": cores["machine"] / rps * 1e6,
    }
    loaded["per_core"] = rps / max(served, 1e-9)
    loaded["per_core_with_control"] = rps / max(served + cores.get("control", 0.0), 1e-9)
    out["wrk"] = loaded
    return out


def _say(c: Contender, m: dict[str, Any]) -> None:
    w = m["wrk"]
    one = m.get("unloaded")
    extra = f"; one connection p50 {one['p50_ms']:.3f} ms" if one else ""
    errors = f"; {w['non_2xx']} non-2xx" if w["non_2xx"] else ""
    print(
        f"  {c.name}: {w['rps']:,.0f} req/s, p50 {w['p50_ms']} ms, "
        f"{w['us_per_request']['served']:.0f} us a request (proxy "
        f"{w['us_per_request']['proxy']:.0f} + app {w['us_per_request']['app']:.0f}), "
        f"{w['per_core']:,.0f} req/s per core{extra}{errors}",
        file=sys.stderr,
        flush=True,
    )


def median_of(rounds: Sequence[dict[str, Any]], get: Callable[[dict[str, Any]], float]) -> float:
    return float(statistics.median(get(r) for r in rounds))


def _cores(group: str) -> Callable[[dict[str, Any]], float]:
    return lambda r: float(r["wrk"]["cores_used"].get(group, 0.0))


def _us(group: str) -> Callable[[dict[str, Any]], float]:
    return lambda r: float(r["wrk"]["us_per_request"][group])


def summarize(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The medians of a contender's rounds."""

    def wrk(key: str) -> Callable[[dict[str, Any]], float]:
        return lambda r: float(r["wrk"][key])

    s: dict[str, Any] = {
        "rps": median_of(rounds, wrk("rps")),
        "p50_ms": median_of(rounds, wrk("p50_ms")),
        "p99_ms": median_of(rounds, wrk("p99_ms")),
        "per_core": median_of(rounds, wrk("per_core")),
        "per_core_with_control": median_of(rounds, wrk("per_core_with_control")),
        "cores": {g: median_of(rounds, _cores(g)) for g in (*GROUPS, "machine")},
        "us_per_request": {g: median_of(rounds, _us(g)) for g in ("served", *GROUPS, "machine")},
        "errors": sum(r["wrk"]["non_2xx"] for r in rounds),
        "socket_errors": [r["wrk"]["socket_errors"] for r in rounds if r["wrk"]["socket_errors"]],
        "rps_rounds": [round(r["wrk"]["rps"]) for r in rounds],
    }
    if all("unloaded" in r for r in rounds):
        s["unloaded_p50_ms"] = median_of(rounds, lambda r: float(r["unloaded"]["p50_ms"]))
        s["unloaded_p99_ms"] = median_of(rounds, lambda r: float(r["unloaded"]["p99_ms"]))
    return s


def ratio(
    rounds: dict[str, list[dict[str, Any]]],
    ours: str,
    theirs: str,
    get: Callable[[dict[str, Any]], float],
    *,
    difference: bool = False,
) -> dict[str, Any]:
    """The median over rounds of ours / theirs (or ours - theirs) of `get`, with each round's."""
    each = []
    for a, b in zip(rounds[ours], rounds[theirs], strict=True):
        x, y = get(a), get(b)
        each.append(x - y if difference else x / y)
    return {"median": float(statistics.median(each)), "rounds": each}


# -- the run -------------------------------------------------------------------------------

LABELS = {
    "ours": "ours: our ingress -> our worker (`--ingress-workers 1`, 1 replica)",
    "ours_async": "ours, the function as `async def` (called on the worker's loop)",
    "worker": "our worker alone (direct to the replica's port)",
    "serve": "Ray Serve: its proxy -> `@serve.deployment` (1 replica, access log off)",
    "haproxy_uvicorn": "HAProxy (`nbthread 1`) -> uvicorn (1 process)",
    "uvicorn": "uvicorn alone (1 process)",
    "fastapi_worker": "FastAPI app, our worker (direct to the replica's port)",
    "fastapi_uvicorn": "FastAPI app, `uvicorn serve_fastapi:app` (1 process)",
}


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"contenders": {}, "rounds": {}}
    contenders: list[Contender] = []
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sb", dir="/tmp")))
        serve_stack = stack.enter_context(ExitStack())  # closed before the scale from zero
        if not args.no_serve:
            print("Ray Serve: starting a cluster and the deployment ...", file=sys.stderr)
            (tmp / "ray").mkdir()
            serve_port, serve_groups = serve_stack.enter_context(ray_serve(tmp / "ray"))
        print("our daemon: starting, applying the backends ...", file=sys.stderr)
        ours = stack.enter_context(daemon())
        replicas = ours.replicas()
        (hello_addr, hello_pid), (api_addr, api_pid) = replicas["hello"][0], replicas["api"][0]
        async_pid = replicas["hello_async"][0][1]
        proxy_pids = ours.ingress_pids()
        control = [ours.proc.pid]
        uv_port, uv_api_port, ha_port = free_port(), free_port(), free_port()
        uv_pids = stack.enter_context(
            uvicorn("serve_hello_asgi:app", uv_port, tmp / "uv.log", "--lifespan", "off")
        )
        uv_api_pids = stack.enter_context(uvicorn("serve_fastapi:app", uv_api_port, tmp / "uva"))
        ha_pids = stack.enter_context(c_proxies.haproxy(ha_port, [f"127.0.0.1:{uv_port}"]))
        if ha_pids is None:
            raise SystemExit("haproxy is not installed (apt-get install haproxy)")

        def at(address: str, path: str) -> tuple[str, int, str]:
            host, _, port = address.rpartition(":")
            return host, int(port), path

        here = "127.0.0.1"
        contenders = [
            Contender(
                "ours",
                LABELS["ours"],
                (here, ours.ingress_port, HELLO_PATH),
                {"proxy": proxy_pids, "app": [hello_pid], "control": control},
                "hello",
            ),
            Contender(
                "ours_async",
                LABELS["ours_async"],
                (here, ours.ingress_port, "/hello-async?name=bench"),
                {"proxy": proxy_pids, "app": [async_pid], "control": control},
                "hello",
            ),
            Contender(
                "worker",
                LABELS["worker"],
                at(hello_addr, HELLO_PATH),
                {"app": [hello_pid], "control": control},
                "hello",
            ),
        ]
        if not args.no_serve:
            contenders.append(
                Contender(
                    "serve",
                    LABELS["serve"],
                    (here, serve_port, HELLO_PATH),
                    serve_groups,
                    "hello",
                )
            )
        contenders += [
            Contender(
                "haproxy_uvicorn",
                LABELS["haproxy_uvicorn"],
                (here, ha_port, HELLO_PATH),
                {"proxy": ha_pids, "app": uv_pids},
                "hello",
            ),
            Contender(
                "uvicorn", LABELS["uvicorn"], (here, uv_port, HELLO_PATH), {"app": uv_pids}, "hello"
            ),
            Contender(
                "fastapi_worker",
                LABELS["fastapi_worker"],
                at(api_addr, FASTAPI_PATH),
                {"app": [api_pid], "control": control},
                "fastapi",
                unloaded=False,
            ),
            Contender(
                "fastapi_uvicorn",
                LABELS["fastapi_uvicorn"],
                (here, uv_api_port, FASTAPI_PATH),
                {"app": uv_api_pids},
                "fastapi",
                unloaded=False,
            ),
        ]
        for c in contenders:
            host, port, path = c.target
            wait_answers(f"http://{host}:{port}{path}", times=5)
        # What each CPU group is made of, for the record.
        results["groups"] = {
            c.name: {g: [_title(pid) for pid in pids] for g, pids in c.groups.items()}
            for c in contenders
        }
        rounds: dict[str, list[dict[str, Any]]] = {c.name: [] for c in contenders}
        for r in range(args.rounds):
            print(f"round {r + 1} of {args.rounds}", file=sys.stderr, flush=True)
            for c in contenders:
                m = measure(c, args)
                _say(c, m)
                rounds[c.name].append(m)
        if args.profile:
            results["profiles"] = {
                name: profile(pid, target, args)
                for name, pid, target in (
                    ("worker_hello", hello_pid, at(hello_addr, HELLO_PATH)),
                    ("worker_fastapi", api_pid, at(api_addr, FASTAPI_PATH)),
                )
            }
        serve_stack.close()  # Ray down: the scale from zero on a quieter machine

        print(f"cancellation: {args.cancel_trials} hang-ups ...", file=sys.stderr)
        results["cancellation"] = cancellations(ours.ingress_port, args.cancel_trials)

        print(f"scale from zero: {args.cold_trials} trials a backend ...", file=sys.stderr)
        api_port = int(ours.url.rsplit(":", 1)[1])
        cold: dict[str, list[float]] = {"cold": [], "cold_class": []}
        for _ in range(args.cold_trials):
            for backend, path in (("cold", "/cold"), ("cold_class", "/cold-class")):
                took = autoscale_bench.first_answer(
                    api_port, ours.ingress_port, ours.token, backend, path
                )
                cold[backend].append(took)
        results["scale_from_zero"] = {
            name: autoscale_bench.summary(samples) for name, samples in cold.items()
        }
        for name, samples in cold.items():
            results["scale_from_zero"][name]["trials_ms"] = [round(x * 1000, 1) for x in samples]

    results["contenders"] = {
        c.name: {"label": c.label, "section": c.section, **summarize(rounds[c.name])}
        for c in contenders
    }
    results["rounds"] = rounds
    results["ratios"] = ratios(rounds)
    return results


def cancellations(ingress_port: int, trials: int) -> dict[str, float]:
    """A client hangs up on a request whose handler would sleep 10 s (through the ingress: its
    connection ends, which ends the ingress's to the replica): how long after the client's
    close the handler was cancelled, by CLOCK_MONOTONIC in both processes."""
    took: list[float] = []
    for n in range(1, trials + 1):
        with socket.create_connection(("127.0.0.1", ingress_port)) as sock:
            sock.sendall(b"GET /cancel/sleep HTTP/1.1\r\nHost: bench\r\n\r\n")
            _get(ingress_port, "/cancel/stats?inside=1")  # answers once the handler sleeps
            hung_up = time.monotonic()
        stats = _get(ingress_port, f"/cancel/stats?cancelled={n}")
        took.append(stats["cancelled_at"][n - 1] - hung_up)
    return autoscale_bench.summary(took)


def _get(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as answer:
        return json.loads(answer.read())


def ratios(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    def rps(r: dict[str, Any]) -> float:
        return float(r["wrk"]["rps"])

    def per_core(r: dict[str, Any]) -> float:
        return float(r["wrk"]["per_core"])

    def idle_p50(r: dict[str, Any]) -> float:
        return float(r["unloaded"]["p50_ms"])

    out: dict[str, Any] = {}
    if "serve" in rounds:
        out["rps_ours_over_serve"] = ratio(rounds, "ours", "serve", rps)
        out["per_core_ours_over_serve"] = ratio(rounds, "ours", "serve", per_core)
        out["proxy_us_serve_over_ingress"] = ratio(rounds, "serve", "ours", _us("proxy"))
        out["rps_ours_async_over_serve"] = ratio(rounds, "ours_async", "serve", rps)
    out["per_core_ours_over_haproxy_uvicorn"] = ratio(rounds, "ours", "haproxy_uvicorn", per_core)
    out["rps_ours_over_haproxy_uvicorn"] = ratio(rounds, "ours", "haproxy_uvicorn", rps)
    out["per_core_ours_over_uvicorn"] = ratio(rounds, "ours", "uvicorn", per_core)
    out["added_p50_ms_over_uvicorn"] = ratio(rounds, "ours", "uvicorn", idle_p50, difference=True)
    out["added_p50_ms_haproxy_over_uvicorn"] = ratio(
        rounds, "haproxy_uvicorn", "uvicorn", idle_p50, difference=True
    )
    # The tiers alone: our ingress against HAProxy (CPU a request, the proxy processes only),
    # our worker against uvicorn (the app processes only, under their proxies' load).
    out["proxy_us_ingress_over_haproxy"] = ratio(rounds, "ours", "haproxy_uvicorn", _us("proxy"))
    out["app_us_worker_over_uvicorn"] = ratio(rounds, "ours", "haproxy_uvicorn", _us("app"))
    out["per_core_worker_over_uvicorn"] = ratio(rounds, "worker", "uvicorn", per_core)
    # The same function as `async def`: what the sync function's thread costs.
    out["per_core_ours_async_over_haproxy_uvicorn"] = ratio(
        rounds, "ours_async", "haproxy_uvicorn", per_core
    )
    out["app_us_sync_over_async"] = ratio(rounds, "ours", "ours_async", _us("app"))
    out["per_core_fastapi_worker_over_uvicorn"] = ratio(
        rounds, "fastapi_worker", "fastapi_uvicorn", per_core
    )
    return out


def profile(pid: int, target: tuple[str, int, str], args: argparse.Namespace) -> Any:
    """py-spy over a worker under a closed-loop load (``ingress_bench.profile_ingress``)."""
    print(f"profiling pid {pid} (py-spy) ...", file=sys.stderr)
    spy_args = argparse.Namespace(
        seconds=args.seconds, conns=args.conns, gen_procs=2, warmup=args.warmup
    )
    return ingress_bench.profile_ingress(pid, target, spy_args)


# -- the report ----------------------------------------------------------------------------


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    q = results["ratios"]
    n = results["config"]["rounds"]

    def each(r: dict[str, Any], fmt: str) -> str:
        return " / ".join(format(x, fmt) for x in r["rounds"])

    out: list[dict[str, Any]] = []
    if "rps_ours_over_serve" in q:
        r = q["rps_ours_over_serve"]
        out.append(
            {
                "target": "ours >= 20x Ray Serve's req/s (its proxy)",
                "value": f"{r['median']:.1f}x (rounds: {each(r, '.1f')})",
                "met": r["median"] >= 20,
            }
        )
    r = q["per_core_ours_over_haproxy_uvicorn"]
    out.append(
        {
            "target": "ours >= 0.8x HAProxy + uvicorn's req/s per core (CPU-accounted)",
            "value": f"{r['median']:.2f}x (rounds: {each(r, '.2f')})",
            "met": r["median"] >= 0.8,
        }
    )
    r = q["added_p50_ms_over_uvicorn"]
    out.append(
        {
            "target": "ours: added p50 over uvicorn alone <= 0.3 ms (one connection)",
            "value": f"{r['median']:.3f} ms (rounds: {each(r, '.3f')})",
            "met": r["median"] <= 0.3,
        }
    )
    r = q["per_core_fastapi_worker_over_uvicorn"]
    out.append(
        {
            "target": "a FastAPI app: our worker >= 1x uvicorn's req/s per core",
            "value": f"{r['median']:.2f}x (rounds: {each(r, '.2f')})",
            "met": r["median"] >= 1.0,
        }
    )
    cold = results["scale_from_zero"]["cold"]
    out.append(
        {
            "target": "a function backend's first answer from zero replicas <= 40 ms (median)",
            "value": f"{cold['median_ms']:.1f} ms (p90 {cold['p90_ms']:.1f}, of {cold['n']})",
            "met": cold["median_ms"] <= 40,
        }
    )
    cancel = results.get("cancellation")
    if cancel is not None:
        out.append(
            {
                "target": "a client's hang-up cancels a 10 s handler within 50 ms (median)",
                "value": f"{cancel['median_ms']:.1f} ms (p90 {cancel['p90_ms']:.1f}, max "
                f"{cancel['max_ms']:.1f}, of {cancel['n']})",
                "met": cancel["median_ms"] <= 50,
            }
        )
    for t in out:
        rounds = "zero replicas" not in t["target"] and "hang-up" not in t["target"]
        t["of"] = f"median of {n} alternating rounds" if rounds else ""
    return out


def print_tables(results: dict[str, Any]) -> None:
    cfg = results["config"]
    print(
        f"\nMedians of {cfg['rounds']} alternating rounds; under load: `wrk -t2 -c{cfg['conns']} "
        f"-d{cfg['seconds']:g}s --latency` after a {cfg['warmup']:g} s warm-up; one connection: "
        f"closed loop, {cfg['idle_seconds']:g} s. Cores from /proc over wrk's window.\n"
    )
    for section, title in (("hello", "hello world"), ("fastapi", "FastAPI app")):
        print(
            f"| {title} | req/s | p50 / p99 under load | p50 / p99, one connection "
            "| cores: proxy / app / control / machine "
            "| CPU a request: proxy + app = served (control) | req/s per served core |"
        )
        print("|---|---|---|---|---|---|---|")
        for c in results["contenders"].values():
            if c["section"] != section:
                continue
            cores, us = c["cores"], c["us_per_request"]
            one = (
                f"{c['unloaded_p50_ms']:.3f} / {c['unloaded_p99_ms']:.3f} ms"
                if "unloaded_p50_ms" in c
                else "-"
            )
            print(
                f"| {c['label']} | {c['rps']:,.0f} | {c['p50_ms']:.2f} / {c['p99_ms']:.2f} ms "
                f"| {one} | {cores['proxy']:.2f} / {cores['app']:.2f} / {cores['control']:.2f} "
                f"/ {cores['machine']:.2f} | {us['proxy']:.0f} + {us['app']:.0f} = "
                f"{us['served']:.0f} us ({us['control']:.0f}) | {c['per_core']:,.0f} |"
            )
        print()
    q = results["ratios"]
    print("| ratio (median of rounds) | value | each round |")
    print("|---|---|---|")
    for key, r in q.items():
        print(f"| {key} | {r['median']:.3f} | {' / '.join(f'{x:.3f}' for x in r['rounds'])} |")
    print()
    print("| first answer from zero replicas, through the ingress | median | p90 | min / max |")
    print("|---|---|---|---|")
    for name, label in (
        ("cold", "a function backend (`serve_hello:hello`)"),
        ("cold_class", "the trivial replica class (`ingress_replica:Trivial`, autoscale_bench's)"),
    ):
        f = results["scale_from_zero"][name]
        print(
            f"| {label} | {f['median_ms']:.1f} ms | {f['p90_ms']:.1f} ms | "
            f"{f['min_ms']:.1f} / {f['max_ms']:.1f} ms |"
        )
    cancel = results.get("cancellation")
    if cancel is not None:
        print()
        print("| a client hangs up on a 10 s handler, through the ingress | median | p90 | max |")
        print("|---|---|---|---|")
        print(
            f"| the handler cancelled, after the client's close | {cancel['median_ms']:.1f} ms | "
            f"{cancel['p90_ms']:.1f} ms | {cancel['max_ms']:.1f} ms |"
        )
    print()
    print("| target | figure | met |")
    print("|---|---|---|")
    for t in results["targets"]:
        print(f"| {t['target']} | {t['value']} | {'yes' if t['met'] else '**no**'} |")
    for name, prof in results.get("profiles", {}).items():
        if "own" not in prof:
            continue
        print(f"\npy-spy, {name} ({prof['samples']} samples): own time, top 12")
        for frame, share in prof["own"][:12]:
            print(f"  {share:6.1%}  {frame}")


def _machine() -> dict[str, Any]:
    out: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "loadavg_at_start": os.getloadavg(),
    }
    for module in ("ray", "uvicorn", "fastapi", "starlette", "uvloop", "httptools", "trio"):
        with suppress(ImportError):
            out[module] = __import__(module).__version__
    with suppress(OSError, subprocess.SubprocessError):
        out["haproxy"] = subprocess.run(
            [c_proxies._binary("haproxy") or "haproxy", "-v"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.split("\n", 1)[0]
        out["wrk"] = subprocess.run(
            ["wrk", "-v"], capture_output=True, text=True, timeout=10
        ).stdout.split("\n", 1)[0]
    return out


def main() -> None:
    reaper.leave_nothing()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    # wrk takes whole seconds.
    parser.add_argument("--seconds", type=int, default=5, help="wrk's measured run")
    parser.add_argument("--warmup", type=int, default=1, help="wrk's warm-up run")
    parser.add_argument("--conns", type=int, default=32, help="wrk's connections")
    parser.add_argument("--idle-seconds", type=float, default=1.5, help="one connection")
    parser.add_argument("--cold-trials", type=int, default=10, help="scale from zero")
    parser.add_argument("--cancel-trials", type=int, default=20, help="hang-ups")
    parser.add_argument("--no-serve", action="store_true", help="skip Ray Serve")
    parser.add_argument("--profile", action="store_true", help="py-spy the workers at the end")
    parser.add_argument("--out", type=Path, default=HERE / "serve_results.json")
    args = parser.parse_args()
    if not c_proxies.have_wrk():
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    started = time.monotonic()
    machine = _machine()
    before = ingress_bench._provenance()  # the commit, and whether controller/ differed from it
    results = run(args)
    results["config"] = {k: v for k, v in vars(args).items() if k not in ("out",)}
    results["targets"] = targets(results)
    machine["loadavg_at_end"] = os.getloadavg()
    machine["wall_s"] = round(time.monotonic() - started, 1)
    machine.update(before)
    machine["code_changed_during_run"] = "yes" if before != ingress_bench._provenance() else "no"
    results["machine"] = machine
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print_tables(results)


if __name__ == "__main__":
    main()
