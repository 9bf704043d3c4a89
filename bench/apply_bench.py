"""A large apply against a real daemon (issue 30): how long it takes, and how long the daemon's
loop stops answering meanwhile, which is what a leader's lease renewal (every 0.5 s, lost after
2 s) and every other client wait on.

A daemon (``controller run``, SQLite store with ``synchronous="FULL"``, LocalRuntime, no
ingress) is applied a manifest of N backends of 0 replicas (no worker starts: what is measured
is the controller's own work, the durable write included), through ``POST /api/v1/apply`` as
the CLI sends it. Meanwhile a thread asks ``GET /healthz`` (answered on the daemon's loop)
back to back; the longest of those answers is the stall. For each N: the dry run
(``/api/v1/apply/diff``) of the new file, the apply that creates the backends, the same apply
again (nothing changes), and a delete of them all (``--prune`` of an emptied manifest).

Writes ``bench/apply_results.json``; ``--sizes`` picks N (default 1000 5000).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import reaper

HERE = Path(__file__).parent
TOKEN = os.urandom(16).hex()
LIMIT_S = 600.0


@contextlib.contextmanager
def daemon() -> Iterator[tuple[str, int]]:
    """A daemon of its own; (host, port) of its API."""
    state = Path(tempfile.mkdtemp(prefix="applybench"))
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "controller", "--state-dir", str(state), "run"),
            *("--listen", "127.0.0.1:0", "--no-ingress", "--pythonpath", str(HERE)),
        ],
        env={**os.environ, "CONTROLLER_TOKEN": TOKEN},
        stderr=subprocess.DEVNULL,
    )
    try:
        address = state / "daemon.json"
        began = time.monotonic()
        while not address.exists():
            if time.monotonic() - began > 60 or process.poll() is not None:
                raise RuntimeError("the daemon did not start")
            time.sleep(0.05)
        url = json.loads(address.read_text())["url"]
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)
    finally:
        process.terminate()
        process.wait(timeout=60)
        shutil.rmtree(state, ignore_errors=True)


def request(where: tuple[str, int], method: str, path: str, body: Any = None) -> Any:
    connection = http.client.HTTPConnection(*where, timeout=LIMIT_S)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    data = None if body is None else json.dumps(body).encode()
    connection.request(method, path, body=data, headers=headers)
    answer = connection.getresponse()
    payload = answer.read()
    connection.close()
    if answer.status >= 300:
        raise RuntimeError(f"{method} {path}: {answer.status} {payload[:300]!r}")
    return json.loads(payload) if payload else None


def timed(where: tuple[str, int], path: str, body: Any) -> dict[str, float]:
    """`body` posted to `path`; its duration and the longest ``/healthz`` answer meanwhile."""
    done = threading.Event()
    longest = 0.0

    def probe() -> None:
        nonlocal longest
        connection = http.client.HTTPConnection(*where, timeout=LIMIT_S)
        while not done.is_set():
            began = time.perf_counter()
            connection.request("GET", "/healthz")
            connection.getresponse().read()
            longest = max(longest, time.perf_counter() - began)
        connection.close()

    prober = threading.Thread(target=probe)
    prober.start()
    time.sleep(0.2)
    began = time.perf_counter()
    try:
        request(where, "POST", path, body)
    finally:
        took = time.perf_counter() - began
        time.sleep(0.2)  # what the request left to do after its answer stalls the loop too
        done.set()
        prober.join()
    return {"took_s": round(took, 3), "stall_ms": round(longest * 1000, 1)}


def manifest(n: int) -> dict[str, Any]:
    backend = {"entrypoint": "noop_replica:Noop", "num_replicas": 0, "version": "v1"}
    return {"backends": {f"b{i:05d}": dict(backend) for i in range(n)}, "via": "cli"}


def main() -> None:
    reaper.leave_nothing()
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000])
    args = parser.parse_args()
    results: dict[str, Any] = {"sizes": {}}
    print(f"{'backends':>8}  {'step':<14} {'took':>8}  {'longest /healthz':>16}")
    for n in args.sizes:
        with daemon() as where:
            body = manifest(n)
            steps = {
                "dry run": timed(where, "/api/v1/apply/diff", body),
                "apply (new)": timed(where, "/api/v1/apply", body),
                "apply (same)": timed(where, "/api/v1/apply", body),
                "prune all": timed(where, "/api/v1/apply", {"backends": {}, "prune": True}),
            }
        results["sizes"][str(n)] = steps
        for step, figures in steps.items():
            print(f"{n:>8}  {step:<14} {figures['took_s']:>7.2f}s  {figures['stall_ms']:>13.0f} ms")
    (HERE / "apply_results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
