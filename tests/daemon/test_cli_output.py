"""The CLI's tables line up whatever their cells hold: long words, wide characters, combining
marks, control characters (shown escaped, so longer than they came). No daemon needed."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from controller._cli.ingress import describe_ingress
from controller._cli.output import EscapedText, display_width, print_backend, print_table
from controller._cli.rollout import print_history
from controller._model.values.text import safe_text

#: Cells a column must not be pushed out of line by: a long word, CJK (two columns a character),
#: a combining accent (none), a zero-width space, a terminal escape and a tab (escaped: six,
#: four and two characters), and an emoji (two).
AWKWARD = [
    "ReplicaStartFailedAfterAVeryLongWhile",
    "数据服务",
    "cafe\u0301",
    "zero\u200bwidth",
    "red\x1b[31m",
    "tab\there",
    "ok\U0001f680",
]


def test_display_width_counts_columns_not_characters() -> None:
    assert display_width("abc") == 3
    assert display_width("数据") == 4
    assert display_width("cafe\u0301") == 4
    assert display_width("a\u200bb") == 2
    assert display_width("\U0001f680") == 2


def printed(show: Callable[[], None]) -> list[str]:
    """What `show` prints, as the CLI prints it: through the escaping stream of its stdout."""
    out = io.StringIO()
    with contextlib.redirect_stdout(EscapedText(out)):
        show()
    return out.getvalue().splitlines()


def starts(lines: Sequence[str], cells: Sequence[str]) -> set[int]:
    """The display columns at which each line's cell begins (the cell as printed)."""
    found = set()
    for line, cell in zip(lines, cells, strict=True):
        shown = safe_text(cell).replace("\t", "\\t")
        assert shown in line, (shown, line)
        found.add(display_width(line[: line.index(shown)]))
    return found


def backend(**fields: Any) -> dict[str, Any]:
    status: dict[str, Any] = {
        "name": "a",
        "state": "HEALTHY",
        "reason": "Converged",
        "message": "1/1 replica of version v1 running",
        "generation": 1,
        "observed_generation": 1,
        "ready": 1,
        "desired": 1,
        "ready_of_version": 1,
        "version": "v1",
        "counts_by_version": {"v1": {"RUNNING": 1}},
        "last_error": None,
        "config": {},
        "replicas": [],
        "events": [],
    }
    return {**status, **fields}


def test_status_events_line_up_whatever_the_kind_and_message() -> None:
    events = [
        {"time": None, "kind": kind, "message": f"{kind} {n}"} for n, kind in enumerate(AWKWARD)
    ]
    lines = printed(lambda: print_backend(backend(events=events)))
    shown = lines[lines.index("Events:") + 1 :]
    assert len(shown) == len(events)
    assert len(starts(shown, AWKWARD)) == 1
    assert len(starts(shown, [f"{kind} {n}" for n, kind in enumerate(AWKWARD)])) == 1


def test_status_replicas_line_up_whatever_the_version_and_address() -> None:
    replicas = [
        {
            "tag": f"a#{n}",
            "state": "RUNNING",
            "version": text,
            "address": text,
            "pid": n,
            "node": "host",
            "age_s": 5.0,
            "healthy": True,
        }
        for n, text in enumerate(AWKWARD)
    ]
    lines = printed(lambda: print_backend(backend(replicas=replicas)))
    shown = lines[lines.index("Replicas:") + 2 : lines.index("Events:")]
    assert len(starts(shown, ["host"] * len(AWKWARD))) == 1
    assert len(starts(shown, ["5s"] * len(AWKWARD))) == 1


def test_the_backend_table_lines_up_whatever_the_names() -> None:
    backends = [backend(name=name, message=f"message of {name}") for name in AWKWARD]
    lines = printed(lambda: print_table(backends))[1:]
    assert len(starts(lines, ["HEALTHY"] * len(AWKWARD))) == 1
    assert len(starts(lines, [f"message of {name}" for name in AWKWARD])) == 1


@pytest.mark.parametrize("column", ["version", "outcome"])
def test_rollout_history_lines_up_whatever_the_versions(column: str) -> None:
    revisions = [
        {
            "number": n + 1,
            "current": n == 0,
            "version": text if column == "version" else "v1",
            "outcome": text if column == "outcome" else "complete",
            "good": True,
            "code_changed": False,
            "created_at": None,
            "automatic": False,
            "restores": None,
            "cause": {"via": "cli", "manifest": None, "message": None},
            "error": None,
        }
        for n, text in enumerate(AWKWARD)
    ]
    lines = printed(lambda: print_history(revisions))[1:]
    assert len(starts(lines, ["matches"] * len(AWKWARD))) == 1
    assert len(starts(lines, ["cli"] * len(AWKWARD))) == 1


def test_a_replicas_error_cannot_print_lines_of_its_own_in_a_status() -> None:
    # Found by an attack: a replica's error with a newline in it printed a forged line.
    forged = "boom\n2026-12-02 14:00:00,000 INFO backend echo: goal of generation 9 reached"
    failed = backend(
        message=f"1 failed to start: {forged}",
        last_error=f"ValueError: {forged}\u2028next",
        rollout={
            "revision": 2,
            "current_revision": 1,
            "outcome": "failed",
            "restores": None,
            "automatic": False,
            "paused": False,
            "pending_revision": None,
            "error": forged,
        },
    )
    lines = printed(lambda: print_backend(failed))
    assert not any(line.startswith("2026-12-02") for line in lines)
    assert any(line.startswith("Message:") and "\\n2026-12-02" in line for line in lines)
    assert any(line.startswith("Last error:") and "\\u2028next" in line for line in lines)
    assert any(line.startswith("  rollout error: boom\\n2026") for line in lines)


def test_the_ingress_line_names_the_slots_not_following_yet() -> None:
    # Found by a trial: "not following this daemon yet: 0" read as a count of none.
    processes = [
        {"slot": 0, "pid": 11, "state": "serving", "following": False},
        {"slot": 1, "pid": 12, "state": "serving", "following": True},
    ]
    line = describe_ingress({"listen": "127.0.0.1:8000", "processes": processes})
    assert line == (
        "ingress: 2/2 processes serving on http://127.0.0.1:8000 (pids 11, 12); "
        "not following this daemon yet: slot 0"
    )


def test_a_rolling_update_s_progress_counts_the_old_replicas_that_serve() -> None:
    """Found by a newcomer: `--wait` said "0/3 ready" while three old replicas served."""
    from controller._cli.waiting import progress_line

    status = {
        "ready": 3,
        "ready_of_version": 0,
        "desired": 3,
        "state": "UPDATING",
        "message": "0/3 replicas of version v2 running; 1 starting; 3 of older versions",
        "rollout": None,
    }
    assert progress_line(status).startswith("0/3 ready (3 serving), UPDATING: 0/3 replicas")
    done = {**status, "ready_of_version": 3, "state": "HEALTHY"}
    assert progress_line(done).startswith("3/3 ready, HEALTHY: ")
