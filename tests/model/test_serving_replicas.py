"""The replicas of a snapshot (``ServingReplicas``): read as a tuple whatever was changed, and
a change in a large backend makes a snapshot that shares nearly all of the one before it
rather than a copy of every serving replica."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import controller
from controller._model.views.serving import ServingReplicas
from controller.testing import FakeRuntime, FakeState

from ..conftest import RC, config, opened, settle


def view(i: int) -> controller.ServingReplica:
    return controller.ServingReplica(f"a#{i}", "v1", f"fake://{i}")


@settings(max_examples=100, deadline=None)
@given(
    start=st.integers(0, 1100),
    ops=st.lists(st.tuples(st.sampled_from(["append", "replace", "pop"]), st.integers(0, 5000))),
)
def test_every_change_reads_as_the_same_change_of_a_tuple(
    start: int, ops: list[tuple[str, int]]
) -> None:
    model = [view(i) for i in range(start)]
    seq = ServingReplicas(model)
    before = (seq, tuple(model))
    for op, n in ops:
        if op == "append":
            model.append(view(n))
            seq = seq.appended(view(n))
        elif model and op == "replace":
            model[n % len(model)] = view(-n)
            seq = seq.replaced(n % len(model), view(-n))
        elif model:
            model.pop()
            seq = seq.without_last()
        assert len(seq) == len(model)
    assert seq == tuple(model)
    assert list(seq) == model
    assert [seq[i] for i in range(len(model))] == model
    if model:
        assert seq[-1] == model[-1]
        assert seq[1:3] == tuple(model[1:3])
    assert seq == ServingReplicas(model)
    assert hash(seq) == hash(tuple(model))
    # Each change made a new one: the first is as it was.
    assert before[0] == before[1]


def test_it_refuses_positions_it_does_not_hold() -> None:
    seq = ServingReplicas([view(0)])
    with pytest.raises(IndexError):
        _ = seq[1]
    with pytest.raises(IndexError):
        seq.replaced(1, view(1))
    with pytest.raises(IndexError):
        ServingReplicas().without_last()
    assert ServingReplicas() == ()
    assert seq != (view(1),)


async def test_a_crash_in_a_large_backend_copies_no_serving_replica_but_a_few_nodes() -> None:
    # 2,000 replicas are 63 leaves of 32 under 2 nodes under a root: a replica gone and its
    # replacement each change a path or two (at most 3 nodes each), whatever the size.
    # Were the snapshot a copy of every serving replica, it would share no node at all.
    rt = FakeRuntime(auto_ready=True)
    at_once = controller.RestartPolicy(initial_delay_s=0.0, jitter=0.0)
    async with opened(rt, policy=at_once) as ctl:
        await (await ctl.deploy("a", config(num_replicas=2000), RC)).wait()
        await settle()
        before = ctl.snapshot("a")
        assert len(before.replicas) == 2000
        nodes = before.replicas.node_count()
        assert nodes >= 66
        rt.crash(before.replicas[1234].tag)
        await settle()
        after = ctl.snapshot("a")
        assert len(after.replicas) == 2000
        assert after.snapshot_id > before.snapshot_id
        assert before.replicas[1234].tag not in {r.tag for r in after.replicas}
        assert {r.tag for r in after.replicas} - {r.tag for r in before.replicas}
        # Two snapshots were published (one without the dead replica, one with the new one):
        # together they made at most 4 paths of 3 nodes anew.
        assert after.replicas.node_count() - after.replicas.nodes_shared_with(before.replicas) <= 12
        # The order of the others is kept: only the dead one's place and the last changed.
        moved = [i for i in range(2000) if after.replicas[i] != before.replicas[i]]
        assert len(moved) <= 2
        # And the runtime agrees with the watch.
        assert {r.tag for r in after.replicas} == set(rt.tags(FakeState.READY))
