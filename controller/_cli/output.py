"""What the CLI prints: tables, one backend in full, logs, ages."""

from __future__ import annotations

import json
import sys
import time
import unicodedata
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, TextIO, final

from .._model.values.text import one_line, safe_text


@final
class EscapedText:
    """A text stream that writes control characters escaped (``safe_text``): what the CLI
    prints of replicas' text (their errors, tracebacks and events in ``status`` and ``apply
    --wait``, their output in ``logs``) cannot drive the terminal. The CLI puts it around its
    stdout and stderr (``logs --raw`` goes without)."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        return self._inner.write(safe_text(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def display_width(text: str) -> int:
    """The columns `text` takes on a terminal: two for each wide or fullwidth character (CJK,
    most emoji), none for combining marks and zero-width format characters."""
    width = 0
    for char in text:
        if unicodedata.category(char) in ("Mn", "Me", "Cf"):
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width


def table(
    rows: Sequence[Sequence[str]], *, right: Collection[int] = (), indent: str = ""
) -> list[str]:
    """`rows` as lines whose columns line up on a terminal, two spaces apart; the columns in
    `right` aligned right. Each cell is measured as it will be printed: escaped (``safe_text``,
    which the CLI's stdout applies anyway; a tab or newline too, which would break the row)
    and wide characters counted twice, so no content can push a column out of line."""
    shown = [[_one_cell(cell) for cell in row] for row in rows]
    widths = [max(display_width(row[i]) for row in shown) for i in range(len(shown[0]))]
    lines = []
    for row in shown:
        cells = []
        for i, (cell, width) in enumerate(zip(row, widths, strict=True)):
            padding = " " * (width - display_width(cell))
            cells.append(padding + cell if i in right else cell + padding)
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def _one_cell(text: str) -> str:
    return safe_text(text).replace("\t", "\\t").replace("\n", "\\n")


def print_log(entry: dict[str, Any], prefix: bool) -> None:
    text = entry["text"]
    if not prefix:
        sys.stdout.write(text)
    else:
        gone = " (gone)" if entry["state"] == "GONE" else ""
        for line in text.splitlines():
            sys.stdout.write(f"[{entry['replica']}{gone}] {line}\n")
    sys.stdout.flush()


def ready_column(b: dict[str, Any]) -> str:
    """``2/2``: serving replicas of any version over desired; during a rollout, with those of
    the target version: ``2/2 (0/2 v2)``."""
    text = f"{b['ready']}/{b['desired']}"
    if b["ready_of_version"] != b["ready"]:
        text += f" ({b['ready_of_version']}/{b['desired']} {b['version']})"
    scaler = b.get("autoscaler")
    if scaler is not None:
        text += f" ({autoscale_summary(scaler, b['desired'])})"
    return text


def autoscale_summary(scaler: dict[str, Any], desired: int) -> str:
    """``auto 1-10, load 5.2/2``: the bounds, and the load per replica over its target (the
    load the autoscaler last saw, over the replicas the backend moves to; ``?`` with no
    signal)."""
    last = scaler.get("last") or {}
    ongoing = last.get("ongoing")
    count = max(1, desired)
    load = "?" if ongoing is None else f"{ongoing / count:.3g}"
    bounds = f"{scaler['min_replicas']}-{scaler['max_replicas']}"
    capped = scaler.get("capped_at")
    room = "" if capped is None else f", wants {scaler['target']}, room for {capped}"
    return f"auto {bounds}, load {load}/{scaler['target_ongoing_requests']:g}{room}"


def rollout_summary(rollout: dict[str, Any]) -> str:
    """``4 (current 3), rollout in_progress``: the revision the backend rolls out (or runs),
    the one it last finished, how the rollout goes; ``paused, revision 5 pending`` while
    paused."""
    revision, current = rollout["revision"], rollout["current_revision"]
    text = str(revision)
    if current != revision:
        text += f" (current {'none' if current is None else current})"
    text += f", rollout {rollout['outcome'] or 'unknown'}"
    if rollout["restores"] is not None:
        how = "an automatic rollback" if rollout["automatic"] else "an undo"
        text += f", revision {rollout['restores']}'s content brought back by {how}"
    if rollout["paused"]:
        pending = rollout["pending_revision"]
        text += "; paused, " + (
            "nothing pending" if pending is None else f"revision {pending} pending"
        )
    return text


def age(seconds: float | None) -> str:
    """``45s``, ``12m``, ``3h``, ``2d``: how long ago, as kubectl shows it."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def wall_time(iso_time: str) -> float:
    """An API time (ISO 8601, UTC) as seconds since the epoch."""
    return datetime.fromisoformat(iso_time.replace("Z", "+00:00")).timestamp()


def since(iso_time: str | None) -> float | None:
    if not iso_time:
        return None
    return max(0.0, time.time() - wall_time(iso_time))


def indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines())


def print_table(backends: list[dict[str, Any]]) -> None:
    rows = [("NAME", "STATE", "READY", "REPLICAS", "MESSAGE")]
    for b in backends:
        replicas = "; ".join(
            f"{version}: " + ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
            for version, states in sorted(b["counts_by_version"].items())
        )
        rows.append((b["name"], b["state"], ready_column(b), replicas or "-", b["message"]))
    print("\n".join(table(rows)))


def same_version_notice(fields: list[str], version: str | None = None) -> str:
    """What a change of how replicas start under an unchanged version does (a mixed fleet):
    the same words after an apply, in a dry run and in a history."""
    under = "the same version" if version is None else f"version {version}"
    return (
        f"{', '.join(fields)} changed under {under}: the replicas running keep the old, new "
        "ones get the new; give it a new version to replace them"
    )


def code_notice(name: str, revision: int | None, *, paused: bool = False) -> str:
    """What to do when the code a backend runs was edited on disk: the same words after an
    apply and in a status."""
    which = "its revision" if revision is None else f"revision {revision}"
    ship = f"`controller rollout restart {name}`"
    if paused:  # a restart is refused while paused
        ship = f"`controller rollout resume {name}` and then {ship}"
    return (
        f"code changed on disk since {which} was made: its replicas run the old code until "
        f"{ship} ships it"
    )


def print_backend(b: dict[str, Any]) -> None:
    print(f"Name:        {b['name']}")
    print(f"State:       {b['state']} ({b['reason']})")
    # One line each: a replica's error quoted here must not print lines of its own.
    print(f"Message:     {one_line(b['message'])}")
    print(f"Generation:  {b['generation']} (observed {b['observed_generation']})")
    print(f"Ready:       {ready_column(b)}")
    rollout = b.get("rollout")
    if rollout is not None and rollout["revision"] is not None:
        print(f"Revision:    {rollout_summary(rollout)}")
        if rollout["error"]:
            print(f"  rollout error: {one_line(rollout['error'])}")
        if rollout.get("canary"):
            print(f"  {canary_line(rollout['canary'])}")
        if b.get("code_changed"):
            notice = code_notice(b["name"], rollout["revision"], paused=rollout["paused"])
            print(f"  {notice}")
    load = b.get("load")
    if load is not None:
        route = b["config"].get("route_prefix")
        # What its replicas hold by their own count (handles' calls too, which no ingress
        # reports): the load an outsider checks a backend reached only by handles by.
        held = load.get("self_reported", 0)
        print(
            f"Route:       {route or '(none)'}; load {load['in_flight']} in flight, "
            f"{load['queued']} queued ({load['sources']} reporting); its replicas hold {held}"
        )
    scaler = b.get("autoscaler")
    if scaler is not None:
        summary = autoscale_summary(scaler, b["desired"])
        target = scaler["target"]
        print(f"Autoscaler:  {target} replica{'' if target == 1 else 's'} ({summary})")
        for label, key in (("last", "last"), ("last change", "last_change")):
            d = scaler.get(key)
            if d is not None:
                ongoing = "no signal" if d["ongoing"] is None else f"load {d['ongoing']:g}"
                print(
                    f"  {label}: {age(since(d['time']))} ago, {d['previous']} -> {d['target']} "
                    f"({d['reason']}): {ongoing}, {d['not_ready']} not ready, "
                    f"recommended {d['recommended']}"
                )
    if b["last_error"]:
        print(f"Last error:  {one_line(b['last_error'])}")
        if b.get("last_traceback"):
            print(indent(b["last_traceback"]))
    print("Config:")
    for key, value in b["config"].items():
        print(f"  {key}: {json.dumps(value)}")
    print("Replicas:")
    rows = [("TAG", "STATE", "VERSION", "ADDRESS", "PID", "NODE", "AGE", "IN FLIGHT", "SERVED", "")]
    in_flight = (load or {}).get("replicas", {})
    # Answered, by the replica's own count: code the worker serves says (others: "-").
    served = (load or {}).get("served", {})
    for r in b["replicas"]:
        node = r["node"] or "-"
        rows.append(
            (
                r["tag"],
                r["state"],
                r["version"],
                r["address"] or "-",
                str(r["pid"] or "-"),
                node if len(node) <= 16 else node[:12] + "...",
                age(r["age_s"]),
                str(in_flight.get(r["tag"], 0)),
                str(served.get(r["tag"], "-")),
                "" if r["healthy"] else "(unhealthy)",
            )
        )
    print("\n".join(table(rows, indent="  ")))
    models = (load or {}).get("models", {})
    if models:
        print("Models (what each multiplexed replica holds):")
        lines = []
        for tag, said in sorted(models.items()):
            lookups = said["hits"] + said["misses"]
            hits = f"{said['hits'] * 100 / lookups:.0f} % hits" if lookups else "no lookups"
            held = ", ".join(said["models"]) or "-"
            lines.append((tag, f"{len(said['models'])}/{said['capacity']}", hits, held))
        print("\n".join(table(lines, indent="  ")))
        asked: dict[str, int] = {}
        for said in models.values():
            for model, count in said["requests"].items():
                asked[model] = asked.get(model, 0) + count
        busiest = sorted(asked.items(), key=lambda item: (-item[1], item[0]))
        shown = ", ".join(f"{model} {count}" for model, count in busiest[:10])
        more = f" (and {len(busiest) - 10} more)" if len(busiest) > 10 else ""
        print(f"  Requests by model: {shown or '-'}{more}")
    print("Events:")
    events = [(f"{age(since(e['time']))} ago", e["kind"], e["message"]) for e in b["events"][-10:]]
    if events:
        print("\n".join(table(events, right={0}, indent="  ")))


def print_diff(backends: list[dict[str, Any]]) -> None:
    """What ``apply --dry-run`` shows: each backend's action, then each field that would
    change (``now -> then``; a new backend's fields as they would be)."""
    for b in backends:
        what = "deleted (pruned)" if b["action"] == "deleted" else b["action"]
        print(f"backend/{b['name']} {what} (dry run)")
        for field, change in b["fields"].items():
            then = _value(change["then"])
            if b["action"] == "created":
                print(f"  {field}: {then}")
            else:
                print(f"  {field}: {_value(change['now'])} -> {then}")
        if b.get("same_version"):
            print(f"  note: {same_version_notice(b['same_version'])}")


def _value(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "))


def canary_line(canary: Mapping[str, Any]) -> str:
    """A canary release in one line: its step, weight and phase, each side's numbers, and what
    the gates say."""

    def side(name: str, n: Mapping[str, Any]) -> str:
        p99 = "-" if n["p99_s"] is None else f"{n['p99_s'] * 1000:.1f} ms"
        return (
            f"{name} {n['version']}: {n['requests']} requests, {n['error_rate']:.1%} errors, "
            f"p99 {p99}"
        )

    elapsed = canary["elapsed_s"]
    clock = "" if elapsed is None else f", {elapsed:.0f}/{canary['pause_s']:g}s"
    return (
        f"canary revision {canary['revision']} (stable {canary['stable_revision']}): step "
        f"{canary['step']}/{canary['steps']} at {canary['weight']:g}%, {canary['phase']}"
        f"{clock}; {side('canary', canary['canary'])}; {side('stable', canary['stable'])}; "
        f"gates ({canary['gates']}): {canary['verdict']}"
    )


def describe_cause(revision: dict[str, Any]) -> str:
    """``undo to revision 2, cli, from app.toml: "bad release"``: who asked, from which file,
    what they said (as the controller's events say it)."""
    cause = revision["cause"]
    parts = []
    if revision.get("automatic"):
        parts.append(f"automatic rollback to revision {revision['restores']}")
    elif revision.get("restores") is not None:
        parts.append(f"undo to revision {revision['restores']}")
    elif revision.get("restarts") is not None:
        parts.append(f"restart of revision {revision['restarts']}")
    parts.append(cause["via"])
    if cause["manifest"] is not None:
        parts.append(f"from {cause['manifest']}")
    text = ", ".join(parts)
    if cause["message"] is not None:
        text += f": {json.dumps(cause['message'], ensure_ascii=False)}"
    return text
