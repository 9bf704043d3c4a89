"""Rollout steering over HTTP and from the CLI: revisions listed with their causes, undo, pause
and resume, and the refusals (404, 409, 422) that write nothing. The API in process on
FakeRuntime; then the CLI end to end against a real daemon."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import controller
from controller._api.app import Api
from controller._api.bodies import undo_request
from controller._api.http import HTTPError
from controller._api.openapi import OPENAPI
from controller.testing import FakeRuntime

from ..asgi import call
from ..conftest import settle
from ..daemons import LIMIT_S, manifest, running, trivial

TOKEN = "t" * 32
SCHEMAS: dict[str, Any] = OPENAPI["components"]["schemas"]


class Client:
    """The app in process, with the token, JSON in and out."""

    def __init__(self, ctl: controller.Controller, store: controller.MemoryStore):
        self.ctl = ctl
        self.store = store
        self.app = Api(
            ctl, token=TOKEN, epoch="e", render_metrics=lambda: b"", request_shutdown=lambda: None
        )

    async def __call__(
        self, method: str, path: str, data: Any = None, **options: Any
    ) -> tuple[int, Any]:
        options.setdefault("token", TOKEN)
        body = b"" if data is None else json.dumps(data).encode()
        status, _, answer = await call(self.app, method, path, body, **options)
        return status, json.loads(answer) if answer else None

    async def deploy(self, name: str, version: str, message: str | None = None) -> int:
        """PUT a backend; wait until its goal is reached; its generation."""
        query = b"" if message is None else b"message=" + message.encode()
        status, answer = await self("PUT", f"/api/v1/backends/{name}", spec(version), query=query)
        assert status == 200, answer
        await self.settled(name, answer["generation"])
        return int(answer["generation"])

    async def settled(self, name: str, generation: int) -> None:
        def done(ctl: controller.Controller) -> bool:
            status = ctl.status(name)
            return status.generation == generation and status.goal_done

        await self.ctl.wait_until(done)


def spec(version: str) -> dict[str, Any]:
    return {"entrypoint": "app.replica:Echo", "num_replicas": 2, "version": version}


@asynccontextmanager
async def serving(**options: Any) -> AsyncIterator[Client]:
    store = controller.MemoryStore()
    with trio.fail_after(10):
        async with controller.open_controller(
            runtime=FakeRuntime(auto_ready=True), store=store, **options
        ) as ctl:
            yield Client(ctl, store)


def conforms(schema: str, value: Any) -> bool:
    """`value` is what the document says the answer `schema` is."""
    document = {"$ref": f"#/components/schemas/{schema}", "components": OPENAPI["components"]}
    return bool(jsonschema_rs.validator_for(document).is_valid(value))


# -- listing --


async def test_revisions_are_listed_with_their_cause_and_config() -> None:
    async with serving() as api:
        await api.deploy("a", "v1", message="first%20one")
        await api.deploy("a", "v2")
        status, answer = await api("GET", "/api/v1/backends/a/revisions")
        assert status == 200
        assert conforms("RevisionList", answer), answer
        assert answer["name"] == "a"
        first, second = answer["revisions"]
        assert [(r["number"], r["version"], r["outcome"], r["good"], r["current"])
                for r in answer["revisions"]] == [
            (1, "v1", "complete", True, False),
            (2, "v2", "complete", True, True),
        ]  # fmt: skip
        assert first["cause"] == {
            "via": "api",
            "message": "first one",
            "manifest": None,
            "manifest_digest": None,
        }
        assert second["cause"]["message"] is None
        assert first["config"] == {
            "entrypoint": "app.replica:Echo",
            "init_args": [],
            "init_kwargs": {},
            "version": "v1",
            "user_config": None,
            "resources": {},
        }
        assert first["created_at"].endswith("Z")
        assert (first["code"], first["code_changed"]) == (None, None)  # not on the code path
        assert (first["restores"], first["automatic"], first["error"]) == (None, False, None)
        assert first["digest"] != second["digest"]

        status, backend = await api("GET", "/api/v1/backends/a")
        assert conforms("BackendStatus", backend), backend
        assert backend["rollout"] == {
            "revision": 2,
            "current_revision": 2,
            "outcome": "complete",
            "paused": False,
            "pending_revision": None,
            "error": None,
            "restores": None,
            "automatic": False,
            "canary": None,
        }
        assert (await api("HEAD", "/api/v1/backends/a/revisions"))[0] == 200
        status, answer = await api("GET", "/api/v1/backends/nope/revisions")
        assert (status, answer["error"]["type"]) == (404, "UnknownBackend")


async def test_an_apply_names_its_manifest_and_digest_in_the_revisions() -> None:
    async with serving() as api:
        digest = hashlib.sha256(b"the file").hexdigest()
        body = {
            "backends": {"a": spec("v1")},
            "source": "app.toml",
            "source_digest": digest,
            "message": "release 1",
            "via": "cli",
        }
        status, answer = await api("POST", "/api/v1/apply", body)
        assert status == 200, answer
        cause = api.ctl.revisions("a")[0].cause
        assert cause == controller.Cause("cli", "release 1", "app.toml", digest)


# -- steering --


async def test_undo_rolls_back_and_a_named_revision_too() -> None:
    async with serving() as api:
        await api.deploy("a", "v1")
        await api.deploy("a", "v2")
        # No body at all (and so no content type): the last good revision.
        status, answer = await api("POST", "/api/v1/backends/a/undo", content_type=None)
        assert status == 202, answer
        assert conforms("RolloutAccepted", answer), answer
        assert answer == {
            "name": "a",
            "generation": 3,
            "revision": 3,
            "restores": 1,
            "paused": False,
            "pending_revision": None,
        }
        await api.settled("a", 3)
        assert api.ctl.status("a").version == "v1"
        body = {"to_revision": 2, "message": "v2 was fine", "via": "cli"}
        status, answer = await api("POST", "/api/v1/backends/a/undo", body)
        assert (status, answer["revision"], answer["restores"]) == (202, 4, 2)
        await api.settled("a", 4)
        assert api.ctl.status("a").version == "v2"
        last = api.ctl.revisions("a")[-1]
        assert (last.restores, last.cause) == (2, controller.Cause("cli", "v2 was fine"))
        # Back to what runs: nothing written, the same generation.
        status, answer = await api("POST", "/api/v1/backends/a/undo", {"to_revision": 4})
        assert (status, answer["generation"]) == (202, 4)


async def test_undo_to_a_revision_not_kept_is_404_and_changes_nothing() -> None:
    async with serving() as api:
        await api.deploy("a", "v1")
        await api.deploy("a", "v2")
        status, answer = await api("POST", "/api/v1/backends/a/undo", {"to_revision": 9})
        assert status == 404
        assert answer["error"]["type"] == "UnknownRevision"
        assert "keeps no revision 9 (kept: 1, 2)" in answer["error"]["message"]
        status, answer = await api("POST", "/api/v1/backends/nope/undo", {})
        assert (status, answer["error"]["type"]) == (404, "UnknownBackend")
        assert api.ctl.status("a").generation == 2
        assert len(api.ctl.revisions("a")) == 2


async def test_no_good_revision_is_409() -> None:
    async with serving() as api:
        await api.deploy("a", "v1")
        status, answer = await api("POST", "/api/v1/backends/a/undo", {})
        assert (status, answer["error"]["type"]) == (409, "NoGoodRevision")


async def test_pause_record_resume_and_no_undo_while_paused() -> None:
    async with serving() as api:
        await api.deploy("a", "v1")
        await api.deploy("a", "v2")
        status, answer = await api("POST", "/api/v1/backends/a/pause")
        assert status == 202, answer
        assert conforms("RolloutAccepted", answer), answer
        assert (answer["paused"], answer["revision"], answer["pending_revision"]) == (True, 2, None)
        status, answer = await api("PUT", "/api/v1/backends/a", spec("v3"))
        assert status == 200
        backend = (await api("GET", "/api/v1/backends/a"))[1]
        assert backend["version"] == "v2"  # recorded, not rolled out
        assert (backend["rollout"]["paused"], backend["rollout"]["pending_revision"]) == (True, 3)
        revisions = (await api("GET", "/api/v1/backends/a/revisions"))[1]["revisions"]
        assert [(r["outcome"], r["current"]) for r in revisions][-2:] == [
            ("complete", True),
            ("pending", False),
        ]

        generation = api.ctl.status("a").generation
        status, answer = await api("POST", "/api/v1/backends/a/undo", {"to_revision": 1})
        assert (status, answer["error"]["type"]) == (409, "Paused")
        assert "resume it first" in answer["error"]["message"]
        assert api.ctl.status("a").generation == generation

        status, answer = await api("POST", "/api/v1/backends/a/resume")
        assert status == 202, answer
        assert (answer["paused"], answer["revision"], answer["pending_revision"]) == (
            False,
            3,
            None,
        )
        await api.settled("a", answer["generation"])
        assert api.ctl.status("a").version == "v3"
        for verb in ("pause", "resume", "undo"):
            status, answer = await api("POST", f"/api/v1/backends/nope/{verb}")
            assert (status, answer["error"]["type"]) == (404, "UnknownBackend"), verb


async def test_undo_of_changed_code_is_409_unless_forced(tmp_path: Path) -> None:
    (tmp_path / "shop.py").write_text("class App:\n    pass\n")
    async with serving(code_path=[str(tmp_path)]) as api:
        for version in ("v1", "v2"):
            body = {"entrypoint": "shop:App", "version": version}
            status, answer = await api("PUT", "/api/v1/backends/a", body)
            await api.settled("a", answer["generation"])
        first = (await api("GET", "/api/v1/backends/a/revisions"))[1]["revisions"][0]
        assert first["code"]["module"] == "shop"
        assert first["code_changed"] is False
        (tmp_path / "shop.py").write_text("class App:\n    changed = True\n")
        status, answer = await api("POST", "/api/v1/backends/a/undo", {})
        assert (status, answer["error"]["type"]) == (409, "CodeChanged")
        assert "undo with force" in answer["error"]["message"]
        status, answer = await api("POST", "/api/v1/backends/a/undo", {"force": True})
        assert (status, answer["restores"]) == (202, 1)


# -- what is refused, and writes nothing --


async def test_a_bad_cause_is_422_naming_the_field_and_writes_nothing() -> None:
    async with serving() as api:
        await api.deploy("a", "v1")
        await api.deploy("a", "v2")
        await settle()  # the loop's own writes, after the goal, are done
        writes = api.store.writes
        long = "x" * 2000
        cases: list[tuple[str, str, Any, bytes, str]] = [
            ("POST", "/api/v1/backends/a/undo", {"message": long}, b"", "message: "),
            ("POST", "/api/v1/backends/a/undo", {"message": "a\nb"}, b"", "message: "),
            ("POST", "/api/v1/backends/a/undo", {"message": 5}, b"", "message: "),
            ("POST", "/api/v1/backends/a/undo", {"via": "python"}, b"", "via:"),
            ("POST", "/api/v1/backends/a/undo", {"to_revision": 0}, b"", "to_revision:"),
            ("POST", "/api/v1/backends/a/undo", {"to_revision": "1"}, b"", "to_revision:"),
            ("POST", "/api/v1/backends/a/undo", {"to_revision": 1.5}, b"", "to_revision:"),
            ("POST", "/api/v1/backends/a/undo", {"to_revision": True}, b"", "to_revision:"),
            ("POST", "/api/v1/backends/a/undo", {"to_revision": 2**63}, b"", "to_revision:"),
            ("POST", "/api/v1/backends/a/undo", {"force": "yes"}, b"", "force:"),
            ("POST", "/api/v1/backends/a/undo", {"typo": 1}, b"", "unknown fields: typo"),
            ("POST", "/api/v1/backends/a/undo", [1], b"", "must be an object"),
            ("PUT", "/api/v1/backends/a", spec("v3"), b"message=a%0Ab", "message: "),
            ("PUT", "/api/v1/backends/a", spec("v3"), b"message=" + b"x" * 1001, "message: "),
            (
                "POST",
                "/api/v1/apply",
                {"backends": {"a": spec("v3")}, "message": long},
                b"",
                "message: ",
            ),
            (
                "POST",
                "/api/v1/apply",
                {"backends": {"a": spec("v3")}, "source_digest": "ABC"},
                b"",
                "source_digest: ",
            ),
            (
                "POST",
                "/api/v1/apply",
                {"backends": {"a": spec("v3")}, "source": "a\nb.toml"},
                b"",
                "source: ",
            ),
            ("POST", "/api/v1/apply", {"backends": {}, "via": "ray"}, b"", "via:"),
        ]
        for method, path, body, query, field in cases:
            status, answer = await api(method, path, body, query=query)
            assert status == 422, (path, body, query, answer)
            assert answer["error"]["type"] == "Invalid"
            assert field in answer["error"]["message"], (body, answer)
        await settle()
        assert api.store.writes == writes
        assert api.ctl.status("a").generation == 2
        assert [r.number for r in api.ctl.revisions("a")] == [1, 2]


async def test_steering_needs_the_token_json_and_the_right_method() -> None:
    async with serving() as api:
        await api.deploy("a", "v1")
        for verb in ("undo", "pause", "resume"):
            status, answer = await api("POST", f"/api/v1/backends/a/{verb}", token=None)
            assert (status, answer["error"]["type"]) == (401, "Unauthorized"), verb
        status, _, _ = await call(api.app, "POST", "/api/v1/backends/a/undo", b"{}", token="x")
        assert status == 401
        path = "/api/v1/backends/a/undo"
        sent = b'{"to_revision": 1}'
        status, _, _ = await call(api.app, "POST", path, sent, token=TOKEN, content_type=None)
        assert status == 415  # a body that is sent must say it is JSON
        status, _, _ = await call(api.app, "POST", path, b"{", token=TOKEN)
        assert status == 400
        for path, allow in (
            ("/api/v1/backends/a/undo", "POST"),
            ("/api/v1/backends/a/pause", "POST"),
            ("/api/v1/backends/a/revisions", "GET, HEAD"),
        ):
            status, headers, _ = await call(api.app, "PUT", path, token=TOKEN)
            assert (status, headers.get("allow")) == (405, allow)
        assert not api.ctl.status("a").rollout.paused  # type: ignore[union-attr]


async def test_no_steering_while_shutting_down() -> None:
    async with serving() as api:
        await api.deploy("a", "v1")
        status, _ = await api("POST", "/api/v1/shutdown", query=b"wait=false", content_type=None)
        assert status == 202
        for verb in ("undo", "pause", "resume"):
            status, answer = await api("POST", f"/api/v1/backends/a/{verb}", {})
            assert (status, answer["error"]["type"]) == (503, "ShuttingDown"), verb


# -- the document agrees with the model --

text = st.text(max_size=12) | st.sampled_from(["", "a\nb", "tab\there", "\x7f", "é", "x" * 1001])


@settings(max_examples=200, deadline=None)
@given(
    body=st.dictionaries(
        st.sampled_from(["to_revision", "force", "message", "via"]),
        st.none()
        | st.booleans()
        | st.integers(min_value=-2, max_value=2**64)
        | st.floats(allow_nan=False, allow_infinity=False)
        | text
        | st.sampled_from(["api", "cli", "python"]),
    )
)
def test_the_undo_body_document_and_the_model_agree(body: dict[str, Any]) -> None:
    try:
        undo_request(body)
        accepted = True
    except HTTPError:
        accepted = False
    schema = {"$ref": "#/components/schemas/Undo", "components": OPENAPI["components"]}
    assert jsonschema_rs.validator_for(schema).is_valid(body) == accepted, body


@settings(max_examples=200, deadline=None)
@given(value=text | st.text(alphabet="0123456789abcdefABCDEF", max_size=130))
def test_the_cause_fields_in_the_document_agree_with_the_model(value: str) -> None:
    apply = SCHEMAS["Apply"]["properties"]
    for field, schema in (
        ("message", apply["message"]),
        ("manifest", apply["source"]),
        ("manifest_digest", apply["source_digest"]),
    ):
        try:
            controller.Cause(**{field: value})
            accepted = True
        except controller.ConfigError:
            accepted = False
        assert jsonschema_rs.validator_for(schema).is_valid(value) == accepted, (field, value)


# -- the CLI, end to end --


async def test_history_undo_pause_and_resume_through_the_cli(state_dir: Path) -> None:
    file = state_dir / "backends.toml"
    with trio.fail_after(LIMIT_S * 2):
        async with running(state_dir) as daemon:
            file.write_text(manifest(a=trivial(1)))
            result = await daemon.cli("apply", "-f", str(file), "--wait", "--message", "first")
            assert result.returncode == 0, result.stderr
            digest = hashlib.sha256(file.read_bytes()).hexdigest()
            file.write_text(manifest(a=trivial(1, "v2")))
            assert (await daemon.cli("apply", "-f", str(file), "--wait")).returncode == 0

            result = await daemon.cli("rollout", "history", "a")
            assert result.returncode == 0, result.stderr
            lines = result.stdout.decode().splitlines()
            assert lines[0].split() == [
                "REVISION",
                "VERSION",
                "OUTCOME",
                "CODE",
                "CREATED",
                "CAUSE",
            ]
            assert lines[1].split()[:4] == ["1", "v1", "complete", "matches"]
            assert lines[1].endswith(f'cli, from {file}: "first"')
            assert lines[2].split()[:4] == ["2*", "v2", "complete", "matches"]

            result = await daemon.cli("rollout", "undo", "a", "--to-revision", "9")
            assert result.returncode == 1
            assert "keeps no revision 9" in result.stderr.decode()

            result = await daemon.cli("rollout", "undo", "a", "--message", "bad v2", "--wait")
            assert result.returncode == 0, result.stderr
            out = result.stdout.decode()
            assert "backend/a rolling back to revision 1's content, as revision 3" in out
            assert out.rstrip().endswith("done")
            assert (await daemon.status())["a"]["version"] == "v1"
            history = json.loads((await daemon.cli("rollout", "history", "a", "--json")).stdout)
            assert history[0]["cause"]["manifest_digest"] == digest
            last = history[-1]
            assert (last["number"], last["restores"], last["current"]) == (3, 1, True)
            assert last["cause"] == {
                "via": "cli",
                "message": "bad v2",
                "manifest": None,
                "manifest_digest": None,
            }
            detail = (await daemon.cli("status", "a")).stdout.decode()
            assert (
                "Revision:    3, rollout complete, revision 1's content brought back by an undo"
                in detail
            )

            assert (await daemon.cli("rollout", "pause", "a")).returncode == 0
            file.write_text(manifest(a=trivial(1, "v3")))
            assert (await daemon.cli("apply", "-f", str(file))).returncode == 0
            detail = (await daemon.cli("status", "a")).stdout.decode()
            assert "paused, revision 4 pending" in detail
            result = await daemon.cli("rollout", "undo", "a")
            assert result.returncode == 2  # refused as it stands: nothing was applied
            assert "paused: resume it first" in result.stderr.decode()

            result = await daemon.cli("rollout", "resume", "a", "--wait")
            assert result.returncode == 0, result.stderr
            assert "rolling out revision 4" in result.stdout.decode()
            assert (await daemon.status())["a"]["version"] == "v3"
            result = await daemon.cli("rollout", "status", "a")
            assert result.returncode == 0, result.stderr
            assert result.stdout.decode().rstrip().endswith("done")

            code, error = await daemon.http("POST", "/api/v1/backends/a/undo", b"{}", token=None)
            assert (code, error["error"]["type"]) == (401, "Unauthorized")


@pytest.mark.parametrize("verb", ["history", "undo", "pause", "resume", "status"])
def test_every_rollout_command_needs_a_name(verb: str) -> None:
    from controller._cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["rollout", verb])


async def test_a_change_of_how_replicas_start_under_the_same_version_is_called_out(
    state_dir: Path,
) -> None:
    """Found by a newcomer: `broken.toml` after `canary_fixed.toml`, both at v3, applied in a
    second, reported HEALTHY and recorded a complete revision whose arguments could not start a
    replica, saying nothing of the running replicas keeping the old ones."""
    file = state_dir / "a.toml"
    with trio.fail_after(LIMIT_S * 2):
        async with running(state_dir) as daemon:
            file.write_text(manifest(a=trivial(1, "v3")))
            assert (await daemon.cli("apply", "-f", str(file), "--wait")).returncode == 0
            file.write_text(manifest(a=trivial(1, "v3", init_kwargs={"x": 1})))
            notice = (
                "note: init_kwargs changed under the same version: the replicas running keep "
                "the old, new ones get the new; give it a new version to replace them"
            )
            dry = await daemon.cli("apply", "-f", str(file), "--dry-run")
            assert dry.returncode == 0, dry.stderr
            assert notice in dry.stdout.decode(), dry.stdout
            applied = await daemon.cli("apply", "-f", str(file))
            assert applied.returncode == 0, applied.stderr
            assert notice in applied.stdout.decode(), applied.stdout
            history = await daemon.cli("rollout", "history", "a")
            assert (
                "revision 2: init_kwargs changed under version v3: the replicas running keep"
                in history.stdout.decode()
            ), history.stdout
            _, revisions = await daemon.http("GET", "/api/v1/backends/a/revisions")
            assert [r["same_version"] for r in revisions["revisions"]] == [[], ["init_kwargs"]]
            # A new version replaces them: nothing to say.
            file.write_text(manifest(a=trivial(1, "v4", init_kwargs={"x": 1})))
            applied = await daemon.cli("apply", "-f", str(file))
            assert "note:" not in applied.stdout.decode(), applied.stdout
