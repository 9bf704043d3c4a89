"""The daemon's ingress attacked as a stranger would, with no token, on real processes: a leader
with a standby, its ingress in processes of its own, flooded with long URLs, idle connections
and malformed requests. The controller must not notice (no lease lost, no leadership change,
its loop never held up, its API answering at once), and clients must still be served. Then an
ingress process killed with SIGKILL, and the daemon restarted under traffic."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

import trio
from prometheus_client.parser import text_string_to_metric_families

from ..daemons import (
    LIMIT_S,
    Daemon,
    deploy,
    dirs,
    free_port,
    ingress_pids,
    killed_at_exit,
    role,
    settled,
    until,
)
from ..http_client import Conn, get_from, request

#: How long the flood lasts: 20 s in a test run, many lease renewals long (on 2 cores, 60 s of it
#: slowed every test beside it); the 60 s that issue 28 asks for in ``nox -s reliability``.
ATTACK_S = float(os.environ.get("CONTROLLER_ATTACK_S", "20"))
HERE = Path(__file__).parent.parent
IDLE_CONNECTIONS = 10_000


def metric(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Each sample of `name` in a Prometheus text, by its labels."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def share_within(text: str, histogram: str, bound: float) -> tuple[float, float]:
    """Of a histogram's samples, the share at or under `bound` (a bucket's edge), and how many."""
    buckets = {float(dict(k)["le"]): v for k, v in metric(text, f"{histogram}_bucket").items()}
    total = buckets[float("inf")]
    return (buckets[bound] / total if total else 1.0), total


def _descriptors() -> int:
    """How many descriptors a process may open (the flood raises its soft limit to this)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 1 << 20 if hard == resource.RLIM_INFINITY else hard


async def _from(source: str, port: int, path: str) -> tuple[int, float]:
    """A GET from `source` (a loopback address): its status, and how long it took."""
    began = time.monotonic()
    answer = await get_from(source, port, path)
    return int(answer[9:12]), time.monotonic() - began


async def test_a_flood_at_the_ingress_costs_the_controller_nothing(state_dir: Path) -> None:
    idle = min(IDLE_CONNECTIONS, _descriptors() - 500)
    shared, own_a, own_b = dirs(state_dir, "shared", "a", "b")
    port = free_port()
    a, b = Daemon(own_a), Daemon(own_b)
    with killed_at_exit(a, b), trio.fail_after(ATTACK_S + LIMIT_S * 3):
        async with trio.open_nursery() as nursery:
            await a.start(
                nursery,
                *("--shared-dir", str(shared), "--ingress-listen", f"127.0.0.1:{port}"),
                *("--ingress-workers", "2"),
            )
            await b.start(nursery, "--shared-dir", str(shared), "--no-ingress")
            await deploy(a, "app", num_replicas=2)
            await until(a, "app", settled("v1"))
            epoch = (await role(a))["epoch"]
            api_ms: list[float] = []
            sent: dict[str, int] = {}
            served: list[int] = []

            async def legit() -> None:
                while True:
                    served.append((await _from("127.0.0.3", port, "/app/any"))[0])
                    await trio.sleep(0.05)  # a client's pace, not a wait for anything

            async def run(argv: list[str], out: Any) -> None:
                # The attacker and the probe are processes (and sessions) of their own: this
                # one judges, and must not be what holds the daemon up.
                result = await trio.run_process(
                    [sys.executable, *argv], capture_stdout=True, start_new_session=True
                )
                out(json.loads(result.stdout))

            async with trio.open_nursery() as flood:
                flood.start_soon(legit)
                async with trio.open_nursery() as attack:
                    attack.start_soon(
                        run,
                        [str(HERE / "flood.py"), str(port), str(ATTACK_S), str(idle)],
                        sent.update,
                    )
                    attack.start_soon(
                        run, [str(HERE / "api_probe.py"), a.url, str(ATTACK_S)], api_ms.extend
                    )
                    # 10,000 idle connections held from 127.0.0.1: a client from elsewhere is
                    # served at once (checked a few times, as the flood comes and goes).
                    for _ in range(5):
                        await trio.sleep(ATTACK_S / 6)
                        status, seconds = await _from("127.0.0.2", port, "/app/any")
                        assert status == 200
                        # Served, not starved behind the flood (the attack that found it saw
                        # 10 s); generous, for a machine at load 20.
                        assert seconds < 5, seconds
                flood.cancel_scope.cancel()
            # The controller noticed nothing.
            assert (await role(a))["epoch"] == epoch
            assert (await role(b))["epoch"] == epoch
            _, text = await a.http("GET", "/metrics")
            assert metric(text, "controller_lease_renew_failures_total") == {(): 0.0}
            assert metric(text, "controller_leadership_transitions_total") == {(): 1.0}
            # Bounds a busy machine keeps too (the tests run beside each other, and must pass
            # beside a CPU hog): what the leader lost to the flood before issue 28 was seconds,
            # its lease. The lag and latency on a quiet machine are the benchmark's to measure.
            # 97 %: two suites at once beside two CPU hogs (load about 25) kept 98.7 % of the
            # samples under 100 ms; none ever lagged a second.
            share, samples = share_within(text, "controller_loop_lag_seconds", 0.1)
            assert samples > ATTACK_S * 10
            assert share >= 0.97, f"loop lag over 100 ms in {1 - share:.2%} of {samples:.0f}"
            assert share_within(text, "controller_loop_lag_seconds", 1.0)[0] == 1.0
            api_ms.sort()
            assert api_ms[int(len(api_ms) * 0.99)] < 250, api_ms[-20:]
            assert b"stopped leading" not in a.log
            assert b"renewed the lease" not in a.log  # never late
            assert b"leading as epoch" not in b.log
            # Clients were served throughout, and the flood was refused, not served: the idle
            # connections at the door (127.0.0.1 held its share of connections), the long URLs
            # and malformed requests (from addresses of their own) answered 414 and 400.
            assert served
            assert set(served) == {200}, served
            refused = metric(text, "ingress_connections_refused_total")
            assert refused.get((("cause", "per_client"),), 0) > 0
            bad = metric(text, "ingress_bad_requests_total")
            assert bad.get((("code", "414"),), 0) > 0
            assert bad.get((("code", "400"),), 0) > 0
            load = metric(text, "ingress_in_flight")
            assert set(load.values()) <= {0.0}, load
            assert sent["held"] >= idle, sent
            print(
                f"\nattack: {sent}, legit {len(served)}, api p99 "
                f"{api_ms[int(len(api_ms) * 0.99)]:.1f} ms, lag samples {samples:.0f}"
            )
            assert (await a.cli("shutdown")).returncode == 0
            b.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            assert await a.process.wait() == 0  # type: ignore[union-attr]
            assert await b.process.wait() == 0  # type: ignore[union-attr]
            assert ingress_pids(own_a) == []


async def test_an_ingress_process_killed_is_replaced_and_its_clients_reconnect(
    state_dir: Path,
) -> None:
    port = free_port()
    daemon = Daemon(state_dir)
    with killed_at_exit(daemon), trio.fail_after(LIMIT_S * 2):
        async with trio.open_nursery() as nursery:
            await daemon.start(
                nursery, "--ingress-listen", f"127.0.0.1:{port}", "--ingress-workers", "2"
            )
            await deploy(daemon, "app", num_replicas=1)
            await until(daemon, "app", settled("v1"))
            code, fleet = await daemon.http("GET", "/api/v1/ingress")
            assert code == 200
            assert [p["state"] for p in fleet["processes"]] == ["serving", "serving"]
            victim = fleet["processes"][0]["pid"]
            # Clients on kept connections, spread over both processes by the kernel.
            conns = [await Conn.open(port) for _ in range(8)]
            for conn in conns:
                assert (await conn.request("/app/any")).status == 200
            os.kill(victim, signal.SIGKILL)
            await daemon.logged(b"killed by SIGKILL; starting another")
            # Those on the killed process see their connection closed; they connect again
            # and are served, by its sibling or its replacement.
            for conn in conns:
                try:
                    assert (await conn.request("/app/any")).status == 200
                except ConnectionError:
                    await conn.aclose()
                    assert (await request(port, "/app/any")).status == 200
                else:
                    await conn.aclose()
            await daemon.logged(b"ingress process 0 serving again")
            _, fleet = await daemon.http("GET", "/api/v1/ingress")
            first = fleet["processes"][0]
            assert first["pid"] != victim
            assert (first["restarts"], first["last_exit"]) == (1, "killed by SIGKILL")
            _, text = await daemon.http("GET", "/metrics")
            assert metric(text, "controller_ingress_restarts_total") == {(): 1.0}
            assert (await daemon.cli("shutdown")).returncode == 0
            assert await daemon.process.wait() == 0  # type: ignore[union-attr]
            assert ingress_pids(state_dir) == []


class Results:
    """What the traffic got, and a way to wait until it has got `n` more answers."""

    def __init__(self) -> None:
        self.got: list[int | str] = []
        self._grew = trio.Event()

    def add(self, result: int | str) -> None:
        self.got.append(result)
        self._grew.set()
        self._grew = trio.Event()

    async def more(self, n: int) -> None:
        target = len(self.got) + n
        while len(self.got) < target:
            await self._grew.wait()


async def test_a_daemon_restarted_under_traffic_fails_no_request(state_dir: Path) -> None:
    """Ctrl-C, then `controller run` again with the same command: its ingress processes keep
    serving meanwhile (on the last snapshot) and the new daemon adopts them."""
    port, api = free_port(), free_port()
    args = ("--ingress-listen", f"127.0.0.1:{port}", "--ingress-workers", "2")
    results = Results()
    with trio.fail_after(LIMIT_S * 3):
        async with trio.open_nursery() as nursery:
            first = Daemon(state_dir)
            await first.start(nursery, *args, listen=f"127.0.0.1:{api}")
            await deploy(first, "app", num_replicas=2)
            await until(first, "app", settled("v1"))
            before = sorted(ingress_pids(state_dir))
            stop = trio.Event()

            async def kept() -> None:  # one kept connection
                conn = await Conn.open(port)
                async with contextlib.AsyncExitStack() as stack:
                    stack.push_async_callback(conn.aclose)
                    while not stop.is_set():
                        try:
                            results.add((await conn.request("/app/any")).status)
                        except ConnectionError as exc:
                            results.add(f"kept: {exc}")
                            return

            async def fresh() -> None:  # a new connection each time
                while not stop.is_set():
                    try:
                        results.add((await request(port, "/app/any")).status)
                    except (ConnectionError, OSError) as exc:
                        results.add(f"fresh: {exc}")

            async with trio.open_nursery() as traffic:
                traffic.start_soon(kept)
                traffic.start_soon(fresh)
                await results.more(50)
                assert first.process is not None
                assert await first.stop(signal.SIGINT) == 0
                await results.more(50)  # served with no daemon at all
                second = Daemon(state_dir)
                await second.start(nursery, *args, listen=f"127.0.0.1:{api}")
                assert b"2 processes" in second.log
                await results.more(50)
                stop.set()
            assert sorted(ingress_pids(state_dir)) == before  # adopted, not replaced
            _, fleet = await second.http("GET", "/api/v1/ingress")
            # Told to follow the new daemon as it adopted them (not after their backoff).
            assert all(p["adopted"] and p["following"] for p in fleet["processes"]), fleet
            assert (await second.cli("shutdown")).returncode == 0
            assert await second.process.wait() == 0  # type: ignore[union-attr]
    failed = [r for r in results.got if r != 200]
    assert failed == [], failed[:5]
    assert len(results.got) >= 150
