"""Failover of standby controllers (issue 17): how long from a leader killed to a new one acting,
on SQLite (two daemons of one ``--shared-dir``, LocalRuntime) and on Ray (two daemons of one
namespace, RayKVStore and RayRuntime, a local cluster started here); and what fencing costs a
checkpoint write.

1. **Takeover**: two daemons (default lease: 2 s, renewed every 0.5 s) and a backend of two
   replicas; kill -9 the leader. Measured from the kill to the standby's log line "leading as
   epoch N" (its controller recovered: the new leader's first action; read from its log's
   timestamp) and to its ``GET /api/v1/backends`` first saying ``role: leader`` (polled every
   10 ms). The killed daemon is then started again, as a standby, for the next trial.
2. **Replaced replica**: the same, but one replica's process is killed (kill -9) at the same
   moment as the leader. Measured from the kills to the new leader showing the backend at full
   strength again (HEALTHY, two replicas ready, the dead one replaced by a new one).
3. **Fencing on the write path**: one checkpoint write (one key, and ten keys, of 200 bytes) with
   ``write`` and with ``write_fenced``: SQLiteStore (``synchronous="FULL"``) and RayKVStore
   (``write_fenced`` goes through the namespace's fencing actor).

Writes ``bench/failover_results.json``; ``--quick`` runs fewer trials and rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import json
import logging
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import reaper
import trio

HERE = Path(__file__).parent
ROOT = HERE.parent
TOKEN = os.urandom(16).hex()
#: The backend both daemons share: trivial replicas, stopped fast.
BACKEND = {
    "entrypoint": "noop_replica:Noop",
    "num_replicas": 2,
    "version": "v1",
    "graceful_shutdown_timeout_s": 2,
}
POLL_S = 0.01
LIMIT_S = 60.0


class Daemon:
    """``controller run`` in a process of its own, on a state dir of its own."""

    def __init__(self, state: Path, extra: Sequence[str]):
        self.state = state
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.state / "daemon.json").unlink()  # a killed one's
        argv = [sys.executable, "-m", "controller", "--state-dir", str(self.state), "run"]
        argv += ["--listen", "127.0.0.1:0", "--no-ingress", "--pythonpath", str(HERE)]
        with (self.state / "stderr.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [*argv, *self.extra],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env={**os.environ, "CONTROLLER_TOKEN": TOKEN},
            )
        deadline = time.monotonic() + LIMIT_S
        while not (self.state / "daemon.json").exists():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"the daemon did not start: see {self.state / 'stderr.log'}")
            time.sleep(POLL_S)
        url = json.loads((self.state / "daemon.json").read_text())["url"]
        self.port = int(url.rpartition(":")[2])

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=LIMIT_S)
        try:
            headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers=headers)
            answer = conn.getresponse()
            return answer.status, json.loads(answer.read() or b"null")
        finally:
            conn.close()

    def role(self) -> str:
        status, data = self.call("GET", "/api/v1/backends")
        assert status == 200, data
        role: str = data["leadership"]["role"]
        return role

    def backend(self) -> dict[str, Any]:
        status, data = self.call("GET", "/api/v1/backends/app")
        assert status == 200, data
        return dict(data)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)

    def reap(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def led_at(self, epoch: int) -> float | None:
        """When this daemon logged that it leads as `epoch` (the wall clock, from its log), or
        None if it has not logged it yet: the API may say it leads a moment before the line
        is written, so the caller waits for it (asserting it at once crashed a run)."""
        text = (self.state / "daemon.log").read_text()
        found = re.findall(
            rf"^(\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d,\d{{3}}) .*leading as epoch {epoch}\b",
            text,
            re.MULTILINE,
        )
        if not found:
            return None
        moment = datetime.datetime.strptime(found[-1], "%Y-%m-%d %H:%M:%S,%f")
        return moment.timestamp()  # local time, as logging writes it


def until(what: str, check: Callable[[], bool], limit: float = LIMIT_S) -> None:
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(POLL_S)


def full(daemon: Daemon, without: str | None = None) -> bool:
    status = daemon.backend()
    tags = {r["tag"] for r in status["replicas"]}
    return bool(
        status["state"] == "HEALTHY"
        and status["ready"] == 2
        and len(tags) == 2
        and without not in tags
        and status["observed_generation"] == status["generation"]
    )


@contextlib.contextmanager
def pair(extra: Sequence[str], prefix: str) -> Iterator[list[Daemon]]:
    """Two daemons (the first leads) with the backend deployed and at full strength; at the
    end, the standby stopped and the leader shut down (its backend deleted)."""
    dirs = [Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp")) for _ in range(2)]
    daemons = [Daemon(d, extra) for d in dirs]
    try:
        daemons[0].start()
        daemons[1].start()
        assert [d.role() for d in daemons] == ["leader", "standby"]
        status, data = daemons[0].call("PUT", "/api/v1/backends/app", BACKEND)
        assert status == 200, data
        until("the backend", lambda: full(daemons[0]))
        yield daemons
        leader = next(d for d in daemons if d.role() == "leader")
        for daemon in daemons:
            if daemon is not leader and daemon.proc is not None:
                daemon.proc.send_signal(signal.SIGTERM)
                daemon.proc.wait(LIMIT_S)
        leader.call("POST", "/api/v1/shutdown")
        assert leader.proc is not None
        leader.proc.wait(LIMIT_S)
    finally:
        for daemon in daemons:
            daemon.reap()
        # A run that failed midway leaves what killed daemons leave on purpose (their workers
        # and fork servers, for the next start to adopt): none may outlive the benchmark.
        kill_what_names(dirs)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def kill_what_names(dirs: Sequence[Path]) -> None:
    """SIGKILL every process whose command line names one of `dirs` (a daemon's workers name
    their spec file there, a fork server its runtime dir)."""
    names = [os.fsencode(str(d)) for d in dirs]
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if any(name in command for name in names):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry), signal.SIGKILL)


def failovers(daemons: list[Daemon], trials: int, *, with_replica: bool) -> list[dict[str, float]]:
    """`trials` kill -9s of whichever daemon leads; after each, the killed one starts again as
    the standby."""
    out = []
    for _ in range(trials):
        leader, standby = daemons if daemons[0].role() == "leader" else daemons[::-1]
        took = one_failover(leader, standby, with_replica=with_replica)
        out.append(took)
        print(f"  {'; '.join(f'{k} {v:.3f}' for k, v in took.items())}", flush=True)
        restart(leader)
    return out


def restart(daemon: Daemon) -> None:
    """A killed daemon started again, on its state dir: it stands by."""
    daemon.reap()
    daemon.start()
    until("the restarted standby", lambda: daemon.role() == "standby")


def one_failover(leader: Daemon, standby: Daemon, *, with_replica: bool) -> dict[str, float]:
    assert standby.role() == "standby"
    until("a steady backend", lambda: full(leader))
    _, data = leader.call("GET", "/api/v1/backends")
    epoch = int(data["leadership"]["epoch"])
    victim = leader.backend()["replicas"][0]
    time.sleep(1.0)  # steady: the standby has read the lease since its last renewal, twice
    wall, start = time.time(), time.perf_counter()
    leader.kill()
    if with_replica:
        os.kill(int(victim["pid"]), signal.SIGKILL)
    until("the standby leading", lambda: standby.role() == "leader")
    took: dict[str, float] = {"role_leader_s": time.perf_counter() - start}
    if with_replica:
        until("a replaced replica", lambda: full(standby, without=victim["tag"]))
        took["full_strength_s"] = time.perf_counter() - start
    until("the new leader's log line", lambda: standby.led_at(epoch + 1) is not None)
    led = standby.led_at(epoch + 1)
    assert led is not None
    took["log_leading_s"] = led - wall
    return took


def figures(samples: Sequence[float]) -> dict[str, float]:
    return {
        "trials": len(samples),
        "median_s": round(statistics.median(samples), 3),
        "min_s": round(min(samples), 3),
        "max_s": round(max(samples), 3),
    }


def summarize(trials: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {key: figures([t[key] for t in trials]) for key in trials[0]}


def failover(extra: Sequence[str], prefix: str, trials: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with pair(extra, prefix) as daemons:
        for with_replica in (False, True):
            key = "leader_and_replica_killed" if with_replica else "leader_killed"
            print(f" {key}:", flush=True)
            results[key] = summarize(failovers(daemons, trials, with_replica=with_replica))
    return results


# -- 3. the cost of fencing a write --


async def write_costs(store: Any, rounds: int) -> dict[str, dict[str, float]]:
    """Per write, in ms: `write` and `write_fenced` (the lease held as epoch 1), 1 and 10 keys."""
    from controller._model.decisions.lease import claimed

    lease = claimed(None, holder="bench", duration_s=3600, pid=os.getpid(), wall=time.time())
    assert await store.claim_lease(None, lease)
    await store.write_fenced(1, {"warm": "up"})
    out: dict[str, dict[str, float]] = {}
    for keys in (1, 10):
        changes = {f"key{i}": "x" * 200 for i in range(keys)}
        for fenced in (False, True):
            took = []
            for _ in range(rounds):
                start = time.perf_counter()
                if fenced:
                    await store.write_fenced(1, changes)
                else:
                    await store.write(changes)
                took.append((time.perf_counter() - start) * 1000)
            took.sort()
            name = f"{'write_fenced' if fenced else 'write'}_{keys}_key{'s' if keys > 1 else ''}"
            out[name] = {
                "rounds": rounds,
                "p50_ms": round(statistics.median(took), 3),
                "p90_ms": round(took[int(rounds * 0.9)], 3),
                "mean_ms": round(statistics.mean(took), 3),
            }
            print(f"  {name:22} {out[name]}", flush=True)
    return out


def sqlite_write_costs(rounds: int) -> dict[str, dict[str, float]]:
    from controller._stores.sqlite import SQLiteStore

    with (
        tempfile.TemporaryDirectory(prefix="fws", dir="/tmp") as tmp,
        SQLiteStore(Path(tmp) / "c.db", synchronous="FULL") as store,
    ):
        return trio.run(write_costs, store, rounds)


# -- the runs --


def run_sqlite(trials: int) -> dict[str, Any]:
    shared = Path(tempfile.mkdtemp(prefix="fos", dir="/tmp"))
    shared.chmod(0o700)
    try:
        return failover(["--shared-dir", str(shared)], "fol", trials)
    finally:
        kill_what_names([shared])  # the workers live in the shared dir
        shutil.rmtree(shared, ignore_errors=True)


def run_ray(trials: int, rounds: int) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    from controller.ray import RayKVStore

    tmp = tempfile.mkdtemp(prefix="for", dir="/tmp")  # short: Ray's socket paths
    os.environ["RAY_TMPDIR"] = tmp
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 4, "include_dashboard": False}
    )
    results: dict[str, Any] = {}
    try:
        ray.init(address=cluster.address, logging_level=logging.WARNING)
        namespace = f"failover{os.getpid()}"
        extra = ["--runtime", "ray", "--store", "ray", "--ray-address", cluster.address]
        results = failover([*extra, "--namespace", namespace], "for", trials)
        print(" RayKVStore write costs:", flush=True)
        results["write_cost"] = trio.run(write_costs, RayKVStore(f"{namespace}-kv"), rounds)
    finally:
        ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def main() -> None:
    reaper.leave_nothing()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5, help="kills per measure and store")
    parser.add_argument("--rounds", type=int, default=300, help="writes per write measure")
    parser.add_argument("--quick", action="store_true", help="3 trials, 100 rounds")
    parser.add_argument("--no-ray", action="store_true", help="SQLite only")
    parser.add_argument("--out", type=Path, default=HERE / "failover_results.json")
    args = parser.parse_args()
    trials, rounds = (3, 100) if args.quick else (args.trials, args.rounds)
    results: dict[str, Any] = {"lease": {"duration_s": 2.0, "renew_s": 0.5}}
    print("SQLite (--shared-dir, LocalRuntime), kill -9 the leader:", flush=True)
    results["sqlite"] = run_sqlite(trials)
    print(" SQLiteStore write costs (synchronous=FULL):", flush=True)
    results["sqlite"]["write_cost"] = sqlite_write_costs(rounds)
    if not args.no_ray:
        print("Ray (RayKVStore, RayRuntime), kill -9 the leader:", flush=True)
        results["ray"] = run_ray(trials, rounds)
    if args.out.exists():
        results = {**json.loads(args.out.read_text()), **results}  # a partial run keeps the rest
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
