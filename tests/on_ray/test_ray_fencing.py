"""Fencing on Ray (issue 17): the lease in RayKVStore, and replicas that refuse a stale leader.

Against a real local Ray cluster started here. Real clock, every wait bounded by fail_after.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

import controller
from controller import FencedError
from controller._model.decisions.lease import Lease, claimed, renewed

from ..replicas import events

ray = pytest.importorskip("ray")
from ray._private import state as ray_state  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from ray.experimental import internal_kv  # noqa: E402

from controller.ray import RayKVStore, RayRuntime  # noqa: E402
from controller.ray import _runtime as ray_runtime  # noqa: E402
from controller.ray._fence_actor import ACTOR_NAMESPACE  # noqa: E402

from ..ray_cluster import local_cluster  # noqa: E402

HERE = Path(__file__).parent.parent
#: Generous: a Ray worker process takes a while to start on a busy machine (beside a CPU hog
#: and another test run, two actor starts took past 60 s).
LIMIT_S = 120


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """One node on this machine."""
    with local_cluster({"num_cpus": 2}) as ray_cluster:
        yield ray_cluster


_namespaces = iter(range(10**6))


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A namespace of its own; its fencing actor and replicas are killed at the end."""
    name = f"fence{os.getpid()}-{next(_namespaces)}"
    yield name
    for entry in ray.util.list_named_actors(True):
        if entry["namespace"] in (name, ACTOR_NAMESPACE) and (
            entry["namespace"] == name or entry["name"] == name
        ):
            handle = ray.get_actor(entry["name"], namespace=entry["namespace"])
            ray.kill(handle, no_restart=True)


def lease_after(seen: Lease | None, holder: str) -> Lease:
    return claimed(seen, holder=holder, duration_s=2.0, pid=os.getpid(), wall=time.time())


def kv_get(namespace: str, key: bytes) -> bytes | None:
    value: bytes | None = internal_kv._internal_kv_get(key, namespace=namespace)
    return value


# -- the lease on RayKVStore --


async def test_a_claim_over_none_then_claims_over_a_stale_view_fail(namespace: str) -> None:
    store = RayKVStore(namespace)
    with trio.fail_after(LIMIT_S):
        assert await store.read_lease() is None
        first = lease_after(None, "a")
        assert await store.claim_lease(None, first)
        assert await store.read_lease() == first
        # Someone else who also saw no lease is too late.
        assert not await RayKVStore(namespace).claim_lease(None, lease_after(None, "b"))
        assert await store.read_lease() == first
        # A renewal moves the lease: a claim over the view from before it fails too.
        kept = renewed(first, wall=time.time(), address="127.0.0.1:1")
        await store.renew_lease(kept)
        assert not await RayKVStore(namespace).claim_lease(first, lease_after(first, "b"))
        assert await store.read_lease() == kept
        # The lease is not intent: read_all does not show it.
        assert await store.read_all() == {}


async def test_a_renewal_by_a_fenced_epoch_is_refused(namespace: str) -> None:
    store, other = RayKVStore(namespace), RayKVStore(namespace)
    with trio.fail_after(LIMIT_S):
        first = lease_after(None, "a")
        assert await store.claim_lease(None, first)
        second = lease_after(first, "b")
        assert second.epoch == 2
        assert await other.claim_lease(first, second)
        with pytest.raises(FencedError) as info:
            await store.renew_lease(renewed(first, wall=time.time(), address=None))
        assert (info.value.epoch, info.value.newer) == (1, 2)
        assert await store.read_lease() == second  # nothing of the renewal stored
        # The holder's own renewal (and release) goes through.
        released = renewed(second, wall=time.time(), address=None)
        await other.renew_lease(released)
        assert await store.read_lease() == released


async def test_write_fenced_lands_only_for_the_current_epoch(namespace: str) -> None:
    a, b = RayKVStore(namespace), RayKVStore(namespace)
    with trio.fail_after(LIMIT_S):
        with pytest.raises(FencedError) as info:
            await a.write_fenced(1, {"x": "1"})  # nobody holds the lease: only epoch 0 would do
        assert info.value.newer == 0
        first = lease_after(None, "a")
        assert await a.claim_lease(None, first)
        await a.write_fenced(1, {"x": "1"})
        await a.write_fenced(1, {"y": "1", "z": "1"})
        assert await b.read_all() == {"x": "1", "y": "1", "z": "1"}
        assert await b.claim_lease(first, lease_after(first, "b"))
        # A leader that believes it still leads (it read epoch 1 before the claim) is refused:
        # one key, several, and none.
        for changes in ({"x": "stale"}, {"y": "stale", "w": "stale"}, {}):
            with pytest.raises(FencedError) as info:
                await a.write_fenced(1, changes)
            assert (info.value.epoch, info.value.newer) == (1, 2)
        with pytest.raises(FencedError):
            await a.write_fenced(3, {"x": "future"})  # an epoch nobody was granted
        assert await b.read_all() == {"x": "1", "y": "1", "z": "1"}
        await b.write_fenced(2, {"x": "2", "y": None, "w": "2"})
        assert await a.read_all() == {"x": "2", "z": "1", "w": "2"}
        # Plain writes, for a controller that leads nobody, work as before.
        await a.write({"p": "plain", "q": "plain"})
        assert (await b.read_all())["p"] == "plain"


async def test_many_concurrent_claims_one_wins(namespace: str) -> None:
    seed = RayKVStore(namespace)
    with trio.fail_after(LIMIT_S):
        first = lease_after(None, "first")
        assert await seed.claim_lease(None, first)
        stores = [RayKVStore(namespace) for _ in range(16)]
        won: dict[int, bool] = {}

        async def claim(i: int) -> None:
            won[i] = await stores[i].claim_lease(first, lease_after(first, f"h{i}"))

        async with trio.open_nursery() as nursery:
            for i in range(len(stores)):
                nursery.start_soon(claim, i)
        winners = [i for i, ok in won.items() if ok]
        assert len(won) == len(stores)
        assert len(winners) == 1
        lease = await seed.read_lease()
        assert lease is not None
        assert (lease.epoch, lease.holder) == (2, f"h{winners[0]}")


async def test_stale_writes_racing_a_claim_never_land_after_it(namespace: str) -> None:
    # Stale writers keep writing at epoch 1 while the lease is claimed for epoch 2, so that some
    # of their writes are on their way to the actor as the claim reaches it. Each of them sets
    # "x"; epoch 2 sets it once, right after its claim: if any stale write could land after the
    # claim, "x" would not end as epoch 2 left it.
    writers = [RayKVStore(namespace) for _ in range(8)]
    claimer = RayKVStore(namespace)
    landed: dict[int, int] = {}
    refused: dict[int, int | None] = {}
    some_landed = trio.Event()
    with trio.fail_after(LIMIT_S):
        first = lease_after(None, "a")
        assert await claimer.claim_lease(None, first)

        async def stale(i: int) -> None:
            n = 0
            while True:
                try:
                    await writers[i].write_fenced(
                        1, {"x": f"{i}.{n}", f"y{i}": f"{n}", f"z{i}": f"{n}"}
                    )
                except FencedError as exc:
                    refused[i] = exc.newer
                    return
                landed[i] = n
                n += 1
                if sum(landed.values()) >= 8:
                    some_landed.set()

        async def claim() -> None:
            await some_landed.wait()
            assert await claimer.claim_lease(first, lease_after(first, "b"))
            await claimer.write_fenced(2, {"x": "epoch 2"})

        async with trio.open_nursery() as nursery:
            for i in range(len(writers)):
                nursery.start_soon(stale, i)
            nursery.start_soon(claim)
        data = await claimer.read_all()
    assert refused == dict.fromkeys(range(len(writers)), 2)  # every stale writer was stopped
    assert data["x"] == "epoch 2"
    for i in range(len(writers)):  # each batch in full, the last that landed
        expected = str(landed[i]) if i in landed else None
        assert (data.get(f"y{i}"), data.get(f"z{i}")) == (expected, expected)


async def test_a_stale_write_already_on_its_way_when_the_claim_arrives_is_refused(
    namespace: str,
) -> None:
    # The actor is stopped (SIGSTOP) so that both calls wait at it: the claim first, then a
    # write from epoch 1 sent while epoch 1 was still the stored one (any check made before the
    # actor runs the write would pass). One store, one handle: Ray runs them in that order.
    store = RayKVStore(namespace)
    with trio.fail_after(LIMIT_S):
        first = lease_after(None, "a")
        assert await store.claim_lease(None, first)
        await store.write_fenced(1, {"x": "1"})
        actor = ray.get_actor(namespace, namespace=ACTOR_NAMESPACE)
        pid = ray_state.actors(actor_id=actor._actor_id.hex())["Pid"]
        outcome: dict[str, object] = {}

        async def claim() -> None:
            outcome["claim"] = await store.claim_lease(first, lease_after(first, "b"))

        async def stale_write() -> None:
            try:
                await store.write_fenced(1, {"x": "stale", "y": "stale"})
                outcome["write"] = "landed"
            except FencedError as exc:
                outcome["write"] = exc.newer

        os.kill(pid, signal.SIGSTOP)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(claim)
                await trio.testing.wait_all_tasks_blocked()  # the claim is at the actor
                assert await store.read_lease() == first  # and has not run
                nursery.start_soon(stale_write)
                await trio.testing.wait_all_tasks_blocked()
                assert outcome == {}
                os.kill(pid, signal.SIGCONT)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert outcome == {"claim": True, "write": 2}
        assert await store.read_all() == {"x": "1"}


async def test_a_fenced_batch_cut_short_lands_in_full_before_anything_later(
    namespace: str,
) -> None:
    store = RayKVStore(namespace)
    with trio.fail_after(LIMIT_S):
        first = lease_after(None, "a")
        assert await store.claim_lease(None, first)
        # A crash of the actor halfway through a batch: its journal, one key of two applied.
        internal_kv._internal_kv_put(b"fenced-journal", '{"a": "1", "b": "1"}', namespace=namespace)
        internal_kv._internal_kv_put(b"k/a", "1", namespace=namespace)
        assert await RayKVStore(namespace).read_all() == {"a": "1", "b": "1"}  # via the actor
        assert kv_get(namespace, b"fenced-journal") is None

        # The same, then the actor really dies: Ray restarts it, and it finishes the batch
        # before it answers anything (here a claim), with the lease as stored. It is stopped
        # first, so that the old process runs nothing more (ray.kill returns before it is dead).
        actor = ray.get_actor(namespace, namespace=ACTOR_NAMESPACE)
        pid = ray_state.actors(actor_id=actor._actor_id.hex())["Pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            internal_kv._internal_kv_put(
                b"fenced-journal", '{"c": "1", "d": "1"}', namespace=namespace
            )
            internal_kv._internal_kv_put(b"k/c", "1", namespace=namespace)
            await trio.to_thread.run_sync(lambda: ray.kill(actor, no_restart=False))
            second = lease_after(first, "b")
            failures: list[str] = []
            while True:
                # A call sent to the old process fails, and so does one while Ray restarts the
                # actor (as many as the restart takes, on a busy machine): asked again, as the
                # controller does, until the new one answers.
                try:
                    claimed_now = await store.claim_lease(first, second)
                    break
                except controller.StoreError as exc:
                    failures.append(str(exc))
                    await trio.sleep(0.05)
            assert claimed_now
            # Each failure is the actor being gone or restarting, never a refusal of the claim.
            for failure in failures:
                assert "died" in failure or "Unavailable" in failure, failures
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert kv_get(namespace, b"k/d") == b"1"
        assert kv_get(namespace, b"fenced-journal") is None
        with pytest.raises(FencedError):
            await store.write_fenced(1, {"a": "stale"})
        assert await store.read_all() == {"a": "1", "b": "1", "c": "1", "d": "1"}


# -- fenced replicas on RayRuntime --


def spec(record: Path, tag: str = "a#1") -> controller.ReplicaSpec:
    return controller.ReplicaSpec(
        tag=tag,
        backend="a",
        version="v1",
        replica_config=controller.ReplicaConfig(
            "replicas:BlockingRecorder", init_kwargs={"path": str(record)}
        ),
        user_config={"n": 0},
        resources={},
    )


@contextlib.asynccontextmanager
async def two_runtimes(namespace: str) -> AsyncIterator[tuple[RayRuntime, RayRuntime]]:
    """Two controllers' runtimes on one namespace, both serving."""
    a = RayRuntime(namespace=namespace, pythonpath=[HERE])
    b = RayRuntime(namespace=namespace, pythonpath=[HERE])
    async with trio.open_nursery() as nursery:
        await nursery.start(a.serve, lambda tag, reason: None)
        await nursery.start(b.serve, lambda tag, reason: None)
        yield a, b
        nursery.cancel_scope.cancel()


def what(record: Path) -> list[object]:
    return [e.get("config", e["what"]) for e in events(str(record)) if e["what"] != "init"]


async def refused(op: Callable[[], Awaitable[object]], epoch: int, newer: int) -> None:
    with pytest.raises(FencedError) as info:
        await op()
    assert (info.value.epoch, info.value.newer) == (epoch, newer)


async def test_a_stale_leader_is_refused_once_another_adopts(
    namespace: str, tmp_path: Path
) -> None:
    record = tmp_path / "events.jsonl"
    with trio.fail_after(LIMIT_S):
        async with two_runtimes(namespace) as (a, b):
            a.fence(1)
            started = await a.start_replica(spec(record))
            await a.reconfigure_replica("a#1", {"n": 1})  # the leader's commands work
            await a.check_health_replica("a#1")
            b.fence(2)
            adopted = await b.adopt_replica("a#1")
            assert adopted.pid == started.pid
            await refused(lambda: a.reconfigure_replica("a#1", {"n": "stale"}), 1, 2)
            await refused(lambda: a.drain_replica("a#1"), 1, 2)
            await refused(lambda: a.check_health_replica("a#1"), 1, 2)
            await refused(lambda: a.kill_replica("a#1"), 1, 2)
            await refused(lambda: a.adopt_replica("a#1"), 1, 2)
            # Nothing of them took effect: the actor serves on, for the new leader.
            assert await b.list_replicas() == ["a#1"]
            await b.check_health_replica("a#1")
            assert what(record) == [{"n": 0}, {"n": 1}]
            await b.reconfigure_replica("a#1", {"n": 2})
            await b.drain_replica("a#1")
            assert what(record) == [{"n": 0}, {"n": 1}, {"n": 2}, "drain", "drained"]
            await b.kill_replica("a#1")
            assert await b.list_replicas() == []
            await b.kill_replica("a#1")  # idempotent


async def test_a_higher_command_raises_the_epoch_and_unfenced_is_outranked(
    namespace: str, tmp_path: Path
) -> None:
    record = tmp_path / "events.jsonl"
    with trio.fail_after(LIMIT_S):
        async with two_runtimes(namespace) as (a, b):
            await a.start_replica(spec(record))  # a never fenced: epoch 0
            await a.reconfigure_replica("a#1", {"n": 1})
            b.fence(3)
            await b.check_health_replica("a#1")  # any command from a higher epoch raises it
            await refused(lambda: a.drain_replica("a#1"), 0, 3)
            await refused(lambda: a.kill_replica("a#1"), 0, 3)
            a.fence(2)
            await refused(lambda: a.reconfigure_replica("a#1", {"n": "stale"}), 2, 3)
            a.fence(4)
            await a.reconfigure_replica("a#1", {"n": 4})  # and b is now the stale one
            await refused(lambda: b.kill_replica("a#1"), 3, 4)
            assert what(record) == [{"n": 0}, {"n": 1}, {"n": 4}]
            with pytest.raises(controller.ConfigError):
                a.fence(3)  # epochs only grow
            await a.kill_replica("a#1")
            assert await a.list_replicas() == []


async def test_an_actor_that_does_not_answer_is_killed_unasked(
    namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The documented limit: a hung actor cannot check an epoch, so even a stale leader's kill
    # lands (else a hung replica could never be stopped).
    monkeypatch.setattr(ray_runtime, "_STOP_ANSWER_S", 0.5)
    record = tmp_path / "events.jsonl"
    with trio.fail_after(LIMIT_S):
        async with two_runtimes(namespace) as (a, b):
            a.fence(1)
            await a.start_replica(spec(record))
            b.fence(2)
            info = await b.adopt_replica("a#1")
            assert info.pid is not None
            os.kill(info.pid, signal.SIGSTOP)
            try:
                before = trio.current_time()
                await a.kill_replica("a#1")
                assert trio.current_time() - before >= 0.5
                assert await b.list_replicas() == []
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(info.pid, signal.SIGKILL)
