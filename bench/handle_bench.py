"""The handle benchmark: what one call from a replica to another costs, ours against a direct
HTTP call and against Ray Serve's ``DeploymentHandle`` on the same machine (issue 47).

1. **A hop inside a replica.** Front makes N calls of ``Back.echo("ok")`` one after another,
   each timed in the replica (``time.perf_counter``): through a handle
   (``controller.worker.handle("hop_back").echo``), and the same request written by hand on
   one kept connection to Back's replica (no routing: HTTP's own cost, the floor). The
   handle's added p50 is the difference. Serve's: ``await self.back.echo.remote("ok")`` in its
   Front deployment, timed the same way.
2. **A hop end to end.** One connection, closed loop, through the ingress (Serve's proxy):
   ``/front/zero`` (Front answers at once) against ``/front/hop`` (Front calls Back once): the
   p50 and p99 a hop adds to a client's request.
3. **Throughput per core.** ``wrk`` on ``/front/hop`` and ``/front/zero``, with the CPU of
   each process: a handle hop costs the CPU the ``hop`` requests take beyond ``zero``'s (the
   caller's side in Front, and Back). Beside it, the ingress's own hop: ``wrk`` on ``/back``
   (the ingress, then Back). Per core: hops a second over the cores they take.
4. **A deadline down a chain.** A -> B -> C by handles, C sleeping 10 s, the client asking
   for 100 ms (``x-request-timeout-ms``): from the request's sending to the last of the three
   links ending (each records CLOCK_MONOTONIC in its ``finally``).

Our side: a daemon (real worker processes, one ingress process). Serve's: a local Ray cluster.

    RAY_AUTH_MODE=disabled python bench/handle_bench.py [--rounds N] [--calls N] [--no-serve]

Needs ``ray[serve]`` and ``wrk`` (``nox -s bench`` installs them). Prints Markdown tables;
writes ``bench/handle_results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

import autoscale_bench
import ingress_bench
from ingress_bench import free_port, wait_answers

HERE = Path(__file__).resolve().parent

BACKENDS = """
[backends.hop_back]
entrypoint = "hop_app:Back"
route_prefix = "/back"
num_replicas = 1
version = "v1"

[backends.hop_front]
entrypoint = "hop_app:Front"
route_prefix = "/front"
num_replicas = 1
version = "v1"

"""


#: A -> B -> C by handles, for the deadline figure (each replica a tenth of a CPU: on Ray, beside
#: Serve's deployments in a cluster of 4).
CHAIN = """
[backends.chain_a]
entrypoint = "hop_app:Link"
init_kwargs = { then = "chain_b" }
route_prefix = "/chain"
version = "v1"
resources = { CPU = 0.1 }

[backends.chain_b]
entrypoint = "hop_app:Link"
init_kwargs = { then = "chain_c" }
route_prefix = "/chain-b"
version = "v1"
resources = { CPU = 0.1 }

[backends.chain_c]
entrypoint = "hop_app:Link"
route_prefix = "/chain-c"
version = "v1"
resources = { CPU = 0.1 }
"""


def daemon() -> AbstractContextManager[ingress_bench.Daemon]:
    return ingress_bench.daemon_with(BACKENDS + CHAIN, "hbd")


def ray_deadline_chain(trials: int) -> dict[str, Any]:
    """The deadline figure with the chain's replicas as Ray actors: a daemon on the cluster this
    process started (for Serve), its own ingress process."""
    import ray

    address = ray.get_runtime_context().gcs_address
    state_dir = Path(tempfile.mkdtemp(prefix="hbr", dir="/tmp"))
    ray_args = ("--runtime", "ray", "--store", "ray", "--ray-address", address)
    try:
        (state_dir / "chain.toml").write_text(CHAIN)
        extra = ("--ingress-workers", "1", *ray_args, "--namespace", "handle-bench")
        ours = ingress_bench.Daemon(state_dir, free_port(), extra=extra)
        try:
            ours.cli("apply", "-f", str(state_dir / "chain.toml"), "--wait")
            wait_answers(f"http://127.0.0.1:{ours.ingress_port}/chain-c/stats?n=0", timeout_s=60)
            return deadline_chain(ours.ingress_port, trials)
        finally:
            ours.shutdown()
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


@contextmanager
def ray_serve(tmp: Path) -> Iterator[tuple[int, dict[str, list[int]]]]:
    """Serve's proxy with Front -> Back deployed at ``/front``: its port, and the processes of
    its proxy and its replicas."""
    import hop_app
    from ray import serve

    port = free_port()
    with ingress_bench.ray_cluster(tmp):
        logging_config = {"enable_access_log": False}
        serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config=logging_config)
        try:
            serve.run(
                hop_app.serve_deployments(),
                name="hop",
                route_prefix="/front",
                logging_config=logging_config,
            )
            wait_answers(f"http://127.0.0.1:{port}/front/hop", timeout_s=60)
            yield (
                port,
                {
                    "proxy": ingress_bench.ray_pids("ray::ProxyActor"),
                    "app": ingress_bench.ray_pids("ray::ServeReplica"),
                },
            )
        finally:
            serve.shutdown()  # type: ignore[no-untyped-call]


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


def in_replica(port: int, calls: int, how: str, addr: str = "") -> dict[str, Any]:
    """N calls one after another inside Front (a warm-up of a tenth first)."""
    query = f"&addr={addr}" if addr else ""
    _get(port, f"/front/loop?n={max(1, calls // 10)}&how={how}{query}")
    stats: dict[str, Any] = _get(port, f"/front/loop?n={calls}&how={how}{query}")
    return stats


def end_to_end(port: int, seconds: float) -> dict[str, Any]:
    out = {}
    for path in ("/front/zero", "/front/hop"):
        one = ingress_bench.load(
            ("127.0.0.1", port, path), conns=1, procs=1, warmup_s=0.3, seconds=seconds
        )
        out[path.rsplit("/", 1)[1]] = {k: one[k] for k in ("rps", "p50_ms", "p99_ms", "errors")}
    out["added_p50_ms"] = round(out["hop"]["p50_ms"] - out["zero"]["p50_ms"], 3)
    out["added_p99_ms"] = round(out["hop"]["p99_ms"] - out["zero"]["p99_ms"], 3)
    return out


def per_core(
    port: int, groups: dict[str, list[int]], args: argparse.Namespace, ingress_hop: bool
) -> dict[str, Any]:
    """CPU microseconds a request, by group, for /front/zero and /front/hop (and /back)."""
    wrk_args = argparse.Namespace(conns=args.conns, warmup=1.0, seconds=args.seconds)
    out: dict[str, Any] = {}
    paths = ["/front/zero", "/front/hop", *(["/back/"] if ingress_hop else [])]
    for path in paths:
        figures = ingress_bench.wrk_load(("127.0.0.1", port, path), groups, wrk_args)
        rps = figures["rps"]
        cores = figures["cores_used"]
        out[path] = {
            "rps": rps,
            "non_2xx": figures["non_2xx"],
            "us": {g: round(cores[g] / rps * 1e6, 1) for g in groups},
        }
    zero, hop = out["/front/zero"]["us"], out["/front/hop"]["us"]
    # What a hop takes: the caller's side (Front's, beyond what /zero costs it) and the callee.
    hop_us = sum(hop[g] for g in groups if g != "proxy") - sum(
        zero[g] for g in groups if g != "proxy"
    )
    out["handle_hop_us"] = round(hop_us, 1)
    out["handle_hops_per_core"] = round(1e6 / max(hop_us, 1e-9))
    if ingress_hop:
        back = out["/back/"]["us"]
        ingress_us = back["proxy"] + back["back"]
        out["ingress_hop_us"] = round(ingress_us, 1)
        out["ingress_hops_per_core"] = round(1e6 / max(ingress_us, 1e-9))
        out["ingress_over_handle"] = round(
            out["ingress_hops_per_core"] / out["handle_hops_per_core"], 2
        )
    return out


def deadline_chain(port: int, trials: int) -> dict[str, Any]:
    """From sending a request with 100 ms to the last of A, B, C ending."""
    over = []
    for n in range(1, trials + 1):
        began = time.monotonic()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /chain/go HTTP/1.1\r\nHost: b\r\nx-request-timeout-ms: 100\r\n\r\n")
            sock.recv(65536)
        ends = [
            _get(port, f"{prefix}/stats?n={n}")["ended"][n - 1]
            for prefix in ("/chain", "/chain-b", "/chain-c")
        ]
        over.append(max(ends) - began - 0.1)
    return autoscale_bench.summary(over)


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"rounds": []}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hb", dir="/tmp")))
        print("our daemon: starting, applying the backends ...", file=sys.stderr)
        ours = stack.enter_context(daemon())
        replicas = ours.replicas()
        back_addr, back_pid = replicas["hop_back"][0]
        front_pid = replicas["hop_front"][0][1]
        port = ours.ingress_port
        wait_answers(f"http://127.0.0.1:{port}/front/hop", timeout_s=60)
        groups = {"proxy": ours.ingress_pids(), "front": [front_pid], "back": [back_pid]}
        serve_port = 0
        if not args.no_serve:
            print("Ray Serve: starting a cluster and the deployments ...", file=sys.stderr)
            (tmp / "ray").mkdir()
            serve_port, serve_groups = stack.enter_context(ray_serve(tmp / "ray"))
            results["serve_processes"] = serve_groups
        for r in range(args.rounds):
            print(f"round {r + 1} of {args.rounds}", file=sys.stderr, flush=True)
            one: dict[str, Any] = {
                "ours_handle": in_replica(port, args.calls, "handle"),
                "ours_direct": in_replica(port, args.calls, "direct", back_addr),
                "ours_end_to_end": end_to_end(port, args.seconds),
                "ours_cpu": per_core(port, groups, args, ingress_hop=True),
            }
            if serve_port:
                one["serve_handle"] = in_replica(serve_port, args.calls, "handle")
                one["serve_end_to_end"] = end_to_end(serve_port, args.seconds)
            print(
                f"  {json.dumps({k: v for k, v in one.items() if 'cpu' not in k})}", file=sys.stderr
            )
            results["rounds"].append(one)
        results["deadline_chain"] = deadline_chain(port, args.chain_trials)
        if serve_port:
            print("the deadline chain on Ray ...", file=sys.stderr, flush=True)
            results["ray_deadline_chain"] = ray_deadline_chain(args.chain_trials)
    results["summary"] = summarize(results["rounds"])
    return results


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def med(*path: str) -> float | None:
        values = []
        for r in rounds:
            value: Any = r
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if value is not None:
                values.append(float(value))
        return round(statistics.median(values), 3) if values else None

    handle, direct = med("ours_handle", "p50_us"), med("ours_direct", "p50_us")
    return {
        "ours_handle_p50_us": handle,
        "ours_handle_p99_us": med("ours_handle", "p99_us"),
        "ours_direct_p50_us": direct,
        "ours_direct_p99_us": med("ours_direct", "p99_us"),
        "ours_added_p50_us": None
        if handle is None or direct is None
        else round(handle - direct, 1),
        "serve_handle_p50_us": med("serve_handle", "p50_us"),
        "serve_handle_p99_us": med("serve_handle", "p99_us"),
        "ours_end_to_end_added_p50_ms": med("ours_end_to_end", "added_p50_ms"),
        "ours_end_to_end_added_p99_ms": med("ours_end_to_end", "added_p99_ms"),
        "serve_end_to_end_added_p50_ms": med("serve_end_to_end", "added_p50_ms"),
        "serve_end_to_end_added_p99_ms": med("serve_end_to_end", "added_p99_ms"),
        "handle_hop_us": med("ours_cpu", "handle_hop_us"),
        "ingress_hop_us": med("ours_cpu", "ingress_hop_us"),
        "ingress_over_handle_per_core": med("ours_cpu", "ingress_over_handle"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--conns", type=int, default=32)
    parser.add_argument("--chain-trials", type=int, default=20)
    parser.add_argument("--no-serve", action="store_true")
    parser.add_argument("--out", default=str(HERE / "handle_results.json"))
    args = parser.parse_args()
    results = run(args)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results["summary"], indent=1))
    print(json.dumps(results["deadline_chain"], indent=1))
    if "ray_deadline_chain" in results:
        print("on Ray:", json.dumps(results["ray_deadline_chain"], indent=1))


if __name__ == "__main__":
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    main()
