"""Nodes: where a backend's replicas may go (its placement rules), what a runtime knows of its
nodes, and the choice of a node for one new replica.

Pure, no I/O. A runtime with nodes (RayRuntime, or FakeRuntime given several) asks
``choose_node`` for each start; the controller's feasibility check (``placement.place``) follows
the same rules, so that a count it accepts is one the runtime can place.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence

import attrs

from ..values.errors import ConfigError
from ..values.numbers import MAX_COUNT, whole

#: The placement policies: spread a backend's replicas over nodes, or pack them onto few.
POLICIES = ("spread", "pack")
LABEL_KEY_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_./-]{0,252}"
LABEL_VALUE_PATTERN = r"[A-Za-z0-9_./-]{0,63}"
MAX_LABELS = 32
_KEY = re.compile(LABEL_KEY_PATTERN)
_VALUE = re.compile(LABEL_VALUE_PATTERN)
#: How a node's capacity mapping (``Runtime.capacity``) says it carries a label: this key, plus
#: ``name=value``, with any amount. Such keys are never consumed by a replica.
LABEL_PREFIX = "label:"


def placement_policy(value: object) -> str:
    """BackendConfig.placement's converter."""
    if value not in POLICIES:
        raise ConfigError(
            "BackendConfig.placement",
            "must be 'spread' (a backend's replicas over as many nodes as it can) or 'pack' "
            "(onto as few as it can)",
            value,
        )
    assert isinstance(value, str)
    return value


def max_per_node(value: object) -> int | None:
    """BackendConfig.max_replicas_per_node's converter."""
    if value is None:
        return None
    count = whole(value)
    if count is None or not 1 <= count <= MAX_COUNT:
        raise ConfigError(
            "BackendConfig.max_replicas_per_node",
            f"must be none or a whole number from 1 to {MAX_COUNT}",
            value,
        )
    return count


def node_labels(value: object) -> dict[str, str]:
    """BackendConfig.node_labels's converter: a node must carry every one of them."""
    field = "BackendConfig.node_labels"
    if not isinstance(value, Mapping):
        raise ConfigError(
            field, 'must be a mapping of label name to value, e.g. {"zone": "a"}', value
        )
    if len(value) > MAX_LABELS:
        raise ConfigError(field, f"may name at most {MAX_LABELS} labels", len(value))
    out: dict[str, str] = {}
    for key, label in value.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise ConfigError(
                field,
                "label names are 1-253 letters, digits, '_', '.', '/' or '-', starting with a "
                "letter or digit",
                key,
            )
        if not isinstance(label, str) or not _VALUE.fullmatch(label):
            raise ConfigError(
                f"{field}[{key!r}]", "must be 0-63 letters, digits, '_', '.', '/' or '-'", label
            )
        out[key] = label
    return out


@attrs.frozen
class NodeRules:
    """Where one backend's replicas may go (from its config)."""

    pack: bool = False
    """Onto as few nodes as fit (else spread over as many as it can)."""
    max_per_node: int | None = None
    labels: Mapping[str, str] = attrs.field(factory=dict)

    def admits(self, labels: Mapping[str, str]) -> bool:
        """Whether a node carrying `labels` may hold the backend's replicas."""
        return all(labels.get(key) == value for key, value in self.labels.items())

    def admits_capacity(self, node: Mapping[str, float]) -> bool:
        """``admits``, for a node's capacity mapping (its labels as ``label:`` keys)."""
        return all(f"{LABEL_PREFIX}{k}={v}" in node for k, v in self.labels.items())


def label_keys(labels: Mapping[str, str]) -> dict[str, float]:
    """`labels` as keys of a node's capacity mapping."""
    return {f"{LABEL_PREFIX}{key}={value}": 1.0 for key, value in labels.items()}


@attrs.frozen
class NodeInfo:
    """What a runtime knows of one of its nodes (``NodeRuntime.nodes``)."""

    id: str
    address: str = ""
    alive: bool = True
    labels: Mapping[str, str] = attrs.field(factory=dict)
    draining: bool = False
    """The runtime's own notice that the node goes away (Ray's drain or preemption)."""
    deadline: float | None = None
    """When it goes, by the wall clock, if the notice says."""


@attrs.frozen
class Candidate:
    """A node a replica could be started on, as a runtime sees it now."""

    id: str
    labels: Mapping[str, str]
    fits: bool
    """Whether the replica's resources fit in what is free there."""
    free_slots: int
    """How many more replicas it may hold at all."""


def choose_node(
    candidates: Sequence[Candidate],
    held: Mapping[str, int],
    rules: NodeRules,
    cordoned: Collection[str] = (),
) -> str | None:
    """The node for one more replica of a backend that has `held` replicas per node, or None if
    no node may take it. Spread: the node with the fewest of the backend (then the most free
    slots); pack: the one with the most that still has room (then the fewest free slots, to
    leave whole nodes empty). Ties go to the first listed."""
    best: tuple[int, int] | None = None
    chosen = None
    for node in candidates:
        if not node.fits or node.free_slots <= 0 or node.id in cordoned:
            continue
        if not rules.admits(node.labels):
            continue
        mine = held.get(node.id, 0)
        if rules.max_per_node is not None and mine >= rules.max_per_node:
            continue
        key = (-mine, node.free_slots) if rules.pack else (mine, -node.free_slots)
        if best is None or key < best:
            best, chosen = key, node.id
    return chosen


def rules_text(rules: NodeRules) -> str:
    """The rules in words, for a refusal."""
    parts = []
    if rules.max_per_node is not None:
        parts.append(f"max_replicas_per_node={rules.max_per_node}")
    if rules.labels:
        parts.append(f"node_labels={dict(rules.labels)}")
    return " and ".join(parts)


#: The store keys of node cordons: ``node/<id>``.
NODE_PREFIX = "node/"
NODE_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}"
_NODE_ID = re.compile(NODE_ID_PATTERN)
#: A cordon's states: no new replica there, or that and its replicas moved off too.
CORDON_STATES = ("cordoned", "draining")


@attrs.frozen
class Cordon:
    """A node the controller was told to keep replicas off (``node drain`` / ``node cordon``),
    as stored under ``node/<id>``; ``node uncordon`` deletes it."""

    node: str
    state: str
    """``cordoned``: nothing new is placed there. ``draining``: and its replicas are replaced
    elsewhere, then stopped."""
    since: float
    """When, by the wall clock."""
    deadline: float | None = None
    """For a drain: when its replicas stop whatever the disruption budget says (wall clock)."""

    def to_json(self) -> str:
        data = {"schema": 1, "node": self.node, "state": self.state, "since": self.since}
        return json.dumps({**data, "deadline": self.deadline})

    @classmethod
    def from_json(cls, key: str, text: str) -> Cordon:
        """Read what `key` holds; ValueError if it is not a cordon."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("schema") != 1:
            raise ValueError(f"store key {key!r} is not a node cordon of schema 1")
        node, state, since = data.get("node"), data.get("state"), data.get("since")
        deadline = data.get("deadline")
        if (
            not isinstance(node, str)
            or key != NODE_PREFIX + node
            or state not in CORDON_STATES
            or not isinstance(since, (int, float))
            or not (deadline is None or isinstance(deadline, (int, float)))
        ):
            raise ValueError(f"store key {key!r} holds a damaged node cordon")
        return cls(node, state, float(since), None if deadline is None else float(deadline))


def node_id(value: object) -> str:
    """A node's id as a user names it (checked before it becomes a store key)."""
    if not isinstance(value, str) or not _NODE_ID.fullmatch(value):
        raise ConfigError(
            "node",
            "a node id is 1-128 letters, digits, '_', '.', ':' or '-', starting with a letter "
            "or digit (`controller node list` shows them)",
            value,
        )
    return value


@attrs.frozen
class NodeRow:
    """One node as ``controller node list`` shows it."""

    id: str
    address: str
    alive: bool
    state: str
    """``ready``, ``cordoned``, ``draining``, ``drained`` (draining, no replica left) or
    ``dead``."""
    labels: Mapping[str, str]
    replicas: Mapping[str, int]
    """Per backend, how many of its replicas the node holds."""
    since: float | None = None
    """When it was cordoned or its drain began (wall clock)."""
    deadline: float | None = None
    """When a drain stops what is left whatever the budget (wall clock)."""
    notice: bool = False
    """The cluster itself announced that the node goes (Ray's drain or preemption)."""

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "address": self.address,
            "alive": self.alive,
            "state": self.state,
            "labels": dict(self.labels),
            "replicas": dict(self.replicas),
            "since": self.since,
            "deadline": self.deadline,
            "notice": self.notice,
        }
