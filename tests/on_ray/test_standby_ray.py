"""Standby controllers on Ray (issue 17): real daemons (``controller run --store ray --runtime
ray``) sharing one namespace of a local Ray cluster started here, each with its own state dir
and API, and the same token.

- kill -9 the leader (of two daemons, and of three) under traffic through a standalone
  ``controller ingress --url A --also-url B``: a standby leads within the documented bound, the
  same replica actors serve, and no request fails;
- SIGSTOP the leader past its lease, let the standby take over and deploy a change, SIGCONT the
  old one: nothing it tries takes effect (the store and the replicas are as the new leader made
  them), and it stands by within one renew period of waking.

Real clock, every wait bounded by ``fail_after`` or a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import h11
import pytest
import trio

from controller._leadership.standby import store_view

from ..daemons import Daemon
from ..daemons import shown as until
from ..http_client import THINK_S, request
from ..replicas import events

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from controller.ray import RayKVStore  # noqa: E402
from controller.ray._fence_actor import ACTOR_NAMESPACE  # noqa: E402

from ..ray_cluster import local_cluster  # noqa: E402

HERE = Path(__file__).parent.parent
LIMIT_S = 90  # generous: each daemon is a Ray driver, and Ray workers take a while to start
#: The lease the daemons here hold: a standby claims once it has not seen the lease move for 5 s,
#: and reads it every 1 s. Longer than the defaults (2 s and 0.5 s), so that a starved machine (the
#: tests run beside each other, and must pass beside a CPU hog) does not lose a leader its lease
#: to a late renewal: the takeover under the defaults is measured by bench/failover_bench.py.
LEASE_S, RENEW_S = 5.0, 1.0
#: What a machine at load 20 adds to a bound of a few seconds (the tests run beside each other,
#: and must pass beside CPU hogs): a read of Ray's KV, a process scheduled late. The bounds say
#: that the lease decides (a takeover after it, a step-down within a renew period), not how fast:
#: bench/failover_bench.py measures that.
BUSY_S = 10.0
#: Leader killed to a standby leading: the lease, a read period, and the recovery (adopting
#: the actors), with a busy machine's margin.
TAKEOVER_BOUND_S = LEASE_S + RENEW_S + BUSY_S + 1.0
POLL_S = 0.02


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Two nodes on this machine, 2 CPUs each."""
    with local_cluster({"num_cpus": 2}, [{"num_cpus": 2}]) as ray_cluster:
        yield ray_cluster


_namespaces = iter(range(10**6))


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A namespace of its own; its replica actors and its fencing actor are killed at the end."""
    name = f"standby{os.getpid()}-{next(_namespaces)}"
    yield name
    for entry in ray.util.list_named_actors(True):
        if entry["namespace"] == name or (
            entry["namespace"] == ACTOR_NAMESPACE and entry["name"] == name
        ):
            with contextlib.suppress(ValueError):  # gone meanwhile
                ray.kill(ray.get_actor(entry["name"], namespace=entry["namespace"]))


@pytest.fixture
def new_dir() -> Iterator[Callable[[], Path]]:
    """Makes state dirs, one per daemon (short paths: Unix sockets), removed at the end."""
    made: list[Path] = []

    def make() -> Path:
        made.append(Path(tempfile.mkdtemp(prefix="sb", dir="/tmp")))
        return made[-1]

    yield make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def actors(namespace: str) -> set[str]:
    """The named actors of `namespace` now: the replicas."""
    return {e["name"] for e in ray.util.list_named_actors(True) if e["namespace"] == namespace}


@attrs.define
class Fleet:
    """Daemons of one store and runtime (a Ray namespace), started in turn (the first leads),
    with the same token."""

    cluster: Cluster
    namespace: str
    new_dir: Callable[[], Path]
    token: str = attrs.field(factory=lambda: os.urandom(16).hex())
    daemons: list[Daemon] = attrs.field(factory=list)

    async def start(self, nursery: trio.Nursery, count: int) -> list[Daemon]:
        for _ in range(count):
            daemon = Daemon(self.new_dir())
            await daemon.start(
                nursery,
                *("--runtime", "ray", "--store", "ray", "--ray-address", self.cluster.address),
                *("--namespace", self.namespace, "--no-ingress"),
                *("--lease-duration", str(LEASE_S), "--lease-renew", str(RENEW_S)),
                env={**os.environ, "CONTROLLER_TOKEN": self.token},
            )
            assert daemon.process is not None
            assert daemon.process.returncode is None, daemon.log.decode()
            self.daemons.append(daemon)
        roles = [await leadership(d) for d in self.daemons]
        assert [r["role"] for r in roles] == ["leader"] + ["standby"] * (count - 1), roles
        return self.daemons

    async def stop(self, leader: Daemon) -> None:
        """The standbys stopped (SIGTERM), then the leader shut down (every backend deleted):
        no standby takes over a store being emptied."""
        for daemon in self.daemons:
            if daemon is not leader and alive(daemon):
                assert await daemon.stop() == 0, daemon.log.decode()
        result = await leader.cli("shutdown")
        assert result.returncode == 0, result.stderr
        assert leader.process is not None
        assert await leader.process.wait() == 0


def alive(daemon: Daemon) -> bool:
    return daemon.process is not None and daemon.process.returncode is None


@contextlib.asynccontextmanager
async def killed_at_exit(fleet: Fleet, others: Sequence[trio.Process] = ()) -> AsyncIterator[None]:
    """Whatever happens in the test, none of the daemons (nor `others`) outlives it; a stopped
    one is woken too, so that it dies."""
    try:
        yield
    finally:
        processes = [d.process for d in fleet.daemons if d.process is not None]
        for process in [*processes, *others]:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                    process.send_signal(signal.SIGCONT)
            with trio.move_on_after(10, shield=True):
                await process.wait()


async def leadership(daemon: Daemon) -> dict[str, Any]:
    code, data = await daemon.http("GET", "/api/v1/backends")
    assert code == 200, data
    found: dict[str, Any] = data["leadership"]
    return found


async def first_leader(candidates: Sequence[Daemon], deadline: float) -> Daemon:
    """Poll `candidates` until one says it leads (by `deadline`, in ``time.monotonic``)."""
    while True:
        for daemon in candidates:
            if (await leadership(daemon))["role"] == "leader":
                return daemon
        assert time.monotonic() < deadline, "no standby took over in time"
        await trio.sleep(POLL_S)


def app(**fields: Any) -> dict[str, Any]:
    return {
        "entrypoint": "http_replica:HTTPReplica",
        "num_replicas": 2,
        "version": "v1",
        "route_prefix": "/app",
        "graceful_shutdown_timeout_s": 5,
        **fields,
    }


def healthy(n: int, *, view: bool = False) -> Any:
    """All `n` replicas serve, the goal reached; as a leader says it (its controller observed
    the last generation), or as a standby's `view` of the store does (it observes nothing)."""

    def check(status: dict[str, Any]) -> bool:
        return bool(
            status["state"] == "HEALTHY"
            and status["ready"] == n
            and len(status["replicas"]) == n
            and status["goal_done"]
            and (view or status["observed_generation"] == status["generation"])
        )

    return check


def serving(status: dict[str, Any]) -> dict[str, int]:
    """Each replica's tag and process (as a leader knows them)."""
    return {r["tag"]: r["pid"] for r in status["replicas"]}


def addresses(status: dict[str, Any]) -> dict[str, str]:
    """Each replica's tag and address (as a standby's view of the store knows them too)."""
    return {r["tag"]: r["address"] for r in status["replicas"]}


@attrs.define
class Traffic:
    """Requests through the ingress one after another by a few tasks; a refused connection or
    an answer other than 200 counts as a failure."""

    port: int
    ok: int = 0
    failures: list[str] = attrs.field(factory=list)
    stop: trio.Event = attrs.field(factory=trio.Event)
    _grew: trio.Event = attrs.field(factory=trio.Event)

    async def send(self) -> None:
        while not self.stop.is_set():
            try:
                answer = await request(self.port, "/app/any")
            except (OSError, ConnectionError) as exc:
                self.failures.append(repr(exc))
            else:
                if answer.status == 200:
                    self.ok += 1
                else:
                    self.failures.append(f"{answer.status}: {answer.body[:200]!r}")
            self._grew.set()
            self._grew = trio.Event()
            await trio.sleep(THINK_S)

    async def answered(self, count: int) -> None:
        while self.ok + len(self.failures) < count:
            await self._grew.wait()


async def standalone_ingress(
    nursery: trio.Nursery, leader: Daemon, standbys: Sequence[Daemon], token: str
) -> tuple[trio.Process, int]:
    """``controller ingress --url LEADER --also-url STANDBY...`` on a free port; its port."""
    process = await trio.lowlevel.open_process(
        [
            *leader.cli_argv(),
            *("--url", leader.url, f"--token={token}", "ingress", "--listen", "127.0.0.1:0"),
            *[arg for d in standbys for arg in ("--also-url", d.url)],
        ],
        stderr=subprocess.PIPE,
    )
    said = bytearray()
    port = trio.Event()
    found: list[int] = []

    async def read() -> None:
        assert process.stderr is not None
        async for chunk in process.stderr:
            said.extend(chunk)
            match = re.search(rb"serving on http://[0-9.]+:(\d+)", said)
            if match and not found:
                found.append(int(match.group(1)))
                port.set()
        port.set()

    nursery.start_soon(read)
    await port.wait()
    assert found, said.decode()
    return process, found[0]


@pytest.mark.parametrize("count", [2, 3])
async def test_kill_9_the_leader_under_traffic_a_standby_takes_over(
    cluster: Cluster, namespace: str, new_dir: Callable[[], Path], count: int
) -> None:
    fleet = Fleet(cluster, namespace, new_dir)
    ingress: list[trio.Process] = []
    with trio.fail_after(LIMIT_S * 2):
        async with killed_at_exit(fleet, ingress), trio.open_nursery() as nursery:
            first, *standbys = await fleet.start(nursery, count)
            body = json.dumps(app()).encode()
            code, data = await first.http("PUT", "/api/v1/backends/app", body)
            assert code == 200, data
            status = await until(first, "app", healthy(2))
            before = serving(status)
            assert actors(namespace) == set(before)
            for standby in standbys:  # their views of the store have the replicas too
                view = await until(standby, "app", healthy(2, view=True))
                assert addresses(view) == addresses(status)
            process, port = await standalone_ingress(nursery, first, standbys, fleet.token)
            ingress.append(process)
            deadline = time.monotonic() + LIMIT_S
            while (await request(port, "/app/any")).status != 200:
                assert time.monotonic() < deadline, "the ingress never routed /app"
                await trio.sleep(POLL_S)

            traffic = Traffic(port)
            async with trio.open_nursery() as senders:
                for _ in range(4):
                    senders.start_soon(traffic.send)
                await traffic.answered(40)
                assert first.process is not None
                first.process.kill()  # kill -9, under traffic
                killed_at = time.monotonic()
                leader = await first_leader(standbys, killed_at + LIMIT_S)
                led_at = time.monotonic()
                took = led_at - killed_at
                await first.process.wait()
                # Traffic goes on through the takeover, and after it.
                after = await until(leader, "app", healthy(2))
                await traffic.answered(traffic.ok + len(traffic.failures) + 40)
                traffic.stop.set()
            print(f"\n{count} daemons on Ray: kill -9 to a standby leading in {took:.2f}s")
            assert took <= TAKEOVER_BOUND_S, took
            assert traffic.failures == [], traffic.failures
            assert traffic.ok >= 80
            # The same actors serve: adopted, none restarted nor replaced.
            assert serving(after) == before
            assert actors(namespace) == set(before)
            held = await leadership(leader)
            assert (held["epoch"], held["address"]) == (2, leader.url)
            await leader.logged(b"leading as epoch 2")
            for other in standbys:
                if other is not leader:
                    # The third daemon follows the new leader, from its next read of the lease
                    # (one every renew period).
                    while (seen := await leadership(other))["epoch"] != 2:
                        assert time.monotonic() < led_at + RENEW_S + BUSY_S, seen
                        await trio.sleep(POLL_S)
                    assert (seen["role"], seen["address"]) == ("standby", leader.url), seen
            process.send_signal(signal.SIGTERM)
            assert await process.wait() == 0
            await fleet.stop(leader)
    assert actors(namespace) == set()


class RawRequest:
    """One HTTP request sent on a connection of its own before its answer is read: it sits in
    the socket's buffer while the daemon is stopped."""

    def __init__(self, stream: trio.SocketStream):
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)

    async def send(self, method: str, target: str, token: str, body: bytes) -> None:
        headers = [
            ("Host", "daemon"),
            ("Authorization", f"Bearer {token}"),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
        ]
        data = self.conn.send(h11.Request(method=method, target=target, headers=headers)) or b""
        data += self.conn.send(h11.Data(data=body)) or b""
        data += self.conn.send(h11.EndOfMessage()) or b""
        await self.stream.send_all(data)

    async def answer(self) -> tuple[int, bytes]:
        """The answer's status and body."""
        status, body = 0, bytearray()
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return status, bytes(body)


def recorder(path: Path, n: int, replicas: int) -> dict[str, Any]:
    return {
        "entrypoint": "replicas:Recorder",
        "init_kwargs": {"path": str(path)},
        "num_replicas": replicas,
        "version": "v1",
        "user_config": {"n": n},
        "health_check_period_s": 0.2,  # the old leader has commands to send when it wakes
        # Not replaced for checks late by a starved machine (3 late in a row, 0.6 s, were
        # seen beside a CPU hog): these tests are about who may act, not about health.
        "health_check_failure_threshold": 100,
        "graceful_shutdown_timeout_s": 5,
    }


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{name}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.MULTILINE)
    assert found is not None, f"{name} not in the metrics"
    return float(found.group(1))


async def test_a_leader_stopped_past_its_lease_changes_nothing_when_it_wakes(
    cluster: Cluster, namespace: str, new_dir: Callable[[], Path]
) -> None:
    record = new_dir() / "events.jsonl"
    fleet = Fleet(cluster, namespace, new_dir)
    with trio.fail_after(LIMIT_S * 2):
        async with killed_at_exit(fleet), trio.open_nursery() as nursery:
            old, new = await fleet.start(nursery, 2)
            body = json.dumps(recorder(record, n=1, replicas=2)).encode()
            code, data = await old.http("PUT", "/api/v1/backends/app", body)
            assert code == 200, data
            first = serving(await until(old, "app", healthy(2)))
            assert old.process is not None

            old.process.send_signal(signal.SIGSTOP)
            stopped_at = time.monotonic()
            assert await first_leader([new], stopped_at + LIMIT_S) is new
            took = time.monotonic() - stopped_at
            # The new leader deploys a change: one more replica, a new user_config.
            change = json.dumps(recorder(record, n=2, replicas=3)).encode()
            code, data = await new.http("PUT", "/api/v1/backends/app", change)
            assert code == 200, data
            wanted = serving(await until(new, "app", healthy(3)))
            assert set(first) < set(wanted)
            assert {first[tag] for tag in first} == {wanted[tag] for tag in first}
            reconfigured = {
                e["pid"]
                for e in events(str(record))
                if e["what"] == "reconfigure" and e["config"] == {"n": 2}
            }
            assert reconfigured == set(wanted.values())

            # A change sent to the old leader while it is stopped, read the moment it wakes.
            host, port = old.url.removeprefix("http://").rsplit(":", 1)
            stale = RawRequest(await trio.open_tcp_stream(host, int(port)))
            body = json.dumps(recorder(record, n=99, replicas=1)).encode()
            await stale.send("PUT", "/api/v1/backends/app", fleet.token, body)
            old.process.send_signal(signal.SIGCONT)
            woken_at = time.monotonic()
            while (await leadership(old))["role"] != "standby":
                assert time.monotonic() - woken_at < LIMIT_S
                await trio.sleep(POLL_S)
            stepped_down = time.monotonic() - woken_at
            async with stale.stream:
                status, answer = await stale.answer()
            print(
                f"\nSIGSTOP: a standby leading {took:.2f}s after; the old leader standing by "
                f"{stepped_down * 1000:.0f}ms after SIGCONT; its change answered {status} "
                f"{answer[:300]!r}"
            )
            assert took <= TAKEOVER_BOUND_S, took
            assert status not in range(200, 300), answer
            assert stepped_down <= RENEW_S + BUSY_S, stepped_down
            await old.logged(b"stopped leading (epoch 1)")

            # The store holds the new leader's change, as the new leader and the old one (now
            # a standby reading it) both say.
            stored = await store_view(await RayKVStore(namespace).read_all(), [str(HERE)])
            in_store = stored.status("app")
            assert in_store.backend_config.num_replicas == 3
            assert in_store.backend_config.user_config == {"n": 2}
            assert {r.tag for r in in_store.replicas} == set(wanted)
            after = await until(old, "app", healthy(3, view=True))
            assert after["config"]["user_config"] == {"n": 2}
            assert set(addresses(after)) == set(wanted)
            # The replicas are those the new leader wants: none drained, killed, restarted
            # or reconfigured since, by the old leader or anyone.
            now = await until(new, "app", healthy(3))
            assert serving(now) == wanted
            assert now["config"]["user_config"] == {"n": 2}
            assert actors(namespace) == set(wanted)
            seen = events(str(record))
            assert [e for e in seen if e["what"] in ("drain", "drained")] == []
            assert sorted(e["pid"] for e in seen if e["what"] == "init") == sorted(wanted.values())
            configs = [e["config"] for e in seen if e["what"] == "reconfigure"]
            assert {"n": 99} not in configs
            latest = {e["pid"]: e["config"] for e in seen if e["what"] == "reconfigure"}
            assert latest == {pid: {"n": 2} for pid in wanted.values()}

            _, metrics = await old.http("GET", "/metrics")
            refusals = metric(metrics, "controller_fenced_refusals_total")
            print(f"the old leader's fenced refusals: {refusals:g}")
            assert metric(metrics, "controller_leader") == 0
            assert (await leadership(old))["address"] == new.url
            await fleet.stop(new)
    assert actors(namespace) == set()
