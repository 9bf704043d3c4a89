"""The API's nodes: ``GET /api/v1/nodes`` and ``POST /api/v1/nodes/{node}/drain`` (and
``cordon``, ``uncordon``), with their part of the OpenAPI document."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._model.config.nodes import NODE_ID_PATTERN, NodeRow
from .._model.values.numbers import MAX_SECONDS
from .http import HTTPError
from .operations import answer, operation
from .schema_parts import BOOL, NULLABLE_STRING, STRING, obj
from .views import iso

if TYPE_CHECKING:
    from .._core.controller import Controller

_WALL = {"type": ["string", "null"], "description": "ISO 8601, UTC"}

SCHEMAS: dict[str, Any] = {
    "Node": obj(
        {
            "id": STRING,
            "address": STRING,
            "alive": BOOL,
            "state": {"enum": ["ready", "cordoned", "draining", "drained", "dead"]},
            "labels": {"type": "object", "additionalProperties": STRING},
            "replicas": {
                "type": "object",
                "additionalProperties": {"type": "integer", "minimum": 0},
                "description": "Per backend, how many of its replicas the node holds",
            },
            "since": _WALL,
            "deadline": _WALL,
            "notice": {
                "type": "boolean",
                "description": "The cluster itself announced that the node goes (Ray's drain "
                "or preemption)",
            },
        },
        ingresses={"type": "array", "items": NULLABLE_STRING},
    ),
    "NodeIngress": obj(
        {
            "node": STRING,
            "state": {"enum": ["starting", "serving", "restarting", "stopping"]},
            "address": NULLABLE_STRING,
            "pid": {"type": ["integer", "null"]},
            "since": _WALL,
            "restarts": {"type": "integer", "minimum": 0},
            "last_exit": NULLABLE_STRING,
        }
    ),
    "Nodes": obj({"nodes": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}}}),
    "NodeDrain": obj(
        {},
        deadline_s={
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "maximum": MAX_SECONDS,
            "description": "After this, what is left on the node stops whatever the "
            "disruption budgets say (none: no deadline)",
        },
    ),
}

_NODE = {
    "name": "node",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": f"^{NODE_ID_PATTERN}$"},
    "description": "The node's id, a unique prefix of it, or its unique address",
}

PATHS: dict[str, Any] = {
    "/api/v1/nodes": {
        "get": operation(
            "The runtime's nodes: state, labels and replicas per backend",
            answer("200", "Every node the runtime knows, and any cordoned it lost", "Nodes"),
            "501-node",
        )
    },
    "/api/v1/nodes/{node}/drain": {
        "parameters": [_NODE],
        "post": operation(
            "Drain a node (kubectl drain): replicas move off it, make before break",
            answer("202", "Stored; the backends move their replicas off from here", "Node"),
            "400",
            "404-node",
            "413",
            "415",
            "422",
            "501-node",
            "503",
            body="NodeDrain",
            body_required=False,
            description="Each backend starts replacements for its replicas there on other "
            "nodes first, then stops those on the node under their graceful timeout, never "
            "with more than its `max_unavailable` unavailable. Nothing new is placed on the "
            "node until `uncordon`. The node reads `drained` once none is left.",
        ),
    },
    "/api/v1/nodes/{node}/cordon": {
        "parameters": [_NODE],
        "post": operation(
            "Cordon a node: nothing new is placed there, what runs stays",
            answer("202", "Stored", "Node"),
            "404-node",
            "422",
            "501-node",
            "503",
        ),
    },
    "/api/v1/nodes/{node}/uncordon": {
        "parameters": [_NODE],
        "post": operation(
            "Uncordon a node: it takes new replicas again (a drain under way ends)",
            answer("202", "Stored", "Node"),
            "404-node",
            "422",
            "501-node",
            "503",
        ),
    },
}


def node_json(row: NodeRow, ingresses: list[str | None] | None = None) -> dict[str, Any]:
    out = {**row.to_json(), "since": iso(row.since), "deadline": iso(row.deadline)}
    if ingresses is not None:
        out["ingresses"] = ingresses
    return out


def drain_request(data: Any) -> float | None:
    """A drain's body: ``{"deadline_s": S}``, or nothing."""
    if not isinstance(data, dict):
        raise HTTPError(422, "Invalid", "the body must be an object")
    unknown = sorted(set(data) - {"deadline_s"})
    if unknown:
        raise HTTPError(422, "Invalid", f"unknown fields: {', '.join(unknown)}")
    deadline = data.get("deadline_s")
    if deadline is not None and (
        isinstance(deadline, bool)
        or not isinstance(deadline, (int, float))
        or not 0 < deadline <= MAX_SECONDS
    ):
        said = f"deadline_s: must be a number of seconds in (0, {MAX_SECONDS:g}], or null"
        raise HTTPError(422, "Invalid", said, problems=[said])
    return None if deadline is None else float(deadline)


async def steer_node(ctl: Controller, node: str, what: str, body: Any) -> NodeRow:
    if what == "drain":
        return await ctl.drain_node(node, deadline_s=drain_request(body))
    if body != {}:
        # Nothing to say but the node: a field sent is a mistake to point out, not to drop.
        said = "the body must be empty or {} (a cordon takes no field)"
        raise HTTPError(422, "Invalid", said, problems=[said])
    if what == "cordon":
        return await ctl.cordon_node(node)
    return await ctl.uncordon_node(node)
