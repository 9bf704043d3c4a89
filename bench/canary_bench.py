"""A bad release under a rolling update against the same release as a canary (issue 33).

A real daemon (local workers, its ingress in processes of its own) runs ``examples/echo_replica``
at 4 replicas of v1; closed-loop HTTP load goes through the ingress on a few keep-alive
connections, each answer kept with its time and the version that gave it. Then v2, whose every
fifth request answers 500, is deployed twice on the same load, from v1 each time:

1. as a rolling update (``max_surge = 1``, ``max_unavailable = 0``): it passes readiness and
   health checks, so it replaces every replica;
2. as a canary with the default steps (``canary = {}``: 5 % for 60 s, 25 %, 50 %), aborted by its
   error gate.

For each: the requests failed within the same window from the deploy, and the share failing at
its end; for the canary, the time from the bad revision's first error (at the client) to its
last answer (its traffic back at 0), and to the controller's abort.

    python bench/canary_bench.py [--window S] [--conns N]

Prints a Markdown table; writes ``bench/canary_results.json``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import ingress_bench as ib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLES = ROOT / "examples"
BACKEND: dict[str, Any] = {
    "entrypoint": "echo_replica:Echo",
    "route_prefix": "/shop",
    "num_replicas": 4,
    "version": "v1",
    "init_kwargs": {"work_ms": 2},
    "max_surge": 1,
    "max_unavailable": 0,
    "graceful_shutdown_timeout_s": 2,
    "resources": {"CPU": 0.1},
}
BAD = {"version": "v2", "init_kwargs": {"work_ms": 2, "fail_every": 5}}


class Daemon(ib.Daemon):
    """``ingress_bench``'s daemon, running the examples' replicas, with JSON calls."""

    def __init__(self, state_dir: Path, ingress_port: int) -> None:
        super().__init__(state_dir, ingress_port, pythonpath=EXAMPLES)

    def api(self, method: str, path: str, body: Any = None) -> Any:
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        conn.request(method, path, body=data, headers=headers)
        answer = conn.getresponse()
        payload = answer.read()
        conn.close()
        if answer.status >= 300:
            raise RuntimeError(f"{method} {path}: {answer.status} {payload[:300]!r}")
        return json.loads(payload) if payload else None

    def status(self) -> dict[str, Any]:
        return dict(self.api("GET", "/api/v1/backends/shop"))

    def wait(self, what: str, done: Any, timeout_s: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status()
            if done(status):
                return status
            if time.monotonic() > deadline:
                raise RuntimeError(f"not {what} within {timeout_s:g}s: {status['message']}")
            time.sleep(0.1)


def settled(version: str) -> Any:
    def check(status: dict[str, Any]) -> bool:
        return bool(
            status["state"] == "HEALTHY"
            and status["version"] == version
            and all(r["version"] == version for r in status["replicas"])
        )

    return check


class Load:
    """Closed-loop requests on `conns` keep-alive connections; each answer kept as (wall time,
    status, replica tag or "")."""

    def __init__(self, port: int, conns: int) -> None:
        self.port, self.conns = port, conns
        self.answers: list[tuple[float, int, str]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(conns)]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self.stop.is_set():
            try:
                conn.request("GET", "/shop")
                answer = conn.getresponse()
                body = answer.read()
            except OSError:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                with self.lock:
                    self.answers.append((time.time(), 599, ""))
                continue
            tag = json.loads(body)["replica"] if answer.status == 200 else ""
            with self.lock:
                self.answers.append((time.time(), answer.status, tag))

    def since(self, t0: float, t1: float) -> list[tuple[float, int, str]]:
        with self.lock:
            return [a for a in self.answers if t0 <= a[0] < t1]


def trial(daemon: Daemon, load: Load, config: dict[str, Any], window_s: float) -> dict[str, Any]:
    """Deploy the bad release with `config` and watch `window_s` of the load from the deploy;
    then back to v1."""
    v1_tags = {r["tag"] for r in daemon.status()["replicas"]}
    deployed = time.time()
    daemon.api("PUT", "/api/v1/backends/shop", {**BACKEND, **config})
    v2_tags: set[str] = set()
    end = deployed + window_s
    while time.time() < end:
        v2_tags |= {r["tag"] for r in daemon.status()["replicas"] if r["version"] == "v2"}
        time.sleep(0.2)
    answers = load.since(deployed, end)
    failed = [a for a in answers if a[1] != 200]
    tail = [a for a in answers if a[0] >= end - 5]
    status = daemon.status()
    abort = None
    for event in status["events"]:
        if event["kind"] == "DeployFailed" or event["kind"] == "CanaryAborted":
            at = datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()
            if at >= deployed:
                abort = at
    # The canary's traffic: its 500s (only v2 fails) and its replicas' answers.
    theirs = [a for a in answers if a[1] != 200 or (a[2] in v2_tags and a[2] not in v1_tags)]
    first_error = min((a[0] for a in failed), default=None)
    out = {
        "requests": len(answers),
        "failed": len(failed),
        "failed_share": len(failed) / max(1, len(answers)),
        "failing_share_last_5s": sum(1 for a in tail if a[1] != 200) / max(1, len(tail)),
        "first_error_s": None if first_error is None else first_error - deployed,
        "error_to_zero_s": None if first_error is None else max(a[0] for a in theirs) - first_error,
        "error_to_abort_s": None if first_error is None or abort is None else abort - first_error,
        "outcome": status["rollout"]["outcome"],
        "message": status["message"],
    }
    # Back to v1 for the next trial (an undo: v1's content as a new revision).
    if settled("v1")(status):
        return out
    daemon.api("POST", "/api/v1/backends/shop/undo", {"to_revision": 1, "force": True})
    daemon.wait("back on v1", settled("v1"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=30.0, help="seconds watched per trial")
    parser.add_argument("--conns", type=int, default=8)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="canary-bench-"))
    port = ib.free_port()
    daemon = Daemon(tmp, port)
    results: dict[str, Any] = {"window_s": args.window, "conns": args.conns}
    try:
        daemon.api("PUT", "/api/v1/backends/shop", BACKEND)
        daemon.wait("v1 serving", settled("v1"))
        with Load(port, args.conns) as load:
            time.sleep(3)  # warm: every ingress process has every replica's connections
            results["rolling"] = trial(daemon, load, BAD, args.window)
            time.sleep(3)
            results["canary"] = trial(daemon, load, {**BAD, "canary": {}}, args.window)
    finally:
        daemon.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    results["cores"] = os.cpu_count()
    (HERE / "canary_results.json").write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)


def print_table(results: dict[str, Any]) -> None:
    def s(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f} s"

    print(
        f"\n### A bad release (1 request in 5 fails), {results['window_s']:g} s from its deploy\n"
    )
    print("| | requests | failed | failing at the end | first error to traffic 0 | to abort |")
    print("|---|---|---|---|---|---|")
    for name in ("rolling", "canary"):
        r = results[name]
        print(
            f"| {name} | {r['requests']:,} | {r['failed']:,} ({r['failed_share']:.2%}) | "
            f"{r['failing_share_last_5s']:.1%} | "
            f"{s(r['error_to_zero_s']) if name == 'canary' else 'never'} | "
            f"{s(r['error_to_abort_s']) if name == 'canary' else '-'} |"
        )


if __name__ == "__main__":
    main()
