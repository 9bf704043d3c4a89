"""Waiting for a change to end, like ``kubectl rollout status``: each backend's progress shown
until its goal resolves (``rollout status``, ``wait``, and every ``--wait``)."""

from __future__ import annotations

import sys
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from .._model.values.text import one_line
from .client import Client, CLIError, leader_answer
from .output import canary_line, indent

#: The longest a watch request waits before the CLI refreshes what it shows.
_REFRESH_S = 1.0


def progress_line(status: Mapping[str, Any]) -> str:
    """A backend's progress in a line: ``1/3 ready (3 serving), UPDATING: ...``."""
    canary = (status.get("rollout") or {}).get("canary")
    steps = canary is not None and canary["phase"] not in ("promoted", "aborted")
    # During a canary's steps both revisions serve: what is ready is all of them.
    ready = status["ready"] if steps else status["ready_of_version"]
    message = one_line(status["message"])
    # Replicas of another version that serve meanwhile (a rolling update's old ones): "0/3
    # ready" alone read as an outage.
    serving = "" if status["ready"] <= ready else f" ({status['ready']} serving)"
    return f"{ready}/{status['desired']} ready{serving}, {status['state']}: {message}"


def wait_for(
    client: Client,
    names: Sequence[str],
    deleting: set[str],
    timeout: float,
    ours: Mapping[str, int] | None = None,
) -> int:
    """Show each backend's progress until every goal resolves. 0 if all reached, 1 if any
    backend is DEPLOY_FAILED, or was changed again by someone else (its generation moved past
    `ours`), or the wait timed out."""
    ours = ours or {}
    deadline = time.monotonic() + timeout
    shown: dict[str, str] = {}
    canaries: dict[str, tuple[int, str, str]] = {}
    tracebacks: dict[str, str | None] = {}
    cursor, epoch = 0, ""
    while True:
        # The leader's own word only: a standby's copy lags, and a leader that stepped down
        # may still show its closed controller's last state.
        answer = leader_answer(client, "/api/v1/backends", deadline)
        statuses = {b["name"]: b for b in answer["backends"]}
        pending, failed = [], []
        for name in names:
            status = statuses.get(name)
            if status is not None and status["generation"] > ours.get(name, status["generation"]):
                failed.append(name)
                line = f"superseded by generation {status['generation']}, a later change"
                rollout = status.get("rollout") or {}
                if rollout.get("automatic"):
                    # The later change is the controller's own: the rollout failed.
                    line = (
                        f"the rollout failed: {_why_failed(client, name)}; the rollback is "
                        f"revision {rollout['revision']} (`controller rollout status {name}` "
                        "follows it)"
                    )
            elif name in deleting:
                if status is None:
                    line = "deleted"
                else:
                    pending.append(name)
                    line = f"deleting: {one_line(status['message'])}"
            elif status is None:
                failed.append(name)
                line = "not found (deleted meanwhile?)"
            else:
                line = progress_line(status)
                if status["state"] == "DEPLOY_FAILED":
                    failed.append(name)
                    rollout = status.get("rollout") or {}
                    if rollout.get("outcome") == "failed" and rollout.get("error"):
                        line += f" (the rollout failed: {one_line(rollout['error'])})"
                    else:
                        line += f" (last error: {one_line(status['last_error'])})"
                    if status["reason"] in ("StartFailures", "ReconfigureFailed"):
                        # The replica's own traceback is of that failure; not of a deadline's.
                        tracebacks[name] = status.get("last_traceback")
                elif not status["goal_done"]:
                    pending.append(name)
            if shown.get(name) != line:
                shown[name] = line
                print(f"backend/{name}: {line}", flush=True)
            canary = ((status or {}).get("rollout") or {}).get("canary")
            if canary is not None and canary["phase"] not in ("promoted", "aborted"):
                # Shown when its step, phase or verdict moves: the numbers move always.
                said = (canary["step"], canary["phase"], canary["verdict"])
                if said != canaries.get(name):
                    canaries[name] = said
                    print(f"backend/{name}: {canary_line(canary)}", flush=True)
        if not pending:
            if failed:
                for name in failed:
                    if tracebacks.get(name):
                        print(f"backend/{name}: the replica's traceback:", file=sys.stderr)
                        print(indent(str(tracebacks[name])), file=sys.stderr)
                print(f"failed: {', '.join(failed)}", file=sys.stderr)
                return 1
            print("done")
            return 0
        left = deadline - time.monotonic()
        if left <= 0:
            still = ", ".join(pending)
            print(f"timed out after {timeout:g}s; still going: {still}", file=sys.stderr)
            return 1
        # Wake on any change of serving replicas, or after a moment for the rest (starts).
        query = urllib.parse.urlencode(
            {"since": cursor, "epoch": epoch, "timeout_s": min(_REFRESH_S, left)}
        )
        try:
            # Bounded near the long poll's own wait: a paused leader must not hold it.
            change = client.ok("GET", f"/api/v1/watch?{query}", timeout=min(_REFRESH_S, left) + 5)
        except CLIError:
            # The daemon went away or stopped leading under the wait: the next status
            # (above) finds whoever leads now.
            cursor, epoch = 0, ""
            continue
        cursor, epoch = change["cursor"], change["epoch"]


def _why_failed(client: Client, name: str) -> str:
    """The error of `name`'s newest failed revision (the one a rollback undid)."""
    kept = client.ok("GET", f"/api/v1/backends/{urllib.parse.quote(name)}/revisions")
    for revision in reversed(kept["revisions"]):
        if revision["outcome"] == "failed":
            return str(revision["error"])
    return "see `controller rollout history`"
