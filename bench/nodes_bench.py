"""A Ray cluster run as one service (issue 32): a local cluster of three nodes on this machine
(``ray.cluster_utils.Cluster``), a real daemon (``controller run --runtime ray --store ray
--node-ingress 0``) with an ingress on each node that needs one, and closed-loop HTTP load from
``ingress_bench``'s generator.

1. A node drained under load (``controller node drain --wait``): requests failed (target 0).
2. A node lost under load (its raylet killed, SIGKILL): Ray's own detection time (kill to the
   node reported dead), the time to full strength again (kill to every replica serving on the
   other nodes), and the requests failed meanwhile. Ray's health checks are set to 0.5 s x 3
   (its default is 3 s x 5, about 15 s to detect); both figures are stated.
3. Throughput through the node ingresses (each alone, then all at once) against Ray Serve's
   proxy on the same cluster (on the head only: on one machine every node has one address,
   and Serve's proxy on each node would want the same port).

    python bench/nodes_bench.py [--seconds S] [--conns N]

Prints Markdown tables; writes ``bench/nodes_results.json``. Run with ``RAY_AUTH_MODE=disabled``
(``nox -s bench`` does).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ingress_bench as ib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FAST_DEATH = {
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
    "health_check_initial_delay_ms": 0,
}
BACKEND = {
    "entrypoint": "ingress_replica:Trivial",
    "route_prefix": "/bench",
    "num_replicas": 3,
    "version": "v1",
    "max_unavailable": 0,
    "graceful_shutdown_timeout_s": 5,
}


@contextmanager
def cluster(tmp: Path) -> Iterator[Any]:
    import ray
    from ray.cluster_utils import Cluster

    os.environ["RAY_TMPDIR"] = str(tmp)  # short: Ray's socket paths
    head = {"num_cpus": 1, "include_dashboard": False, "_system_config": FAST_DEATH}
    made = Cluster(initialize_head=True, head_node_args=head)
    try:
        workers = [made.add_node(num_cpus=1) for _ in range(2)]
        made.wait_for_nodes()
        ray.init(address=made.address, logging_level=logging.WARNING)
        yield made, workers
    finally:
        ray.shutdown()
        made.shutdown()  # type: ignore[no-untyped-call]


class RayDaemon:
    def __init__(self, state_dir: Path, address: str) -> None:
        self.dir = state_dir
        self.log = (state_dir.parent / "daemon.log").open("wb")
        self.token = os.urandom(16).hex()
        argv = [sys.executable, "-m", "controller", "--state-dir", str(state_dir), "run"]
        argv += ["--listen", "127.0.0.1:0", "--pythonpath", str(HERE), "--no-ingress"]
        argv += ["--runtime", "ray", "--store", "ray", "--ray-address", address]
        argv += ["--namespace", f"nodes-bench-{os.getpid()}", "--node-ingress", "0"]
        env = {**os.environ, "CONTROLLER_TOKEN": self.token}
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, env=env
        )
        info = state_dir / "daemon.json"
        deadline = time.monotonic() + 60
        while not info.exists():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the daemon did not start: see its daemon.log")
            time.sleep(0.05)
        time.sleep(0.05)
        self.url = str(json.loads(info.read_text())["url"])
        ib.wait_answers(f"{self.url}/healthz", times=1)

    def api(self, method: str, path: str, body: Any = None) -> Any:
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.loads(answer.read())

    def cli(self, *args: str) -> None:
        env = {**os.environ, "CONTROLLER_TOKEN": self.token}
        subprocess.run(
            [sys.executable, "-m", "controller", "--state-dir", str(self.dir), *args],
            cwd=ROOT,
            check=True,
            timeout=180,
            stdout=subprocess.DEVNULL,
            env=env,
        )

    def running_on(self) -> list[str | None]:
        status = self.api("GET", "/api/v1/backends/bench")
        return [r["node"] for r in status["replicas"] if r["state"] == "RUNNING"]

    def ingresses(self) -> dict[str, str]:
        entries = self.api("GET", "/api/v1/ingress").get("nodes", [])
        return {e["node"]: e["address"] for e in entries if e["state"] == "serving"}

    def wait(self, check: Any, timeout_s: float = 120.0) -> float:
        """Seconds until `check()` holds (reading the API every 20 ms)."""
        began = time.monotonic()
        while not check():
            if time.monotonic() - began > timeout_s:
                raise RuntimeError("timed out waiting for the daemon")
            time.sleep(0.02)
        return time.monotonic() - began

    def shutdown(self) -> None:
        try:
            self.cli("shutdown")
            self.proc.wait(60)
        finally:
            ib.stop(self.proc)
            self.log.close()


def target(address: str) -> tuple[str, int, str]:
    host, _, port = address.rpartition(":")
    return host, int(port), "/bench/x"


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    results: dict[str, Any] = {"machine": {"cores": os.cpu_count()}}
    tmp = Path(tempfile.mkdtemp(prefix="nb", dir="/tmp"))
    try:
        with cluster(tmp / "ray") as (made, workers):
            (tmp / "state").mkdir()
            daemon = RayDaemon(tmp / "state", made.address)
            try:
                began = time.monotonic()
                daemon.api("PUT", "/api/v1/backends/bench", BACKEND)
                daemon.wait(lambda: len(daemon.running_on()) == 3)
                results["start_3_s"] = time.monotonic() - began
                daemon.wait(lambda: len(daemon.ingresses()) == 3)
                head = ray.get_runtime_context().get_node_id()
                entry = target(daemon.ingresses()[head])

                # 1. A drain under load, through the head's ingress.
                away = workers[0].node_id
                drained: dict[str, Any] = {}

                def drain() -> None:
                    began = time.monotonic()
                    daemon.cli("node", "drain", away, "--wait", "--timeout", "120")
                    drained["drain_s"] = time.monotonic() - began

                load = under_load(entry, args, drain)
                results["drain"] = {
                    **drained,
                    "requests": load["requests"],
                    "failed": load["errors"],
                }
                daemon.cli("node", "uncordon", away)

                # 2. A node lost under load: the other worker, which holds a replica.
                victim = workers[1]
                daemon.wait(lambda: victim.node_id in daemon.running_on())
                lost: dict[str, Any] = {}

                def kill() -> None:
                    raylet = victim.all_processes["raylet"][0].process
                    killed = time.monotonic()
                    os.kill(raylet.pid, signal.SIGKILL)
                    raylet.wait()

                    def dead() -> bool:
                        return not any(
                            n["Alive"]
                            for n in ray.nodes()  # type: ignore[no-untyped-call]
                            if n["NodeID"] == victim.node_id
                        )

                    lost["ray_detects_s"] = killed_for(dead, killed)
                    lost["full_strength_s"] = killed_for(
                        lambda: (
                            len(daemon.running_on()) == 3
                            and victim.node_id not in daemon.running_on()
                        ),
                        killed,
                    )

                load = under_load(entry, args, kill)
                made.worker_nodes.discard(victim)
                lost["after_detection_s"] = lost["full_strength_s"] - lost["ray_detects_s"]
                results["loss"] = {**lost, "requests": load["requests"], "failed": load["errors"]}

                # 3. Throughput: each node's ingress alone, then all at once.
                daemon.wait(lambda: len(daemon.ingresses()) >= 2)
                found = daemon.ingresses()
                alone = {}
                for node, address in sorted(found.items()):
                    figures = ib.load(
                        target(address),
                        conns=args.conns,
                        procs=1,
                        warmup_s=0.5,
                        seconds=args.seconds,
                    )
                    alone[node[:12]] = round(figures["rps"])
                results["ingress_alone_rps"] = alone
                results["ingress_all_rps"] = round(all_at_once(list(found.values()), args))
            finally:
                daemon.shutdown()
            if not args.no_serve:
                results["serve"] = serve_figures(args)
    except BaseException:
        log = tmp / "daemon.log"
        if log.exists():
            print(log.read_text()[-6000:], file=sys.stderr)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def under_load(
    entry: tuple[str, int, str], args: argparse.Namespace, event: Callable[[], None]
) -> dict[str, Any]:
    """The load's figures, with `event` run in a thread once the measured window begins."""
    during = threading.Thread(target=event)
    load = ib.load(
        entry, conns=args.conns, procs=1, warmup_s=0.5, seconds=args.seconds, during=during.start
    )
    during.join()
    return load


def killed_for(check: Any, since: float) -> float:
    while not check():
        time.sleep(0.02)
    return time.monotonic() - since


def through(address: str, args: argparse.Namespace) -> float:
    """Requests a second through the ingress at `address`, closed loop."""
    figures = ib.load(
        target(address), conns=args.conns, procs=1, warmup_s=0.5, seconds=args.seconds
    )
    return float(figures["rps"])


def all_at_once(addresses: list[str], args: argparse.Namespace) -> float:
    totals: list[float] = []

    def one(address: str) -> None:
        figures = ib.load(
            target(address), conns=args.conns, procs=1, warmup_s=0.5, seconds=args.seconds
        )
        totals.append(figures["rps"])

    threads = [threading.Thread(target=one, args=(a,)) for a in addresses]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(totals)


def serve_figures(args: argparse.Namespace) -> dict[str, Any]:
    """Ray Serve's proxy (head only) to three replicas, on the same cluster once the daemon
    has shut down."""
    from ray import serve

    port = ib.free_port()
    serve.start(
        http_options={"host": "127.0.0.1", "port": port},
        logging_config={"enable_access_log": False},
    )
    try:
        deployment = serve.deployment(
            name="Trivial",
            num_replicas=3,
            max_ongoing_requests=100,
            ray_actor_options={"num_cpus": 0.25},
        )(ib.ServeTrivial)
        serve.run(deployment.bind(), name="bench", route_prefix="/bench")
        ib.wait_answers(f"http://127.0.0.1:{port}/bench/x")
        figures = ib.load(
            ("127.0.0.1", port, "/bench/x"),
            conns=args.conns,
            procs=1,
            warmup_s=0.5,
            seconds=args.seconds,
        )
        return {
            "rps": round(figures["rps"]),
            "p50_ms": figures["p50_ms"],
            "errors": figures["errors"],
        }
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--conns", type=int, default=8)
    parser.add_argument("--no-serve", action="store_true")
    args = parser.parse_args()
    results = run(args)
    (HERE / "nodes_results.json").write_text(json.dumps(results, indent=2) + "\n")
    drain, loss = results["drain"], results["loss"]
    rows = [
        (
            "a node drained under load: requests failed (target 0)",
            f"{drain['failed']} of {drain['requests'] + drain['failed']}; the drain took "
            f"{drain['drain_s']:.1f} s",
        ),
        (
            "a node lost under load: Ray reports it dead",
            f"{loss['ray_detects_s']:.2f} s after the kill (its health checks 0.5 s x 3)",
        ),
        (
            "a node lost: the backend at full strength again",
            f"{loss['full_strength_s']:.2f} s after the kill, {loss['after_detection_s']:.2f} s "
            "after Ray's report (target 10 s)",
        ),
        (
            "a node lost: requests failed",
            f"{loss['failed']} of {loss['requests'] + loss['failed']}",
        ),
        ("3 replicas started on 3 nodes (PUT to all running)", f"{results['start_3_s']:.2f} s"),
        ("node ingresses, each alone (req/s)", str(results["ingress_alone_rps"])),
        ("node ingresses, all at once (req/s)", str(results["ingress_all_rps"])),
    ]
    if "serve" in results:
        rows.append(("Ray Serve's proxy, 3 replicas (req/s)", str(results["serve"]["rps"])))
    print("\n| what | figure |\n|---|---|")
    for what, figure in rows:
        print(f"| {what} | {figure} |")


if __name__ == "__main__":
    main()
