"""Schemathesis hooks for tests/daemon/test_api_contract.py (loaded with ``SCHEMATHESIS_HOOKS``).

They keep the run safe and bounded; they never make a request the document forbids valid, or
an invalid one valid."""

from __future__ import annotations

import importlib.util
from typing import Any

import schemathesis

# The replica modules the daemon under test may build. An entrypoint is any importable callable,
# so a generated one that names a real module ("os:system") could run it: those are not sent.
ALLOWED_MODULES = {"echo_replica", "replicas"}
WATCH_TIMEOUT_S = 0.5


def _names_no_real_module(value: Any) -> bool:
    if isinstance(value, dict):
        entrypoint = value.get("entrypoint")
        if isinstance(entrypoint, str):
            top = entrypoint.partition(":")[0].split(".")[0]
            if top not in ALLOWED_MODULES and importlib.util.find_spec(top) is not None:
                return False
        return all(_names_no_real_module(v) for v in value.values())
    return True


def _bounds_in_order(value: Any) -> bool:
    # The one rule JSON Schema cannot say (and the document says so in words): an autoscaling
    # block's min_replicas <= max_replicas. A body that breaks it is refused with 422, rightly;
    # schemathesis would take it for valid, so it is not sent.
    if isinstance(value, dict):
        block = value.get("autoscaling")
        if isinstance(block, dict):
            low, high = block.get("min_replicas", 1), block.get("max_replicas")
            numbers = all(
                isinstance(n, (int, float)) and not isinstance(n, bool) for n in (low, high)
            )
            if numbers and low > high:
                return False
        return all(_bounds_in_order(v) for v in value.values())
    return True


@schemathesis.hook
def filter_body(ctx: Any, body: Any) -> bool:
    return _names_no_real_module(body) and _bounds_in_order(body)


@schemathesis.hook
def map_query(ctx: Any, query: Any) -> Any:
    # A long poll waits as long as it is asked (up to 60 s): a valid timeout is cut short here,
    # so that the run takes a minute, not an hour. Invalid ones are left as they are.
    if ctx.operation.path == "/api/v1/watch" and isinstance(query, dict):
        timeout = query.get("timeout_s")
        if (
            isinstance(timeout, (int, float))
            and not isinstance(timeout, bool)
            and 0 <= timeout <= 60
        ):
            query["timeout_s"] = min(float(timeout), WATCH_TIMEOUT_S)
    return query
