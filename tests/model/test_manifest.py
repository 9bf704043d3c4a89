"""Manifests: every fault reported at once, with its source, backend and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import controller
from controller._model.config.manifest import parse_manifest
from controller._sources import load_manifest


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(controller.ManifestError) as caught:
        parse_manifest(
            {
                "backends": {
                    "ok": {"entrypoint": "m:C", "num_replicas": 2},
                    "a": {"entrypoint": "m:C", "num_replicas": -1, "verison": "v1"},
                    "b": {"entrypoint": "nope", "max_surge": 0, "max_unavailable": 0},
                    "bad name": {"entrypoint": "m:C"},
                },
                "extra": 1,
            },
            "f.toml",
        )
    error = caught.value
    assert error.source == "f.toml"
    assert error.problems == [
        "extra: unknown top-level key; the keys are 'backends' and 'applications'",
        # A typo is named for what it looks like (all the fields once was a newcomer's wall).
        "backend 'a': verison: unknown field; did you mean `version`?",
        "backend 'a': num_replicas: must be a whole number from 0 to 1000000 (got -1)",
        "backend 'b': entrypoint: must look like \"package.module:Class\" (got 'nope')",
        "backend 'bad name': a backend name is 1-63 characters of letters, digits, '_', '.' or "
        "'-', starting with a letter or digit (got 'bad name')",
    ]
    assert str(error).startswith("5 problems in f.toml; nothing was applied:\n  - extra:")


def test_rules_between_fields_are_checked_once_each_field_is_fine() -> None:
    with pytest.raises(controller.ManifestError) as caught:
        parse_manifest(
            {"backends": {"b": {"entrypoint": "m:C", "max_surge": 0, "max_unavailable": 0}}}, "x"
        )
    [problem] = caught.value.problems
    assert problem.startswith("backend 'b': max_surge: max_surge and max_unavailable may not both")


def test_toml_and_json_files_give_the_same_backends(tmp_path: Path) -> None:
    toml = tmp_path / "b.toml"
    toml.write_text(
        '[backends.echo]\nentrypoint = "m:C"\nnum_replicas = 2\ninit_kwargs = { x = 1 }\n'
        "resources = { CPU = 0.5 }\n"
    )
    data = {
        "backends": {
            "echo": {
                "entrypoint": "m:C",
                "num_replicas": 2,
                "init_kwargs": {"x": 1},
                "resources": {"CPU": 0.5},
            }
        }
    }
    js = tmp_path / "b.json"
    js.write_text(json.dumps(data))
    from_toml, from_json = load_manifest(toml), load_manifest(js)
    assert from_toml == from_json
    [echo] = from_toml.backends
    assert echo.backend_config.num_replicas == 2
    assert echo.replica_config.init_kwargs == {"x": 1}
    # The flat form round-trips.
    assert parse_manifest({"backends": {"echo": echo.to_dict()}}, "again") == from_toml


def test_unreadable_and_malformed_files_say_so(tmp_path: Path) -> None:
    with pytest.raises(controller.ManifestError, match="cannot read the file"):
        load_manifest(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[backends.a\n")
    with pytest.raises(controller.ManifestError, match="not valid TOML"):
        load_manifest(bad)


def test_an_unknown_field_far_from_any_lists_them_all() -> None:
    with pytest.raises(controller.ManifestError) as caught:
        parse_manifest({"backends": {"a": {"entrypoint": "m:C", "colour": "blue"}}}, "f.toml")
    (problem,) = caught.value.problems
    assert problem.startswith("backend 'a': colour: unknown field; known fields are affinity, ")
    assert problem.endswith("user_config, version")


def test_a_top_level_typo_is_named_for_the_key_it_looks_like() -> None:
    with pytest.raises(controller.ManifestError) as caught:
        parse_manifest({"backend": {"a": {"entrypoint": "m:C"}}}, "f.toml")
    assert caught.value.problems == ["backend: unknown top-level key; did you mean 'backends'?"]
