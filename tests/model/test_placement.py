"""Feasibility arithmetic: node by node, never replica by replica, and the same answers as
placing one replica at a time."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from controller._model.decisions.placement import SLOTS, Demand, place


def one_at_a_time(nodes: list[dict[str, float]], need: Mapping[str, float], count: int) -> int:
    """The reference: first fit, one replica at a time (what the controller did before)."""
    placed = 0
    while placed < count:
        for node in nodes:
            if all(node.get(k, 0) >= v for k, v in need.items() if v > 0) and all(
                k in node for k, v in need.items() if v > 0 and k != SLOTS
            ):
                for k, v in need.items():
                    if k in node:
                        node[k] -= v
                placed += 1
                break
        else:
            break
    return placed


amounts = st.integers(0, 6)
resources = st.dictionaries(st.sampled_from(["CPU", "GPU", "x"]), amounts, max_size=3)


@settings(max_examples=300, deadline=None)
@given(
    nodes=st.lists(
        st.fixed_dictionaries(
            {"CPU": amounts, SLOTS: st.integers(0, 8)}, optional={"GPU": amounts}
        ),
        min_size=1,
        max_size=4,
    ),
    groups=st.lists(st.tuples(resources, st.integers(0, 12)), min_size=1, max_size=3),
)
def test_same_answers_as_one_replica_at_a_time(
    nodes: list[dict[str, int]], groups: list[tuple[dict[str, int], int]]
) -> None:
    wanted = [Demand(f"b{i}", need, count) for i, (need, count) in enumerate(groups)]
    got = place(nodes, [], wanted)
    free: list[dict[str, float]] = [dict(node) for node in nodes]
    for demand in wanted:
        need = {**demand.resources, SLOTS: 1.0}
        assert got[demand.name] == one_at_a_time(free, need, demand.count), demand


def test_every_replica_takes_a_slot_even_when_it_asks_for_nothing() -> None:
    nodes = [{"CPU": 2.0, SLOTS: 3.0}, {"CPU": 2.0, SLOTS: 1.0}]
    assert place(nodes, [], [Demand("a", {}, 10)]) == {"a": 4}
    assert place(nodes, [Demand("h", {"CPU": 0}, 3)], [Demand("a", {"CPU": 0}, 10)]) == {"a": 1}


def test_a_node_that_sets_no_slot_limit_limits_nothing_but_its_resources() -> None:
    assert place([{"CPU": 2.0}], [], [Demand("a", {}, 10**18)]) == {"a": 10**18}
    assert place([{"CPU": 2.0}], [], [Demand("a", {"CPU": 0.5}, 10**18)]) == {"a": 4}


def test_fractions_add_up_exactly() -> None:
    # 0.1 ten times is 0.9999999999999999 in floats; counted in ten-thousandths it is 1.
    assert place([{"CPU": 1.0, SLOTS: 100.0}], [], [Demand("a", {"CPU": 0.1}, 20)]) == {"a": 10}


def test_an_absurd_count_costs_what_a_small_one_does() -> None:
    # One replica at a time, these would not finish in a lifetime.
    nodes = [{"CPU": 64.0, SLOTS: 1000.0}] * 1000
    assert place(nodes, [], [Demand("a", {"CPU": 0}, 10**18)]) == {"a": 1_000_000}
    assert place(nodes, [Demand("h", {}, 10**17)], [Demand("a", {}, 1)]) == {"a": 0}


# -- node rules: a per-node limit and labels --


def test_a_per_node_limit_counts_what_the_backend_holds_already() -> None:
    from controller._model.config.nodes import NodeRules

    nodes = [{SLOTS: 10.0}, {SLOTS: 10.0}, {SLOTS: 10.0}]
    capped = NodeRules(max_per_node=2)
    held = [Demand("api", {}, 4, rules=capped)]
    assert place(nodes, held, [Demand("api", {}, 5, rules=capped)]) == {"api": 2}
    # Another backend is not limited by api's rule.
    assert place(nodes, held, [Demand("other", {}, 5)]) == {"other": 5}


def test_labels_admit_only_the_nodes_that_carry_them() -> None:
    from controller._model.config.nodes import NodeRules, label_keys

    nodes = [{SLOTS: 4.0, **label_keys({"zone": "a"})}, {SLOTS: 4.0, **label_keys({"zone": "b"})}]
    zone_a = NodeRules(labels={"zone": "a"})
    assert place(nodes, [], [Demand("api", {}, 8, rules=zone_a)]) == {"api": 4}
    assert place(nodes, [], [Demand("api", {}, 8)]) == {"api": 8}


def test_choose_node_spreads_packs_and_respects_every_rule() -> None:
    from controller._model.config.nodes import Candidate, NodeRules, choose_node

    nodes = [
        Candidate("a", {"zone": "a"}, True, 5),
        Candidate("b", {"zone": "b"}, True, 5),
        Candidate("c", {"zone": "a"}, True, 1),
        Candidate("full", {"zone": "a"}, False, 5),
    ]
    held = {"a": 2, "b": 1, "c": 0}
    assert choose_node(nodes, held, NodeRules()) == "c"  # fewest of the backend
    assert choose_node(nodes, held, NodeRules(pack=True)) == "a"  # most, with room
    assert choose_node(nodes, held, NodeRules(pack=True, max_per_node=2)) == "b"
    assert choose_node(nodes, held, NodeRules(labels={"zone": "b"})) == "b"
    assert choose_node(nodes, held, NodeRules(), cordoned={"c"}) == "b"
    assert choose_node(nodes, held, NodeRules(max_per_node=1, labels={"zone": "b"})) is None
