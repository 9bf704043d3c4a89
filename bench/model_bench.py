"""The model benchmark: ``@controller.batch`` and ``@controller.multiplexed`` side by side with
Ray Serve's ``@serve.batch`` and ``@serve.multiplexed``, on the same machine, with the same toy
model and the same replica code (bench/model_app.py; only the decorators differ).

Our side: a daemon (real worker processes, one ingress process, ``--ingress-workers 1``).
Serve's: a local Ray cluster, Serve's HTTP proxy, its access log off (ours logs no requests
either). Both are up for the whole run (the other side idles while one is measured), and
they take turns, phase by phase, so that a slow spell of the machine falls on both.

1. **Batching.** One replica of the toy (``np.tanh(W @ X)``, W 4096 x 4096 float32, run at a
   fixed width of 16 columns: one call costs the same for 1 input as for 16, about 5.7 ms
   here; ``--width plain`` runs ``W @ X`` as it comes, whose cost grows with the batch, see
   bench/model_app.py) with ``batch(max_batch_size=16, batch_wait_timeout_s=0.005)``, and one
   replica of the same toy called once per request; ``max_ongoing_requests = 32`` on every
   replica.
   - *Throughput:* ``wrk -t2 -c32`` (closed loop) for ``--seconds`` after a 1 s warm-up, through
     the proxy (our ingress, Serve's proxy), ``--rounds`` rounds: req/s, wrk's p50/p99, the
     mean batch size over the measured run (the replica's own count of calls and items), the
     replica's own time in the model per call (a machine slowed by a neighbour shows there),
     and the cores each process took; medians of the rounds. The ratio is batched req/s over
     unbatched req/s of the same round, per system; the median of the rounds.
   - *Latency at a fixed offered load:* open loop (a request every 1/rate s whatever the
     answers, each on a connection of its own while others are busy: a new one if need be,
     its connect counted) at one rate for all four, by default 70 % of the slower unbatched
     throughput just measured: p50, p99, max, the mean batch size the answers report.
     Latency runs from the client's send to the whole answer read; the client's own
     lateness against the schedule (its timer's millisecond grain: p99 about 1.5 ms) is in
     the JSON (``client_late_p99_ms``), not in the latency.
2. **Multiplexing.** 8 replicas, each holding at most 4 models, 100 models m0..m99 (a load:
   0.2 s of sleep, then the model's own 256 x 256 matrix), the request's model in its header
   (``x-model-id`` for ours, ``serve_multiplexed_model_id`` for Serve). Open loop at
   ``--mux-rate`` req/s, the model drawn from a Zipf law (P(m_k) proportional to 1/(k+1)^s)
   with the same seeded sequence for both systems. Two mixes, s = 1.1 then s = 2.0, each a
   warm-up (``--mux-warmup``) then a measured window (``--mux-seconds``), on the same replicas
   (the first starts with no model loaded, the second where the first left them). Figures of
   the measured window:
   - *hit rate:* the share of answered requests that found their model held (loaded, not
     evicted, not still loading) by the replica they landed on, as the replica saw it: its
     loader returned the very object it held before the request asked. Beside it the
     **ceiling**: with 32 model slots for 100 models and each model held once, no router can
     do better than H_s(32)/H_s(100) (generalized harmonic numbers);
   - *loads/s:* loads the replicas began in the window (their counters, read off their
     answers: a slight undercount at the window's edges);
   - *p50/p99* of all requests, of hits only, of misses only (a miss waits for a load, 0.2 s
     or more), latency as in 1.; *held elsewhere:* misses whose model another replica
     answered hits for within 1 s both before and after (a sign that routing sent it away
     from a holder).
   - *Single-model baseline:* the same 8 replicas, the same rate, every request naming no
     model: answered by the model each replica built in ``__init__`` and routed as any
     request (no model routing), the same computation as a held model's. The 1.2x target is
     p99(hits in the Zipf mix) over this p99. *Busiest replica's share:* of the answered
     requests (a hot model's requests go to its holder, where the baseline spreads).
   For ours, also the replicas' own counts from ``GET /api/v1/backends/models``
   (``load.models``: hits and misses of the loader, loads, evictions) over the window.

What no figure includes: the replicas' starts and the models' loads before a window
(warm-ups); the control planes' own work but as it shares the machine (each side idles beside
the other); the open-loop client's lateness against its schedule.

    RAY_AUTH_MODE=disabled python bench/model_bench.py [--seconds S] [--no-serve]

Needs ``ray[serve]``, ``numpy`` and ``wrk`` (``nox -s bench`` installs them). BLAS runs one
thread in every replica (``OPENBLAS_NUM_THREADS=1`` for both sides): one replica, one core.
Prints Markdown tables; writes ``bench/model_results.json``. About 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

import c_proxies
import ingress_bench
import reaper
from ingress_bench import free_port, wait_answers

HERE = Path(__file__).resolve().parent

#: The model ids, most popular first.
MODELS = [f"m{k}" for k in range(100)]
REPLICAS = 8
MODEL_SLOTS = REPLICAS * 4

BACKENDS = """
[backends.toy_batched]
entrypoint = "model_app:Batched"
init_kwargs = {{ width = "{width}" }}
route_prefix = "/batched"
num_replicas = 1
version = "v1"
max_ongoing_requests = 32

[backends.toy_plain]
entrypoint = "model_app:Unbatched"
init_kwargs = {{ width = "{width}" }}
route_prefix = "/plain"
num_replicas = 1
version = "v1"
max_ongoing_requests = 32

[backends.models]
entrypoint = "model_app:Models"
route_prefix = "/models"
num_replicas = {replicas}
version = "v1"
max_ongoing_requests = 32
"""

#: The header a request names its model in, per system.
MODEL_HEADER = {"ours": "x-model-id", "serve": "serve_multiplexed_model_id"}
LABEL = {"ours": "ours (controller)", "serve": "Ray Serve"}

# -- the open-loop client (in a process of its own: ``model_bench.py _load SPEC OUT``) -------


class _Conn:
    """One kept-alive HTTP/1.1 connection, answers read by Content-Length or chunks."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.buffer = b""

    async def _more(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            raise ConnectionError("closed by the server")
        self.buffer += data

    async def exchange(self, request: bytes) -> tuple[int, bytes, bool]:
        """Send `request`; its answer's status, body, and whether the connection stays."""
        await self.stream.send_all(request)
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            await self._more()
        head, self.buffer = self.buffer[:end], self.buffer[end + 4 :]
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            fields[name.strip().lower()] = value.strip().lower()
        if b"content-length" in fields:
            length = int(fields[b"content-length"])
            while len(self.buffer) < length:
                await self._more()
            body, self.buffer = self.buffer[:length], self.buffer[length:]
        elif fields.get(b"transfer-encoding") == b"chunked":
            body = b""
            while True:
                while (eol := self.buffer.find(b"\r\n")) < 0:
                    await self._more()
                size = int(self.buffer[:eol].split(b";")[0], 16)
                while len(self.buffer) < eol + 2 + size + 2:
                    await self._more()
                body += self.buffer[eol + 2 : eol + 2 + size]
                self.buffer = self.buffer[eol + 2 + size + 2 :]
                if size == 0:
                    break
        else:
            raise ConnectionError(f"an answer of unknown length: {head[:200]!r}")
        return status, body, fields.get(b"connection") != b"close"


async def _open_loop(spec: dict[str, Any]) -> dict[str, Any]:
    import trio

    host, port, path = spec["host"], spec["port"], spec["path"]
    rate, total = spec["rate"], spec["warmup"] + spec["seconds"]
    models: list[str | None] = spec["models"]
    header = spec["header"]
    count = int(rate * total)
    # Least recently used first: every connection stays busy (an ingress closes a connection
    # that sends nothing for 10 s, a proxy one idle for long).
    idle: collections.deque[_Conn] = collections.deque()
    records: list[list[Any] | None] = [None] * count
    lateness: list[float] = []
    retried = 0

    def request(i: int) -> bytes:
        model = models[i % len(models)] if models else None
        named = f"{header}: {model}\r\n" if model else ""
        return f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{named}\r\n".encode()

    async def connect() -> _Conn:
        return _Conn(await trio.open_tcp_stream(host, port))  # TCP_NODELAY set

    for _ in range(spec["conns"]):
        idle.append(await connect())
    # The parent's instant (time.monotonic()) on trio's clock.
    start = trio.current_time() + spec["start"] - time.monotonic()

    async def one(i: int, due: float) -> None:
        nonlocal retried
        began = trio.current_time()
        lateness.append(began - due)
        conn = idle.popleft() if idle else await connect()
        keep = False
        try:
            try:
                status, body, keep = await conn.exchange(request(i))
            except (ConnectionError, trio.BrokenResourceError):
                if conn.buffer:
                    raise
                # A kept connection the server closed meanwhile: once more on a new one, as
                # any HTTP client does for a GET.
                retried += 1
                await conn.stream.aclose()
                conn = await connect()
                status, body, keep = await conn.exchange(request(i))
            done = trio.current_time()
            answer = json.loads(body) if status == 200 else {}
            records[i] = [
                due - start,
                done - began,
                status,
                answer.get("hit"),
                answer.get("replica"),
                answer.get("loads"),
                answer.get("batch"),
                models[i % len(models)] if models else None,
            ]
        except (OSError, ConnectionError, ValueError, trio.BrokenResourceError) as exc:
            records[i] = [due - start, trio.current_time() - began, 0, None, None, None, None, None]
            print(f"open loop: request {i}: {exc!r}", file=sys.stderr)
        finally:
            if keep:
                idle.append(conn)
            else:
                await conn.stream.aclose()

    with trio.move_on_at(start + total + spec["drain_s"]):
        async with trio.open_nursery() as nursery:
            for i in range(count):
                due = start + i / rate
                await trio.sleep_until(due)
                nursery.start_soon(one, i, due)
    for conn in idle:
        await conn.stream.aclose()
    lateness.sort()
    return {
        "records": [r for r in records if r is not None],
        "unanswered": sum(r is None for r in records),
        "retried_on_new_connection": retried,
        "late_p99_ms": ingress_bench.pct(lateness, 0.99) * 1000 if lateness else 0.0,
        "late_max_ms": lateness[-1] * 1000 if lateness else 0.0,
    }


def _load_main(argv: Sequence[str]) -> None:
    import trio

    spec = json.loads(Path(argv[0]).read_text())
    Path(argv[1]).write_text(json.dumps(trio.run(_open_loop, spec)))


def open_loop(
    port: int,
    path: str,
    *,
    rate: float,
    warmup: float,
    seconds: float,
    header: str = "",
    models: Sequence[str | None] = (),
    conns: int = 32,
    during: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run the open-loop client in a process of its own: each request's record
    ``[due_s, latency_s, status, hit, replica, loads, batch, model]``, due_s from its start,
    latency_s from its send. `during` is called when the measured window begins."""
    with tempfile.TemporaryDirectory(prefix="mbl", dir="/tmp") as tmp:
        spec_path, out = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        start = time.monotonic() + 1.0  # time for the client to start and connect
        spec = {
            "host": "127.0.0.1",
            "port": port,
            "path": path,
            "rate": rate,
            "start": start,
            "warmup": warmup,
            "seconds": seconds,
            "header": header,
            "models": list(models),
            "conns": conns,
            "drain_s": 20.0,
        }
        spec_path.write_text(json.dumps(spec))
        child = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "_load", str(spec_path), str(out)]
        )
        try:
            if during is not None:
                time.sleep(max(0.0, start + warmup - time.monotonic()))
                during()
            child.wait(timeout=warmup + seconds + 60)
        finally:
            ingress_bench.stop(child)
        if child.returncode:
            raise RuntimeError(f"the open-loop client failed on {path} ({child.returncode})")
        result: dict[str, Any] = json.loads(out.read_text())
    result["window"] = (warmup, warmup + seconds)
    return result


def ms(samples: Sequence[float], q: float) -> float | None:
    return round(ingress_bench.pct(sorted(samples), q) * 1000, 2) if samples else None


def window_records(run: dict[str, Any]) -> list[list[Any]]:
    lo, hi = run["window"]
    return [r for r in run["records"] if lo <= r[0] < hi]


def latency_figures(run: dict[str, Any], seconds: float) -> dict[str, Any]:
    records = window_records(run)
    ok = [r for r in records if r[2] == 200]
    latencies = [r[1] for r in ok]
    batches = [r[6] for r in ok if r[6] is not None]
    per_replica = collections.Counter(r[4] for r in ok if r[4] is not None)
    return {
        "offered_rps": round(len(records) / seconds, 1),
        "answered_rps": round(len(ok) / seconds, 1),
        "requests": len(records),
        "errors": len(records) - len(ok) + run["unanswered"],
        "p50_ms": ms(latencies, 0.5),
        "p90_ms": ms(latencies, 0.9),
        "p99_ms": ms(latencies, 0.99),
        "max_ms": round(max(latencies) * 1000, 2) if latencies else None,
        "mean_batch": round(statistics.fmean(batches), 2) if batches else None,
        "busiest_replica_share": (
            round(max(per_replica.values()) / len(ok), 3) if per_replica else None
        ),
        "client_late_p99_ms": round(run["late_p99_ms"], 2),
        "client_late_max_ms": round(run["late_max_ms"], 2),
        "client_retries": run["retried_on_new_connection"],
    }


# -- batching ------------------------------------------------------------------------------


def _get_json(port: int, path: str, headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def closed_loop(
    port: int, path: str, groups: dict[str, list[int]], args: argparse.Namespace
) -> dict[str, Any]:
    """wrk for `args.seconds` after a 1 s warm-up, with the replica's calls and items over the
    measured run and the cores each group took."""
    url = f"http://127.0.0.1:{port}{path}"
    tick = os.sysconf("SC_CLK_TCK")
    c_proxies.wrk(url, conns=args.conns, threads=2, seconds=1)
    stats0 = _get_json(port, f"{path}/stats")
    before = {g: sum(ingress_bench._ticks(p) for p in pids) for g, pids in groups.items()}
    busy0, t0 = ingress_bench._busy_ticks(), time.monotonic()
    figures = c_proxies.wrk(url, conns=args.conns, threads=2, seconds=args.seconds)
    window = time.monotonic() - t0
    after = {g: sum(ingress_bench._ticks(p) for p in pids) for g, pids in groups.items()}
    busy1 = ingress_bench._busy_ticks()
    stats1 = _get_json(port, f"{path}/stats")
    calls = stats1["calls"] - stats0["calls"]
    figures["mean_batch"] = round((stats1["items"] - stats0["items"]) / max(1, calls), 2)
    figures["model_calls"] = calls
    figures["model_ms_per_call"] = round(
        (stats1["model_s"] - stats0["model_s"]) / max(1, calls) * 1000, 3
    )
    figures["replica_blas_threads"] = stats1.get("blas_threads")
    cores = {g: round((after[g] - before[g]) / tick / window, 2) for g in groups}
    cores["machine"] = round((busy1 - busy0) / tick / window, 2)
    figures["cores"] = cores
    return figures


def _median_figures(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A contender's wrk rounds as one: the median of each figure, and the rounds' req/s."""

    def med(values: list[Any]) -> float | None:
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 3) if values else None

    keys = ("rps", "p50_ms", "p99_ms", "mean_batch", "model_ms_per_call")
    out: dict[str, Any] = {k: med([r.get(k) for r in rounds]) for k in keys}
    out["cores"] = {g: med([r["cores"][g] for r in rounds]) for g in rounds[0]["cores"]}
    out["rps_rounds"] = [round(r["rps"]) for r in rounds]
    out["non_2xx"] = sum(r["non_2xx"] for r in rounds)
    out["replica_blas_threads"] = rounds[-1].get("replica_blas_threads")
    out["rounds"] = rounds
    return out


def batching(
    sides: dict[str, tuple[int, dict[str, dict[str, list[int]]]]], args: argparse.Namespace
) -> dict[str, Any]:
    """The systems take turns (ours, then Serve, unbatched then batched, round after round),
    so that a slow spell of the machine falls on both."""
    out: dict[str, Any] = {"closed_loop": {}, "fixed_rate": {}}
    rounds: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in range(args.rounds):
        for path in ("/plain", "/batched"):
            for side, (port, groups) in sides.items():
                print(
                    f"batching, round {r + 1}, {side} {path}: wrk -c{args.conns} ...",
                    file=sys.stderr,
                    flush=True,
                )
                figures = closed_loop(port, path, groups[path], args)
                rounds[f"{side}{path}"].append(figures)
                print(
                    f"  {figures['rps']:,.0f} req/s, p50 {figures['p50_ms']} ms, p99 "
                    f"{figures['p99_ms']} ms, mean batch {figures['mean_batch']}, model "
                    f"{figures['model_ms_per_call']} ms a call, cores {figures['cores']}",
                    file=sys.stderr,
                    flush=True,
                )
    out["closed_loop"] = {key: _median_figures(value) for key, value in rounds.items()}
    # Each round's ratio (its two runs a few seconds apart), then their median.
    out["ratio_rounds"] = {
        side: [
            round(b["rps"] / p["rps"], 2)
            for b, p in zip(rounds[f"{side}/batched"], rounds[f"{side}/plain"], strict=True)
        ]
        for side in sides
    }
    out["ratio"] = {
        side: round(statistics.median(values), 2) for side, values in out["ratio_rounds"].items()
    }
    closed = out["closed_loop"]
    slowest = min(closed[f"{side}/plain"]["rps"] for side in sides)
    rate = args.fixed_rate or round(slowest * args.fixed_share)
    out["fixed_rate_rps"] = rate
    for path in ("/plain", "/batched"):
        for side, (port, _) in sides.items():
            print(f"batching, {side} {path}: open loop at {rate} req/s ...", file=sys.stderr)
            run = open_loop(
                port, path, rate=rate, warmup=args.fixed_warmup, seconds=args.fixed_seconds
            )
            figures = latency_figures(run, args.fixed_seconds)
            out["fixed_rate"][f"{side}{path}"] = figures
            print(f"  {figures}", file=sys.stderr, flush=True)
    return out


# -- multiplexing --------------------------------------------------------------------------


def harmonic(n: int, s: float) -> float:
    return math.fsum(1.0 / k**s for k in range(1, n + 1))


def ceiling(s: float) -> float:
    """The best hit rate with MODEL_SLOTS slots, each model held once: the top models' share."""
    return harmonic(MODEL_SLOTS, s) / harmonic(len(MODELS), s)


def zipf_sequence(count: int, s: float, seed: int) -> list[str | None]:
    weights = [1 / (k + 1) ** s for k in range(len(MODELS))]
    return list(random.Random(seed).choices(MODELS, weights=weights, k=count))


def backend_models(daemon: ingress_bench.Daemon) -> dict[str, int]:
    """Our replicas' own counts (``load.models``), summed over the backend's replicas."""
    status, body = ingress_bench.get(f"{daemon.url}/api/v1/backends/models", daemon.token)
    assert status == 200, body
    load = json.loads(body).get("load") or {}
    totals: dict[str, int] = defaultdict(int)
    for replica in (load.get("models") or {}).values():
        for key in ("hits", "misses", "loads", "evictions"):
            totals[key] += int(replica.get(key, 0))
    return dict(totals)


def mix_figures(run: dict[str, Any], seconds: float) -> dict[str, Any]:
    records = window_records(run)
    ok = [r for r in records if r[2] == 200]
    hits = [r for r in ok if r[3]]
    misses = [r for r in ok if not r[3]]
    # Loads the replicas began in the window: each replica's counter, first to last answer.
    counters: dict[int, list[int]] = defaultdict(list)
    for r in sorted(ok, key=lambda r: r[0] + r[1]):
        counters[r[4]].append(r[5])
    loads = sum(c[-1] - c[0] for c in counters.values())
    # Misses whose model another replica held (answered hits for) within 1 s either side.
    hit_times: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for r in run["records"]:
        if r[2] == 200 and r[3]:
            hit_times[r[7]].append((r[0] + r[1], r[4]))
    elsewhere = 0
    for r in misses:
        when, replica = r[0], r[4]
        others = [(t, p) for t, p in hit_times.get(r[7], ()) if p != replica]
        held_by = {p for t, p in others if when - 1 <= t < when} & {
            p for t, p in others if when < t <= when + 1
        }
        elsewhere += bool(held_by)
    replicas_of: dict[str, set[int]] = defaultdict(set)
    for r in ok:
        replicas_of[r[7]].add(r[4])
    per_replica = collections.Counter(r[4] for r in ok)
    return {
        "requests": len(records),
        "errors": len(records) - len(ok) + run["unanswered"],
        "hit_rate": round(len(hits) / len(ok), 4) if ok else None,
        "hits": len(hits),
        "misses": len(misses),
        "misses_held_elsewhere": elsewhere,
        "loads": loads,
        "loads_per_s": round(loads / seconds, 2),
        "p50_ms": ms([r[1] for r in ok], 0.5),
        "p99_ms": ms([r[1] for r in ok], 0.99),
        "hit_p50_ms": ms([r[1] for r in hits], 0.5),
        "hit_p99_ms": ms([r[1] for r in hits], 0.99),
        "miss_p50_ms": ms([r[1] for r in misses], 0.5),
        "miss_p99_ms": ms([r[1] for r in misses], 0.99),
        "models_seen": len(replicas_of),
        "replicas_per_model_top5": [len(replicas_of[m]) for m in MODELS[:5]],
        "busiest_replica_share": round(max(per_replica.values()) / len(ok), 3) if ok else None,
        "client_late_p99_ms": round(run["late_p99_ms"], 2),
        "client_retries": run["retried_on_new_connection"],
    }


class CpuWindow:
    """The cores each group of processes (and the machine) took between `begin` and `end`."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.groups = groups
        self.ticks: dict[str, int] = {}
        self.began = 0.0

    def _read(self) -> dict[str, int]:
        out = {g: sum(ingress_bench._ticks(p) for p in pids) for g, pids in self.groups.items()}
        out["machine"] = ingress_bench._busy_ticks()
        return out

    def begin(self) -> None:
        self.ticks, self.began = self._read(), time.monotonic()

    def end(self) -> dict[str, float]:
        after, window = self._read(), time.monotonic() - self.began
        tick = os.sysconf("SC_CLK_TCK")
        return {g: round((after[g] - self.ticks[g]) / tick / window, 3) for g in after}


def multiplexing(
    sides: dict[str, tuple[int, dict[str, list[int]]]],
    args: argparse.Namespace,
    daemon: ingress_bench.Daemon | None,
) -> dict[str, Any]:
    """The baseline, then each mix, the systems taking turns (each side's replicas keep what
    they hold while the other side runs)."""
    out: dict[str, Any] = {side: {} for side in sides}
    rate = args.mux_rate
    for side, (port, groups) in sides.items():
        print(f"multiplexing, {side}: single model at {rate} req/s ...", file=sys.stderr)
        cpu = CpuWindow(groups)
        single = open_loop(
            port,
            "/models",
            rate=rate,
            warmup=args.single_warmup,
            seconds=args.single_seconds,
            during=cpu.begin,
        )
        out[side]["single"] = latency_figures(single, args.single_seconds)
        out[side]["single"]["cores"] = cpu.end()
        print(f"  {out[side]['single']}", file=sys.stderr, flush=True)
    total = args.mux_warmup + args.mux_seconds
    for s in args.zipf:
        sequence = zipf_sequence(int(rate * total) + 1, s, seed=int(s * 1000))
        for side, (port, groups) in sides.items():
            print(f"multiplexing, {side}: Zipf s={s:g} at {rate} req/s ...", file=sys.stderr)
            ours = daemon if side == "ours" else None
            counts: dict[str, int] = {}
            cpu = CpuWindow(groups)

            def window_begins(
                counts: dict[str, int] = counts,
                ours: ingress_bench.Daemon | None = ours,
                cpu: CpuWindow = cpu,
            ) -> None:
                cpu.begin()
                if ours is not None:  # our replicas' own counts, read at the window's edges
                    counts.update(backend_models(ours))

            run = open_loop(
                port,
                "/models",
                rate=rate,
                warmup=args.mux_warmup,
                seconds=args.mux_seconds,
                header=MODEL_HEADER[side],
                models=sequence,
                during=window_begins,
            )
            cores = cpu.end()
            figures = mix_figures(run, args.mux_seconds)
            figures["cores"] = cores
            figures["s"] = s
            figures["ceiling"] = round(ceiling(s), 4)
            if ours is not None:
                time.sleep(0.3)  # the replicas' last load reports (at most 10 a second)
                end_counts = backend_models(ours)
                figures["replicas_own_counts"] = {
                    k: end_counts[k] - counts.get(k, 0) for k in end_counts
                }
            out[side][f"zipf_{s:g}"] = figures
            print(f"  {figures}", file=sys.stderr, flush=True)
    return out


# -- the two sides -------------------------------------------------------------------------


@contextmanager
def serve_side(tmp: Path, width: str) -> Iterator[tuple[int, dict[str, dict[str, list[int]]]]]:
    """A local Ray cluster, Serve's proxy, and the three apps: the port, and the CPU groups of
    each toy path (its proxy, its replica)."""
    import model_app
    from ray import serve

    port = free_port()
    logging_config = {"enable_access_log": False}
    before = set(reaper.descendants(os.getpid()))
    with ingress_bench.ray_cluster(tmp):
        serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config=logging_config)
        try:
            apps = model_app.serve_apps(width, REPLICAS)
            for name, app in apps.items():
                serve.run(app, name=name, route_prefix=f"/{name}", logging_config=logging_config)
            for name in apps:
                wait_answers(f"http://127.0.0.1:{port}/{name}", timeout_s=60, times=3)
            proxy = ingress_bench.ray_pids("ray::ProxyActor")
            groups = {
                f"/{name}": {
                    "proxy": proxy,
                    "replica": ingress_bench.ray_pids(f"ray::ServeReplica:{name}:"),
                }
                for name in ("plain", "batched")
            }
            models = ingress_bench.ray_pids("ray::ServeReplica:models:")
            ray_side = set(reaper.descendants(os.getpid())) - before
            groups["/models"] = {
                "proxy": proxy,
                "replicas": models,
                # Serve's controller, the GCS, the raylet, the toy replicas (idle)...
                "control": sorted(ray_side - set(proxy) - set(models)),
            }
            yield port, groups
        finally:
            serve.shutdown()  # type: ignore[no-untyped-call]


def idle_cores(seconds: float = 2.0) -> float:
    """The machine's busy cores with no load offered (both sides up)."""
    tick = os.sysconf("SC_CLK_TCK")
    busy0, t0 = ingress_bench._busy_ticks(), time.monotonic()
    time.sleep(seconds)
    return round((ingress_bench._busy_ticks() - busy0) / tick / (time.monotonic() - t0), 3)


def ours_side(stack: ExitStack, args: argparse.Namespace) -> tuple[Any, ingress_bench.Daemon]:
    """Our daemon with the three backends: the port and CPU groups as `serve_side`'s, and the
    daemon."""
    print("our daemon: starting, applying the backends ...", file=sys.stderr, flush=True)
    manifest = BACKENDS.format(width=args.width, replicas=REPLICAS)
    ours = stack.enter_context(ingress_bench.daemon_with(manifest, "mbd"))
    port = ours.ingress_port
    for path in ("/plain", "/batched", "/models"):
        wait_answers(f"http://127.0.0.1:{port}{path}", timeout_s=60, times=3)
    replicas = ours.replicas()
    proxy = ours.ingress_pids()
    groups = {
        "/plain": {"proxy": proxy, "replica": [replicas["toy_plain"][0][1]]},
        "/batched": {"proxy": proxy, "replica": [replicas["toy_batched"][0][1]]},
        "/models": {
            "proxy": proxy,
            "replicas": [pid for _, pid in replicas["models"]],
            "control": [ours.proc.pid],  # the daemon
        },
    }
    return (port, groups), ours


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    sides: dict[str, tuple[int, dict[str, dict[str, list[int]]]]] = {}
    ours: ingress_bench.Daemon | None = None
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mb", dir="/tmp")))
        if not args.no_ours:
            sides["ours"], ours = ours_side(stack, args)
        if not args.no_serve:
            print("Ray Serve: starting a cluster and the apps ...", file=sys.stderr, flush=True)
            (tmp / "ray").mkdir()
            sides["serve"] = stack.enter_context(serve_side(tmp / "ray", args.width))
        results["idle_cores"] = idle_cores()
        if "batching" in args.parts:
            results["batching"] = batching(sides, args)
        if "multiplexing" in args.parts:
            mux = {side: (port, groups["/models"]) for side, (port, groups) in sides.items()}
            results["multiplexing"] = multiplexing(mux, args, ours)
    results["targets"] = targets(results)
    return results


# -- reporting -----------------------------------------------------------------------------


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for side, ratio in results.get("batching", {}).get("ratio", {}).items():
        out.append(
            {
                "target": f"{LABEL[side]}: batched / unbatched throughput >= 5x",
                "value": f"{ratio:.2f}x",
                "met": ratio >= 5,
            }
        )
    for side, mux in results.get("multiplexing", {}).items():
        single_p99 = mux["single"]["p99_ms"]
        for key, mix in mux.items():
            if not key.startswith("zipf_"):
                continue
            out.append(
                {
                    "target": f"{LABEL[side]}, Zipf s={mix['s']:g}: hit rate >= 95 %",
                    "value": f"{mix['hit_rate']:.1%} (ceiling {mix['ceiling']:.1%})",
                    "met": mix["hit_rate"] >= 0.95,
                }
            )
            ratio = mix["hit_p99_ms"] / single_p99
            out.append(
                {
                    "target": f"{LABEL[side]}, Zipf s={mix['s']:g}: p99 of held-model requests "
                    "<= 1.2x the single-model backend's",
                    "value": f"{ratio:.2f}x ({mix['hit_p99_ms']:.1f} / {single_p99:.1f} ms)",
                    "met": ratio <= 1.2,
                }
            )
    return out


def _f(value: float | None, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def print_tables(results: dict[str, Any]) -> None:
    if "batching" in results:
        print_batching(results["batching"], results["config"])
    if "multiplexing" in results:
        print_multiplexing(results["multiplexing"], results["config"])
    print()
    print("| target | figure | met |")
    print("|---|---|---|")
    for t in results["targets"]:
        print(f"| {t['target']} | {t['value']} | {'yes' if t['met'] else '**no**'} |")


def print_batching(b: dict[str, Any], cfg: dict[str, Any]) -> None:
    print(
        f"\n## Batching: one replica, the toy ({cfg['width']} width), max_batch_size 16, "
        f"batch_wait_timeout_s 0.005, max_ongoing_requests 32\n"
    )
    print(
        f"Throughput: `wrk -t2 -c{cfg['conns']} -d{cfg['seconds']}s` after a 1 s warm-up, "
        f"through the proxy, {cfg['rounds']} rounds taking turns; medians. Mean batch: the "
        "replica's items over its model calls in the measured run; model: the replica's time "
        "in the toy's call (its own clock), per call. Cores: from /proc over the run.\n"
    )
    print(
        "| contender | req/s (each round) | p50 / p99 (wrk) | mean batch | model, a call "
        "| cores: proxy / replica / machine |"
    )
    print("|---|---|---|---|---|---|")
    for key, f in b["closed_loop"].items():
        side, path = key.split("/", 1)
        c = f["cores"]
        print(
            f"| {LABEL[side]}, {'batched' if path == 'batched' else 'one call a request'} "
            f"| {f['rps']:,.0f} ({' / '.join(f'{x:,}' for x in f['rps_rounds'])}) "
            f"| {_f(f['p50_ms'], '.2f')} / {_f(f['p99_ms'], '.2f')} ms "
            f"| {_f(f['mean_batch'], '.2f')} | {_f(f['model_ms_per_call'], '.2f')} ms "
            f"| {_f(c['proxy'], '.2f')} / {_f(c['replica'], '.2f')} / {_f(c['machine'], '.2f')} |"
        )
    print()
    print("| system | batched / unbatched req/s (median of rounds) | each round |")
    print("|---|---|---|")
    for side, ratio in b["ratio"].items():
        rounds = " / ".join(f"{x:.2f}x" for x in b["ratio_rounds"][side])
        print(f"| {LABEL[side]} | {ratio:.2f}x | {rounds} |")
    print(
        f"\nOpen loop at {b['fixed_rate_rps']} req/s ({cfg['fixed_warmup']:g} s warm-up, "
        f"{cfg['fixed_seconds']:g} s measured); latency from the client's send to the whole "
        "answer.\n"
    )
    print("| contender | answered req/s | p50 | p99 | max | mean batch | errors |")
    print("|---|---|---|---|---|---|---|")
    for key, f in b["fixed_rate"].items():
        side, path = key.split("/", 1)
        print(
            f"| {LABEL[side]}, {'batched' if path == 'batched' else 'one call a request'} "
            f"| {f['answered_rps']:.0f} | {_f(f['p50_ms'], '.2f')} ms | {_f(f['p99_ms'], '.2f')} "
            f"ms | {_f(f['max_ms'], '.1f')} ms | {_f(f['mean_batch'], '.2f')} | {f['errors']} |"
        )


def print_multiplexing(mux_results: dict[str, Any], cfg: dict[str, Any]) -> None:
    print(
        f"\n## Multiplexing: {REPLICAS} replicas x 4 models, 100 models (a load: 0.2 s), open "
        f"loop at {cfg['mux_rate']:g} req/s, {cfg['mux_warmup']:g} s warm-up then "
        f"{cfg['mux_seconds']:g} s measured per mix\n"
    )
    print(
        "Hit: the replica the request landed on held its model (loaded, not evicted) when the "
        "request asked, by the replica's own account. Ceiling: H_s(32)/H_s(100), the best any "
        "placement of one copy per model does. Latency from the client's send to the whole "
        "answer. Held elsewhere: misses whose model another replica answered hits for within "
        "1 s before and after. Baseline: the same replicas and rate, no model named (each "
        "replica's own model, routed as any request).\n"
    )
    print(
        "| system | mix | hit rate (ceiling) | loads/s | p50 / p99 all | p50 / p99 hits "
        "| p50 / p99 misses | misses held elsewhere | replicas serving m0..m4 "
        "| busiest replica's share | errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for side, mux in mux_results.items():
        single = mux["single"]
        print(
            f"| {LABEL[side]} | one model, no model routing (baseline) | - | 0 "
            f"| {_f(single['p50_ms'], '.2f')} / {_f(single['p99_ms'], '.2f')} ms | - | - | - | - "
            f"| {_f(single['busiest_replica_share'], '.1%')} | {single['errors']} |"
        )
        for key, m in mux.items():
            if not key.startswith("zipf_"):
                continue
            print(
                f"| {LABEL[side]} | Zipf s={m['s']:g} | {m['hit_rate']:.1%} ({m['ceiling']:.1%}) "
                f"| {m['loads_per_s']:.2f} | {_f(m['p50_ms'], '.2f')} / {_f(m['p99_ms'], '.2f')} "
                f"ms | {_f(m['hit_p50_ms'], '.2f')} / {_f(m['hit_p99_ms'], '.2f')} ms "
                f"| {_f(m['miss_p50_ms'], '.0f')} / {_f(m['miss_p99_ms'], '.0f')} ms "
                f"| {m['misses_held_elsewhere']} of {m['misses']} "
                f"| {', '.join(str(n) for n in m['replicas_per_model_top5'])} "
                f"| {_f(m['busiest_replica_share'], '.1%')} | {m['errors']} |"
            )
    print(
        "\nCores over each measured window (from /proc): the proxy (our ingress process, Serve's "
        "proxy), the 8 replicas, the control plane (our daemon; Serve's controller, the GCS, "
        "the raylet and the rest of the cluster), and the whole machine (the client too).\n"
    )
    print("| system | mix | proxy | replicas | control | machine |")
    print("|---|---|---|---|---|---|")
    for side, mux in mux_results.items():
        for key, m in mux.items():
            c = m.get("cores", {})
            mix = "baseline" if key == "single" else key.replace("zipf_", "Zipf s=")
            print(
                f"| {LABEL[side]} | {mix} | {_f(c.get('proxy'), '.2f')} "
                f"| {_f(c.get('replicas'), '.2f')} | {_f(c.get('control'), '.2f')} "
                f"| {_f(c.get('machine'), '.2f')} |"
            )
    ours = mux_results.get("ours", {})
    own = {k: m["replicas_own_counts"] for k, m in ours.items() if "replicas_own_counts" in m}
    if own:
        print(
            "\nOur replicas' own counts over each measured window (`GET /api/v1/backends/models`, "
            "`load.models`, summed; a miss there is a loader call that waited for a load):\n"
        )
        print("| mix | hits | misses | hit rate | loads | evictions |")
        print("|---|---|---|---|---|---|")
        for key, c in own.items():
            lookups = c.get("hits", 0) + c.get("misses", 0)
            rate = f"{c.get('hits', 0) / lookups:.1%}" if lookups else "-"
            print(
                f"| {key.replace('zipf_', 'Zipf s=')} | {c.get('hits', 0)} | {c.get('misses', 0)} "
                f"| {rate} | {c.get('loads', 0)} | {c.get('evictions', 0)} |"
            )


def _machine() -> dict[str, Any]:
    out: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "loadavg_at_start": os.getloadavg(),
    }
    for module in ("ray", "numpy", "trio"):
        with suppress(ImportError):
            out[module] = __import__(module).__version__
    return out


def main() -> None:
    reaper.leave_nothing()
    if len(sys.argv) > 1 and sys.argv[1] == "_load":
        _load_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="wrk rounds, taking turns")
    parser.add_argument("--seconds", type=int, default=6, help="wrk's measured run (whole s)")
    parser.add_argument("--conns", type=int, default=32, help="wrk's connections")
    parser.add_argument(
        "--width",
        choices=("fixed", "plain"),
        default="fixed",
        help="the toy at a fixed width of 16 (default), or W @ X as it comes",
    )
    parser.add_argument("--fixed-rate", type=float, default=0, help="req/s (0: --fixed-share)")
    parser.add_argument(
        "--fixed-share", type=float, default=0.7, help="of the slower unbatched throughput"
    )
    parser.add_argument("--fixed-warmup", type=float, default=2.0)
    parser.add_argument("--fixed-seconds", type=float, default=8.0)
    parser.add_argument("--mux-rate", type=float, default=150.0, help="req/s, every mix")
    parser.add_argument("--mux-warmup", type=float, default=10.0)
    parser.add_argument("--mux-seconds", type=float, default=25.0)
    parser.add_argument("--single-warmup", type=float, default=3.0)
    parser.add_argument("--single-seconds", type=float, default=15.0)
    parser.add_argument("--zipf", type=float, nargs="+", default=[1.1, 2.0], help="exponents")
    parser.add_argument("--no-serve", action="store_true", help="skip Ray Serve")
    parser.add_argument("--no-ours", action="store_true", help="skip our daemon")
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=("batching", "multiplexing"),
        default=["batching", "multiplexing"],
    )
    parser.add_argument("--out", type=Path, default=HERE / "model_results.json")
    args = parser.parse_args()
    if not c_proxies.have_wrk():
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    # One BLAS thread in every replica, ours and Serve's (they inherit it): one replica, one
    # core, whatever the BLAS build would pick.
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    started = time.monotonic()
    machine = _machine()
    before = ingress_bench._provenance()
    results = run(args)
    results["config"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    results["ceilings"] = {f"{s:g}": round(ceiling(s), 4) for s in args.zipf}
    machine["loadavg_at_end"] = os.getloadavg()
    machine["wall_s"] = round(time.monotonic() - started, 1)
    machine.update(before)
    machine["code_changed_during_run"] = "yes" if before != ingress_bench._provenance() else "no"
    results["machine"] = machine
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print_tables(results)
    print(f"\n{machine['wall_s']:.0f} s in all", file=sys.stderr)


if __name__ == "__main__":
    main()
