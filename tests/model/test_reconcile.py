"""The decision step on its own: no runtime, no store, no trio."""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st

from controller._model.decisions.census import Census
from controller._model.decisions.reconcile import (
    Plan,
    Target,
    _walked,
    decide,
    resolve_limits,
    stop_order,
)
from controller._model.records.replica_state import ReplicaState

S = ReplicaState


@attrs.frozen
class R:
    tag: str
    state: ReplicaState
    version: str = "v1"
    config_digest: str = "d1"
    seq: int = 0
    healthy: bool = True
    node: str | None = None
    served: bool = False


def target(n: int, **kwargs: object) -> Target:
    return Target(num_replicas=n, version="v1", config_digest="d1", **kwargs)  # type: ignore[arg-type]


def test_scale_up_starts_every_missing_replica_at_once() -> None:
    assert decide(target(5), [R("a", S.RUNNING)]) == Plan(start=4)


def test_converged() -> None:
    assert decide(target(2), [R("a", S.RUNNING), R("b", S.RUNNING)]).converged


def test_scale_down_stops_starting_before_running_newest_first() -> None:
    replicas = [
        R("run-old", S.RUNNING, seq=1),
        R("run-new", S.RUNNING, seq=2),
        R("starting", S.STARTING, seq=3),
        R("recovering", S.RECOVERING, seq=0),
    ]
    assert decide(target(2), replicas).stop == ("starting", "recovering")
    assert decide(target(1), replicas).stop == ("starting", "recovering", "run-new")


def test_stopping_replicas_are_not_counted_and_block_convergence() -> None:
    plan = decide(target(1), [R("a", S.RUNNING), R("b", S.STOPPING)])
    assert plan == Plan(converged=False)


def test_delete_stops_everything_and_converges_when_empty() -> None:
    plan = decide(target(3, deleting=True), [R("a", S.RUNNING), R("b", S.STARTING)])
    assert plan.stop == ("b", "a")
    assert not plan.converged
    assert decide(target(3, deleting=True), []).converged


def test_new_version_keeps_old_serving_until_new_serve() -> None:
    old = [R("o1", S.RUNNING, version="v0"), R("o2", S.RUNNING, version="v0")]
    assert decide(target(2, max_surge=2), old) == Plan(start=2)
    one_new = [*old, R("n1", S.RUNNING, seq=5), R("n2", S.STARTING, seq=6)]
    assert len(decide(target(2, max_surge=2), one_new).stop) == 1
    both = [*old, R("n1", S.RUNNING), R("n2", S.RUNNING)]
    assert set(decide(target(2, max_surge=2), both).stop) == {"o1", "o2"}


def test_blocked_starts_leave_old_version_serving() -> None:
    old = [R("o1", S.RUNNING, version="v0")]
    assert decide(target(1, starts_blocked=True), old) == Plan()


def test_a_halted_deploy_stops_what_it_still_has_starting() -> None:
    replicas = [
        R("o1", S.RUNNING, version="v0", served=True),
        R("o2", S.RUNNING, version="v0", served=True),
        R("s", S.STARTING, seq=1),
        R("r", S.RECOVERING, seq=2),  # being adopted after a restart, never served
        R("n", S.RUNNING, seq=3, served=True),
    ]
    plan = decide(target(2, starts_blocked=True, halted=True, max_surge=1), replicas)
    # The old ones and the new one that serves all stay, a surge over n included.
    assert set(plan.stop) == {"s", "r"}
    assert plan.start == 0
    # Blocked without halting (a spec too large for the runtime at recovery): a start goes on.
    assert "s" not in decide(target(2, starts_blocked=True, max_surge=1), replicas).stop


def test_changed_user_config_reconfigures_running_replicas_in_place() -> None:
    replicas = [R("a", S.RUNNING, config_digest="d0"), R("b", S.STARTING, config_digest="d0")]
    plan = decide(target(2), replicas)
    assert plan.reconfigure == ("a",)
    assert plan.start == 0
    assert plan.stop == ()


states = st.sampled_from(list(ReplicaState))


@given(
    n=st.integers(0, 6),
    replicas=st.lists(
        st.tuples(states, st.sampled_from(["v0", "v1"]), st.sampled_from(["d0", "d1"])), max_size=10
    ),
    blocked=st.booleans(),
)
def test_plan_invariants(
    n: int, replicas: list[tuple[ReplicaState, str, str]], blocked: bool
) -> None:
    views = [R(f"r{i}", s, v, d, seq=i) for i, (s, v, d) in enumerate(replicas)]
    plan = decide(target(n, starts_blocked=blocked), views)
    by_tag = {r.tag: r for r in views}
    # Never stops a replica twice, never touches one that is already stopping.
    assert len(set(plan.stop)) == len(plan.stop)
    assert all(by_tag[t].state is not S.STOPPING for t in plan.stop)
    # Never more target-version replicas than asked for, after the plan; and with no older
    # version around, exactly as many (unless starts are blocked).
    current = [r for r in views if r.version == "v1" and r.state is not S.STOPPING]
    old = [r for r in views if r.version != "v1" and r.state is not S.STOPPING]
    kept = [r for r in current if r.tag not in plan.stop]
    assert len(kept) + plan.start <= n
    leaving = any(r.state is S.STOPPING and r.version != "v1" for r in views)
    if not old and not leaving and not blocked:
        assert len(kept) + plan.start == n
    # During an update, never more than max_surge (1 here) above n, counting what was there,
    # replicas still stopping included.
    if old or leaving:
        assert plan.start <= max(0, n + 1 - len(views))
    # Serving capacity never drops below the target because of the plan.
    serving = [r for r in views if r.state in (S.RUNNING, S.UPDATING)]
    serving_after = [r for r in serving if r.tag not in plan.stop]
    assert len(serving_after) >= min(n, len(serving))
    assert not (blocked and plan.start)
    if plan.converged:
        assert plan == Plan(converged=True)
        assert len(views) == n


def test_scale_down_order_not_started_then_unhealthy_then_older_then_newest() -> None:
    replicas = [
        R("old-running", S.RUNNING, version="v0", seq=1),
        R("new-running-first", S.RUNNING, seq=2),
        R("new-running-last", S.RUNNING, seq=9),
        R("unhealthy", S.RUNNING, seq=3, healthy=False),
        R("starting", S.STARTING, seq=8),
    ]
    ordered = [r.tag for r in stop_order(replicas, "v1")]
    assert ordered == [
        "starting",
        "unhealthy",
        "old-running",
        "new-running-last",
        "new-running-first",
    ]


def test_rolling_limits_resolve_like_kubernetes() -> None:
    assert resolve_limits(10, 0.25, 0.25) == (3, 2)  # surge rounds up, unavailable down
    assert resolve_limits(1, 0.25, 0.25) == (1, 0)
    assert resolve_limits(4, 0, 0.0) == (0, 1)  # never both 0
    assert resolve_limits(4, 2, 1) == (2, 1)  # ints are counts


@given(
    n=st.integers(0, 8),
    surge=st.integers(0, 3),
    unavailable=st.integers(0, 3),
    replicas=st.lists(
        st.tuples(states, st.sampled_from(["v0", "v1"]), st.booleans(), st.booleans()),
        max_size=12,
    ),
    blocked=st.booleans(),
)
def test_rolling_update_guarantees(
    n: int,
    surge: int,
    unavailable: int,
    replicas: list[tuple[ReplicaState, str, bool, bool]],
    blocked: bool,
) -> None:
    if surge == 0 and unavailable == 0:
        unavailable = 1  # what resolve_limits guarantees
    views = [
        R(f"r{i}", s, v, seq=i, healthy=h, served=served)
        for i, (s, v, h, served) in enumerate(replicas)
    ]
    target = Target(
        num_replicas=n,
        version="v1",
        config_digest="d1",
        max_surge=surge,
        max_unavailable=unavailable,
        starts_blocked=blocked,
    )
    plan = decide(target, views)
    live = [r for r in views if r.state is not S.STOPPING]
    old = [r for r in live if r.version != "v1"]
    stopped = set(plan.stop)

    def available(r: R) -> bool:
        # Serving, or being adopted after having served (it may serve still).
        serving = r.state in (S.RUNNING, S.UPDATING) or (r.state is S.RECOVERING and r.served)
        return serving and r.healthy

    before = sum(1 for r in live if available(r))
    after = sum(1 for r in live if available(r) and r.tag not in stopped)
    leaving = any(r.state is S.STOPPING and r.version != "v1" for r in views)
    if old or leaving:
        # Starts never take the total, replicas still stopping included, above
        # num_replicas + max_surge.
        if plan.start:
            assert len(views) + plan.start <= n + surge
        # Availability never drops below num_replicas - max_unavailable because of the plan,
        # nor below num_replicas before the new version serves or after the deploy failed.
        new_serves = any(r.version == "v1" and r.state in (S.RUNNING, S.UPDATING) for r in live)
        floor = n - unavailable if ((new_serves or surge == 0) and not blocked) else n
        assert after >= min(before, floor)
    if blocked:
        assert plan.start == 0
    # Reconfigures: target-version RUNNING replicas only, at most max(1, unavailable) at a time.
    updating = sum(1 for r in live if r.version == "v1" and r.state is S.UPDATING)
    assert len(plan.reconfigure) <= max(0, max(1, unavailable) - updating)


@given(
    n=st.integers(0, 6),
    replicas=st.lists(
        st.tuples(
            states,
            st.sampled_from(["v0", "v1"]),
            st.sampled_from(["d0", "d1"]),
            st.booleans(),
            st.booleans(),
        ),
        max_size=10,
    ),
    flags=st.sets(st.sampled_from(["starts_blocked", "starts_deferred", "halted", "deleting"])),
)
def test_deciding_from_the_counts_is_deciding_from_the_replicas(
    n: int, replicas: list[tuple[ReplicaState, str, str, bool, bool]], flags: set[str]
) -> None:
    """The counts decide alone where they can (a settled backend's events: no replica is
    looked at); wherever they do, the plan is the one walking every replica gives."""
    views = [
        R(f"r{i}", s, v, d, seq=i, healthy=h, served=sv)
        for i, (s, v, d, h, sv) in enumerate(replicas)
    ]
    chosen = target(n, **dict.fromkeys(flags, True))
    assert decide(chosen, views) == _walked(chosen, views)
    assert decide(chosen, views, Census.of(views)) == _walked(chosen, views)


# -- nodes: drains and node-aware scale-downs --


def on(node: str, tag: str, seq: int, version: str = "v1") -> R:
    return R(tag, S.RUNNING, version=version, seq=seq, node=node)


def test_a_drain_starts_replacements_first_and_stops_nothing_until_they_serve() -> None:
    replicas = [on("a", "a1", 1), on("a", "a2", 2), on("b", "b1", 3), on("c", "c1", 4)]
    plan = decide(target(4, max_unavailable=1, max_surge=1, evict=frozenset({"a"})), replicas)
    # Both of node a's replicas are replaced at once (beyond the surge of 1), none stopped yet.
    assert plan == Plan(start=2)
    started = [*replicas, R("n1", S.STARTING, seq=5, node="b"), R("n2", S.RUNNING, seq=6)]
    plan = decide(target(4, max_unavailable=1, max_surge=1, evict=frozenset({"a"})), started)
    # One replacement serves: one of node a's goes (make before break), the newest first.
    assert plan == Plan(stop=("a2",))


def test_a_drain_spends_the_budget_only_while_no_replacement_can_start() -> None:
    replicas = [on("a", "a1", 1), on("a", "a2", 2), on("b", "b1", 3), on("c", "c1", 4)]
    evict = frozenset({"a"})
    blocked = decide(target(4, max_unavailable=1, starts_deferred=True, evict=evict), replicas)
    assert blocked == Plan(stop=("a2",))  # 3 of 4 stay available: the budget of 1
    none = decide(
        target(4, max_unavailable=0, max_surge=1, starts_deferred=True, evict=evict), replicas
    )
    assert none == Plan()


def test_a_drain_past_its_deadline_stops_the_node_s_replicas_now() -> None:
    replicas = [on("a", "a1", 1), on("a", "a2", 2), on("b", "b1", 3)]
    plan = decide(target(3, max_unavailable=0, evict_now=frozenset({"a"})), replicas)
    assert plan == Plan(start=2, stop=("a1", "a2"))


def test_a_drain_of_a_node_without_the_backend_changes_nothing() -> None:
    replicas = [on("b", "b1", 1), on("c", "c1", 2)]
    assert decide(target(2, evict=frozenset({"a"})), replicas).converged


def test_a_scale_down_takes_from_the_fullest_nodes_when_spread() -> None:
    replicas = [on("a", "a1", 1), on("a", "a2", 2), on("a", "a3", 3), on("b", "b1", 4)]
    replicas += [on("b", "b2", 5), on("c", "c1", 6)]
    plan = decide(target(3), replicas)
    assert sorted(plan.stop) == ["a2", "a3", "b2"]  # one per node left


def test_a_scale_down_empties_the_emptiest_nodes_when_packed() -> None:
    replicas = [on("a", "a1", 1), on("a", "a2", 2), on("a", "a3", 3), on("b", "b1", 4)]
    replicas += [on("b", "b2", 5), on("c", "c1", 6)]
    plan = decide(target(3, pack=True), replicas)
    assert sorted(plan.stop) == ["b1", "b2", "c1"]  # nodes b and c empty


def test_a_scale_down_still_stops_starting_and_unhealthy_replicas_first() -> None:
    replicas = [on("a", "a1", 1), on("a", "a2", 2), R("s", S.STARTING, seq=3, node="b")]
    replicas += [R("u", S.RUNNING, seq=4, node="c", healthy=False)]
    assert decide(target(2), replicas).stop == ("s", "u")
