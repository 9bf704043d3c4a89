"""Revisions as data: what a revision's content is, the cause's rules, and the history's trim."""

from __future__ import annotations

import attrs
import pytest

import controller
from controller import Cause, ConfigError
from controller._model.records.revisions import (
    MAX_HISTORY_BYTES,
    Outcome,
    Revision,
    content_of,
    make_revision,
    started_differently,
    superseded,
    trim,
    with_outcomes,
)
from controller._model.values.json_values import JSON

RC = controller.ReplicaConfig("app.replica:Echo")


def revision(number: int, user_config: JSON = None) -> Revision:
    config = controller.BackendConfig(version=f"v{number}", user_config=user_config)
    return make_revision(
        number, content_of(config, RC), now=0.0, cause=Cause(), code=None, code_generation=1
    )


def test_content_is_what_replicas_run_and_nothing_else() -> None:
    one = content_of(controller.BackendConfig(num_replicas=1, user_config={"a": 1, "b": 2}), RC)
    other = content_of(
        controller.BackendConfig(
            num_replicas=9,
            user_config={"b": 2, "a": 1},
            max_surge=3,
            route_prefix="/x",
            progress_deadline_s=5,
            on_failure="rollback",
        ),
        RC,
    )
    assert one.digest == other.digest  # scale, settings and key order do not count
    for changed in (
        controller.BackendConfig(version="v2"),
        controller.BackendConfig(user_config=1),
        controller.BackendConfig(resources={"CPU": 1}),
    ):
        assert content_of(changed, RC).digest != content_of(controller.BackendConfig(), RC).digest
    args = controller.ReplicaConfig("app.replica:Echo", init_kwargs={"x": 1})
    assert content_of(controller.BackendConfig(), args).digest != one.digest


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"via": "email"}, "cause.via"),
        ({"message": "x" * 1001}, "cause.message"),
        ({"message": "two\nlines"}, "cause.message"),
        ({"message": 3}, "cause.message"),
        ({"manifest": "\x00"}, "cause.manifest"),
        ({"manifest_digest": "ABC"}, "cause.manifest_digest"),
        ({"manifest_digest": "a" * 129}, "cause.manifest_digest"),
    ],
)
def test_a_bad_cause_names_its_field(fields: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        Cause(**fields)
    assert info.value.field == field


def test_trim_keeps_the_newest_and_what_it_must() -> None:
    history = [revision(n) for n in range(1, 11)]
    assert [r.number for r in trim(history, 2, keep={4})] == [4, 8, 9, 10]
    assert [r.number for r in trim(history, 0, keep=set())] == [10]
    assert [r.number for r in trim(history, 100, keep=set())] == list(range(1, 11))


def test_trim_keeps_the_history_under_its_byte_budget() -> None:
    big = "x" * (MAX_HISTORY_BYTES // 4)
    history = [revision(n, big) for n in range(1, 6)]
    kept = trim(history, 10, keep={1})
    # Revision 1 must stay (a live replica runs it), and the newest always does.
    assert [r.number for r in kept] == [1, 4, 5]


def outcomes(history: list[Revision]) -> list[tuple[int, str, bool]]:
    return [(r.number, r.outcome, r.good) for r in history]


def marked(r: Revision, outcome: str, good: bool = False) -> Revision:
    return attrs.evolve(r, outcome=outcome, good=good)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("copied", "reported", "expected"),
    [
        # Completed while the change was written: complete, not superseded.
        ("in_progress", ("complete", True), ("complete", True)),
        # A retry of a failed revision, completed meanwhile: complete, good (an undo may go to
        # it), not the failed of the copy.
        ("failed", ("complete", True), ("complete", True)),
        # A retry begun meanwhile, which the change cuts short: superseded.
        ("failed", ("in_progress", False), ("superseded", False)),
        # Failed meanwhile: failed (its error stays).
        ("in_progress", ("failed", False), ("failed", False)),
        # Nothing marked: what the change made.
        ("in_progress", None, ("superseded", False)),
    ],
)
def test_a_change_keeps_the_outcomes_reported_since_it_read_the_book(
    copied: str, reported: tuple[str, bool] | None, expected: tuple[str, bool]
) -> None:
    one, two = marked(revision(1), "complete", True), marked(revision(2), copied)
    # The change: a new revision 3, replacing 2.
    history = [*superseded([one, two], [2]), marked(revision(3), "in_progress")]
    told = [] if reported is None else [Outcome(2, *reported)]  # type: ignore[arg-type]
    assert outcomes(with_outcomes(history, told, [2])) == [
        (1, "complete", True),
        (2, *expected),
        (3, "in_progress", False),
    ]


def test_what_changes_how_replicas_start_under_one_version_is_named() -> None:
    def content(version: str | None, **replica: object) -> controller.RevisionContent:
        rc = controller.ReplicaConfig("m:C", **replica)
        return controller.RevisionContent(rc, version, None, {"CPU": 1.0})

    before = content("v3")
    assert started_differently(before, content("v3", init_kwargs={"a": 1})) == ("init_kwargs",)
    assert started_differently(before, content("v3", init_args=(1,))) == ("init_args",)
    moved = attrs.evolve(content("v3"), resources={"CPU": 2.0})
    assert started_differently(before, moved) == ("resources",)
    other = attrs.evolve(content("v3"), replica_config=controller.ReplicaConfig("m:D"))
    assert started_differently(before, other) == ("entrypoint",)
    # A new version replaces the replicas; an unversioned config's get one at each deploy.
    assert started_differently(before, content("v4", init_kwargs={"a": 1})) == ()
    assert started_differently(content(None), content(None, init_kwargs={"a": 1})) == ()
    # As the revision's digest tells them apart: 7 and 7.0 reach the replica differently.
    assert started_differently(
        content("v3", init_kwargs={"ms": 7}), content("v3", init_kwargs={"ms": 7.0})
    ) == ("init_kwargs",)
    # What replicas are reconfigured with in place is no start.
    assert started_differently(before, attrs.evolve(before, user_config={"g": 1})) == ()
