"""``GET /api/v1/backends`` in pages, filtered by state, and as a summary: in process."""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs

import controller
from controller._api.app import Api
from controller._api.openapi import OPENAPI
from controller.testing import FakeRuntime, FakeState

from ..asgi import call
from ..conftest import config, opened, settle

TOKEN = "l" * 32
RC = controller.ReplicaConfig("app.replica:Echo")


def conforms(value: Any) -> bool:
    document = {"$ref": "#/components/schemas/BackendList", "components": OPENAPI["components"]}
    return bool(jsonschema_rs.validator_for(document).is_valid(value))


async def listing(app: Api, query: str) -> tuple[int, Any]:
    status, _, body = await call(app, "GET", "/api/v1/backends", query=query.encode(), token=TOKEN)
    return status, json.loads(body)


async def test_pages_follow_the_names_and_filters_keep_only_those_states() -> None:
    runtime = FakeRuntime()
    async with opened(runtime) as ctl:
        app = Api(ctl, token=TOKEN, render_metrics=lambda: b"", request_shutdown=lambda: None)
        names = [f"b{i:02d}" for i in range(7)]
        for name in names:
            await ctl.deploy(name, config(num_replicas=1), RC)
        await settle()
        # Two become ready; the others stay starting (UPSCALING).
        for tag in sorted(runtime.tags(FakeState.STARTING))[:2]:
            runtime.finish_start(tag)
        await settle()

        status, whole = await listing(app, "")
        assert status == 200
        assert [b["name"] for b in whole["backends"]] == names
        assert "next" not in whole

        seen: list[str] = []
        after = None
        pages = 0
        while True:
            query = "limit=3" + ("" if after is None else f"&after={after}")
            status, page = await listing(app, query)
            assert status == 200
            assert conforms(page), page
            seen += [b["name"] for b in page["backends"]]
            pages += 1
            after = page["next"]
            if after is None:
                break
        assert (seen, pages) == (names, 3)

        healthy = {b["name"] for b in whole["backends"] if b["state"] == "HEALTHY"}
        assert len(healthy) == 2
        status, only = await listing(app, "state=HEALTHY")
        assert {b["name"] for b in only["backends"]} == healthy
        status, both = await listing(app, "state=HEALTHY,UPSCALING&limit=100")
        assert [b["name"] for b in both["backends"]] == names
        assert both["next"] is None
        status, none = await listing(app, "state=DELETING")
        assert none["backends"] == []

        status, summary = await listing(app, "view=summary&limit=2&after=b04")
        assert [b["name"] for b in summary["backends"]] == ["b05", "b06"]
        assert all("replicas" not in b and "events" not in b for b in summary["backends"])
        assert summary["backends"][0]["counts"] == whole["backends"][5]["counts"]
        assert conforms(summary), summary


async def test_bad_paging_and_filters_are_refused_naming_the_parameter() -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        app = Api(ctl, token=TOKEN, render_metrics=lambda: b"", request_shutdown=lambda: None)
        for query, word in [
            ("limit=0", "limit"),
            ("limit=10001", "limit"),
            ("limit=x", "limit"),
            ("state=HAPPY", "state"),
            ("state=HEALTHY,", "state"),
            ("view=everything", "view"),
        ]:
            status, answer = await listing(app, query)
            assert status == 400, query
            assert answer["error"]["message"].startswith(word), answer
