"""The API's contract, in process: the OpenAPI document is valid and agrees with the model that
validates, and the server keeps to HTTP's rules (405 with Allow, HEAD, strict flags, JSON only,
bodies read only where taken) and to Prometheus's. tests/daemon/test_api_contract.py then lets
schemathesis loose on a real daemon."""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from openapi_spec_validator import validate
from prometheus_client.parser import text_string_to_metric_families

import controller
from controller import BackendConfig, ReplicaConfig
from controller._api.metrics import Metrics
from controller._api.openapi import OPENAPI
from controller._model.config.manifest import parse_backend
from controller.testing import FakeRuntime

from ..asgi import api
from ..conftest import RC, config

STORE = controller.MemoryStore
FIELDS: dict[str, Any] = OPENAPI["components"]["schemas"]["Backend"]["properties"]


# -- the document --


def test_the_document_is_valid_openapi() -> None:
    validate(OPENAPI)


def test_every_operation_documents_what_it_answers() -> None:
    for path, item in OPENAPI["paths"].items():
        for method, op in item.items():
            if method == "parameters":
                continue
            codes = set(op["responses"])
            assert any(c.startswith("2") for c in codes), (path, method)
            for code, response in op["responses"].items():
                assert "content" in response, (path, method, code)  # a schema for every body
            if path != "/healthz":
                assert "401" in codes, (path, method)
            if method in ("put", "post") and "requestBody" in op:
                assert {"400", "413", "415", "422"} <= codes, (path, method)


def model_accepts(field: str, value: object) -> bool:
    fields = {"entrypoint": "m:C", field: value}
    decl, _ = parse_backend("a", json.loads(json.dumps(fields)))
    return decl is not None


def schema_accepts(field: str, value: object) -> bool:
    return bool(jsonschema_rs.validator_for(FIELDS[field]).is_valid(value))


SPECIAL: list[object] = [
    None, True, 0, 1, -1, 0.0, 0.05, 0.1, 0.5, 1.0, 1.5, 2.0, 3, 10**6, 10**6 + 1, 1e15, 1e16,
    10**18, 10**400, 1e300, -0.0, "", "v1", "v\u00e9", "x" * 200, "x" * 201, "a\nb", "m:C",
    "a.b:C", "a:b.c", "\u00e9:b", "m:C\n", "m", "1m:C", [], [1, "a"], {}, {"CPU": 1},
    {"CPU": -1}, {"": 1}, {"CPU": 1e16}, {"k": 1}, {"not an identifier": 1}, {"\u00e9": 1},
    {"_k9": [1]},
]  # fmt: skip

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)


@pytest.mark.parametrize("field", sorted(FIELDS))
@settings(max_examples=150, deadline=None)
@given(value=st.sampled_from(SPECIAL) | json_values)
def test_the_document_and_the_model_agree_on_every_field(field: str, value: object) -> None:
    assert schema_accepts(field, value) == model_accepts(field, value), (field, value)


def test_the_one_rule_across_fields_is_in_the_document_too() -> None:
    validator = jsonschema_rs.validator_for(OPENAPI["components"]["schemas"]["Backend"])
    for surge, unavailable in ((0, 0), (0.0, 0), (0, 1), (1, 0)):
        body = {"entrypoint": "m:C", "max_surge": surge, "max_unavailable": unavailable}
        decl, _ = parse_backend("a", body)
        assert validator.is_valid(body) == (decl is not None), body


def test_a_whole_number_written_with_a_point_is_that_number() -> None:
    # JSON does not tell 3 from 3.0, and neither does the document: neither does the model.
    cfg = BackendConfig.from_dict(
        {"num_replicas": 3.0, "health_check_failure_threshold": 2.0, "max_surge": 2.0}
    )
    assert (cfg.num_replicas, cfg.health_check_failure_threshold, cfg.max_surge) == (3, 2, 2)
    assert BackendConfig(max_surge=1.0).max_surge == 1.0  # a fraction: all of them
    assert ReplicaConfig("m:C", init_kwargs={"_k9": 1}).init_kwargs == {"_k9": 1}


# -- HTTP semantics --


async def test_each_path_refuses_other_methods_with_405_and_allow() -> None:
    async with controller.open_controller(
        runtime=FakeRuntime(auto_ready=True), store=STORE()
    ) as ctl:
        call = api(ctl)
        cases = {
            "/healthz": "GET, HEAD",
            "/api/v1/backends": "GET, HEAD",
            "/api/v1/backends/a": "GET, HEAD, PUT, DELETE",
            "/api/v1/backends/a/logs": "GET, HEAD",
            "/api/v1/apply": "POST",
            "/api/v1/watch": "GET, HEAD",
            "/api/v1/shutdown": "POST",
        }
        for path, allow in cases.items():
            for method in ("PATCH", "TRACE", "OPTIONS", "POST" if "POST" not in allow else "PUT"):
                status, headers, _ = await call(method, path)
                assert (status, headers.get("allow")) == (405, allow), (method, path)
        assert (await call("GET", "/nope"))[0] == 404
        assert (await call("GET", "/nope", token=None))[0] == 401  # no map of paths for free


async def test_an_unknown_name_is_named_as_meant_not_as_encoded() -> None:
    async with controller.open_controller(
        runtime=FakeRuntime(auto_ready=True), store=STORE()
    ) as ctl:
        call = api(ctl)
        for sent, meant in (("a%20b", "a b"), ("%C3%A9%E5%90%8D", "é名"), ("%252e", "%2e")):
            for method, path in (("GET", sent), ("POST", f"{sent}/restart")):
                status, _, body = await call(method, f"/api/v1/backends/{path}")
                assert status == 404, (method, path)
                assert repr(meant) in json.loads(body)["error"]["message"], (method, path)


async def test_head_answers_the_headers_of_get_and_no_body() -> None:
    async with controller.open_controller(
        runtime=FakeRuntime(auto_ready=True), store=STORE()
    ) as ctl:
        call = api(ctl)
        # Answers that do not change between two calls (a status's ages do).
        for path in ("/healthz", "/api/v1/backends", "/api/v1/backends/a", "/openapi.json"):
            got, _, got_body = await call("GET", path)
            status, headers, body = await call("HEAD", path)
            assert (status, body) == (got, b""), path
            assert headers["content-length"] == str(len(got_body)), path
        with trio.fail_after(1):  # a HEAD of the long poll does not wait for a change
            assert (await call("HEAD", "/api/v1/watch", query=b"since=1&timeout_s=60"))[0] == 200


async def test_flags_are_true_or_false_and_nothing_else() -> None:
    async with controller.open_controller(
        runtime=FakeRuntime(auto_ready=True), store=STORE()
    ) as ctl:
        await (await ctl.deploy("a", config(num_replicas=1), RC)).wait()
        call = api(ctl)
        for bad in (b"force=-1", b"force=yes", b"force=1", b"force="):
            status, _, body = await call("DELETE", "/api/v1/backends/a", query=bad)
            assert status == 400, bad
            assert b"force must be true or false" in body
        assert not ctl.status("a").deleting  # refused: nothing changed
        for bad in (b"since=+5", b"since=5_0", b"since=%205", b"timeout_s=nan", b"timeout_s=1e999"):
            assert (await call("GET", "/api/v1/watch", query=bad))[0] == 400, bad
        assert (await call("DELETE", "/api/v1/backends/a", query=b"force=true"))[0] == 202


async def test_bodies_must_be_json_and_are_read_only_where_taken() -> None:
    async with controller.open_controller(
        runtime=FakeRuntime(auto_ready=True), store=STORE()
    ) as ctl:
        call = api(ctl)
        body = json.dumps({"entrypoint": "m:C"}).encode()
        for kind in (None, b"text/plain", b"application/x-www-form-urlencoded"):
            status, _, answer = await call("PUT", "/api/v1/backends/a", body, content_type=kind)
            assert status == 415, kind
            assert b"application/json" in answer
        assert ctl.status().backends == ()
        ok = b"application/json; charset=utf-8"
        assert (await call("PUT", "/api/v1/backends/a", body, content_type=ok))[0] == 200
        # A GET ignores a body it does not take, however large.
        assert (await call("GET", "/api/v1/backends", b"x" * (2 << 20)))[0] == 200
        assert (await call("PUT", "/api/v1/backends/b", b"x" * (2 << 20)))[0] == 413


async def test_the_watch_resets_a_cursor_it_never_handed_out() -> None:
    async with controller.open_controller(
        runtime=FakeRuntime(auto_ready=True), store=STORE()
    ) as ctl:
        await (await ctl.deploy("a", config(num_replicas=1), RC)).wait()
        call = api(ctl)
        with trio.fail_after(1):
            _, _, body = await call("GET", "/api/v1/watch", query=b"since=999999&timeout_s=30")
        answer = json.loads(body)
        assert answer["complete"] is True
        assert [s["name"] for s in answer["snapshots"]] == ["a"]
        assert answer["cursor"] < 999999


async def test_metrics_parse_and_every_backend_state_is_published() -> None:
    metrics = Metrics()
    async with controller.open_controller(
        runtime=metrics.wrap_runtime(FakeRuntime(auto_ready=True)),
        store=STORE(),
        observer=metrics,
    ) as ctl:
        metrics.watch_status(ctl.status)
        await (await ctl.deploy("a", config(num_replicas=1), RC)).wait()
        status, headers, body = await api(ctl, metrics)("GET", "/metrics")
        assert status == 200
        assert headers["content-type"].startswith("text/plain; version=0.0.4")
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        states = {s.labels["state"]: s.value for s in families["controller_backend_state"].samples}
        assert states == {s.value: float(s is controller.BackendState.HEALTHY) for s in
                          controller.BackendState}  # fmt: skip
        for name, family in families.items():
            assert name.startswith("controller_"), name
            if family.type == "counter":
                assert all(s.name.endswith(("_total", "_created")) for s in family.samples)


async def test_what_the_second_attack_found_in_the_edges_of_http() -> None:
    async with controller.open_controller(
        runtime=FakeRuntime(auto_ready=True), store=STORE()
    ) as ctl:
        await (await ctl.deploy("echo", config(num_replicas=1), RC)).wait()
        call = api(ctl)
        # An encoded "/" stays in the name, which then fails its pattern: no other endpoint.
        status, _, body = await call(
            "GET", "/api/v1/backends/echo/logs", raw_path=b"/api/v1/backends/echo%2Flogs"
        )
        assert status == 404, body
        assert b"UnknownBackend" in body
        raw = b"/api/v1/backends%2Fecho"
        assert (await call("GET", "/api/v1/backends/echo", raw_path=raw))[0] == 404
        # NaN and Infinity are not JSON: a malformed body, not a bad value.
        for literal in (b"NaN", b"Infinity", b"-Infinity"):
            body = b'{"entrypoint": "m:C", "user_config": ' + literal + b"}"
            status, _, answer = await call("PUT", "/api/v1/backends/a", body)
            assert status == 400, answer
        # A HEAD of the watch checks its parameters as a GET does.
        for query in (b"timeout_s=x", b"timeout_s=61"):
            assert (await call("HEAD", "/api/v1/watch", query=query))[0] == 400
        # A body said to be too large is refused before it is read.
        huge = ((b"content-length", b"99999999999"),)
        assert (await call("PUT", "/api/v1/backends/a", headers=huge))[0] == 413
        # Shutdown takes no body, so it needs no content type.
        status, _, body = await call(
            "POST", "/api/v1/shutdown", query=b"wait=false", content_type=None
        )
        assert status == 202, body
        assert ctl.status("echo").deleting
