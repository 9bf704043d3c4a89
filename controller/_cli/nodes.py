"""``controller node``: the runtime's nodes, and taking one out of service.

controller node list [--json]
controller node drain NODE [--deadline S] [--wait [--timeout S]]
controller node cordon NODE
controller node uncordon NODE
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.parse
from typing import Any

from .client import CLIError, make_client
from .options import WAIT_TIMEOUT_HELP
from .output import age, since, table, wall_time
from .rollout import seconds

#: How often ``drain --wait`` reads the node again.
_POLL_S = 0.5


def _path(node: str, verb: str) -> str:
    if not node:
        raise CLIError("controller node: NODE is empty (`controller node list` shows them)", 2)
    return f"/api/v1/nodes/{urllib.parse.quote(node, safe='')}/{verb}"


def cmd_list(args: argparse.Namespace) -> int:
    nodes = make_client(args).ok("GET", "/api/v1/nodes")["nodes"]
    if args.json:
        print(json.dumps(nodes, indent=2))
        return 0
    if not nodes:
        print("No nodes.")
        return 0
    rows = [("NODE", "STATE", "ADDRESS", "INGRESS", "REPLICAS", "LABELS", "AGE")]
    for node in nodes:
        rows.append(
            (
                node["id"],
                _state(node),
                node["address"] or "-",
                ", ".join(a or "starting" for a in node.get("ingresses") or []) or "-",
                ", ".join(f"{b}={n}" for b, n in node["replicas"].items()) or "-",
                ",".join(f"{k}={v}" for k, v in node["labels"].items()) or "-",
                age(since(node["since"])),
            )
        )
    print("\n".join(table(rows)))
    return 0


def describe_node_ingresses(entries: list[dict[str, Any]]) -> str:
    """One line: the ingress on each node of a Ray cluster, and any trouble."""
    serving = [e for e in entries if e["state"] == "serving"]
    shown = ", ".join(f"{e['node'][:12]} on http://{e['address']}" for e in serving) or "-"
    line = f"node ingresses: {len(serving)}/{len(entries)} serving ({shown})"
    restarts = sum(int(e["restarts"]) for e in entries)
    if restarts:
        last = [e["last_exit"] for e in entries if e.get("last_exit")]
        line += f"; {restarts} restarted" + (f" (last: {last[-1]})" if last else "")
    return line


def _state(node: dict[str, Any]) -> str:
    state = str(node["state"])
    if node["notice"]:
        state += " (cluster's notice)"
    if node["deadline"] is not None and state.startswith("draining"):
        left = round(wall_time(node["deadline"]) - time.time())
        state += f", deadline in {left}s" if left > 0 else ", deadline passed"
    return state


def cmd_drain(args: argparse.Namespace) -> int:
    client = make_client(args)
    node = client.ok("POST", _path(args.node, "drain"), {"deadline_s": args.deadline})
    left = sum(node["replicas"].values())
    print(f"node/{node['id']} draining: {left} replica(s) to move off")
    if not args.wait:
        return 0
    deadline = time.monotonic() + args.timeout
    while True:
        rows = {n["id"]: n for n in client.ok("GET", "/api/v1/nodes")["nodes"]}
        now = rows.get(node["id"])
        if now is None or now["state"] in ("drained", "dead"):
            print(f"node/{node['id']} {'drained' if now is not None else 'gone'}")
            return 0
        if now["state"] not in ("draining",):
            raise CLIError(f"node/{node['id']} is {now['state']} now: the drain was ended")
        if time.monotonic() > deadline:
            print(f"node/{node['id']}: still draining after {args.timeout:g}s; it goes on")
            return 1
        time.sleep(_POLL_S)


def cmd_cordon(args: argparse.Namespace) -> int:
    node = make_client(args).ok("POST", _path(args.node, "cordon"))
    print(f"node/{node['id']} {'cordoned' if node['state'] == 'cordoned' else _state(node)}")
    return 0


def cmd_uncordon(args: argparse.Namespace) -> int:
    node = make_client(args).ok("POST", _path(args.node, "uncordon"))
    if node["notice"]:
        print(f"node/{node['id']} uncordoned, but still {_state(node)}: the cluster itself said so")
    else:
        print(f"node/{node['id']} uncordoned")
    return 0


def add_node_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    node = sub.add_parser("node", help="the runtime's nodes: list, drain, cordon, uncordon")
    verbs = node.add_subparsers(dest="verb", required=True)
    listing = verbs.add_parser("list", help="nodes, their state, replicas and labels")
    listing.add_argument("--json", action="store_true", help="print the API's answer, as JSON")
    listing.set_defaults(func=cmd_list)
    node_help = "the node's id, a unique prefix of it, or its unique address"
    drain = verbs.add_parser(
        "drain", help="move every replica off a node (make before break) and keep it empty"
    )
    drain.add_argument("node", help=node_help)
    drain.add_argument(
        "--deadline",
        type=seconds,
        metavar="S",
        help="after S seconds, what is left stops whatever the disruption budgets say",
    )
    drain.add_argument("--wait", action="store_true", help="return once the node is drained")
    drain.add_argument("--timeout", type=seconds, default=600.0, help=WAIT_TIMEOUT_HELP)
    drain.set_defaults(func=cmd_drain)
    cordon = verbs.add_parser("cordon", help="place nothing new on a node; what runs stays")
    cordon.add_argument("node", help=node_help)
    cordon.set_defaults(func=cmd_cordon)
    uncordon = verbs.add_parser("uncordon", help="a node takes new replicas again")
    uncordon.add_argument("node", help=node_help)
    uncordon.set_defaults(func=cmd_uncordon)
