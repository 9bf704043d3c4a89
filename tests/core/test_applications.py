"""Applications: backends applied, undone, restarted, deleted and canaried as one, with
revisions of their own, kept in the store in the same batch as the members' specs. FakeRuntime
and MemoryStore under MockClock; the daemon's API and CLI are in test_applications_daemon.py."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import jsonschema_rs
import pytest
import trio

import controller
from controller import GoalOutcome, ManifestError, ReplicaState, RolloutError
from controller._api.app import Api
from controller._api.openapi import OPENAPI
from controller._leadership.standby import store_view
from controller._model.config.manifest import parse_manifest
from controller.testing import FakeRuntime

from ..asgi import call
from ..conftest import RC, opened, settle

pytestmark = pytest.mark.usefixtures("autojump_clock")


def shop(
    front: str = "v1",
    ranker: str = "v1",
    *,
    canary: dict[str, Any] | None = None,
    own: bool = False,
    **app: Any,
) -> controller.Manifest:
    """An entry backend and the backend it calls, grouped as application ``shop``: a `canary`
    block the application's, or each member's (`own`)."""
    extra = {"canary": canary} if canary is not None and own else {}
    if canary is not None and not own:
        app["canary"] = canary
    backends = {
        "front": {"entrypoint": "app:Front", "version": front, "route_prefix": "/shop", **extra},
        "ranker": {"entrypoint": "app:Ranker", "version": ranker, **extra},
        "lonely": {"entrypoint": "app:Other", "version": "v1"},
    }
    applications = {"shop": {"entry": "front", "backends": ["ranker"], **app}}
    return parse_manifest({"backends": backends, "applications": applications}, "shop.toml")


async def applied(ctl: controller.Controller, manifest: controller.Manifest) -> None:
    result = await ctl.apply_manifest(manifest)
    for goal in result.goals.values():
        await goal.wait()


def version(ctl: controller.Controller, name: str) -> str:
    return ctl.status(name).backend_config.version or ""


async def test_an_application_has_revisions_of_its_own_and_an_undo_restores_every_member() -> None:
    store = controller.MemoryStore()
    async with opened(FakeRuntime(auto_ready=True), store) as ctl:
        await applied(ctl, shop())
        await applied(ctl, shop())  # the same file: no new revision
        await applied(ctl, shop("v2", "v2"))
        first, second = ctl.applications.revisions("shop")
        assert (first.number, second.number) == (1, 2)
        assert first.members == {"front": 1, "ranker": 1}
        assert second.members == {"front": 2, "ranker": 2}
        goals = await ctl.applications.undo("shop")
        assert set(goals) == {"front", "ranker"}
        for goal in goals.values():
            await goal.wait()
            assert goal.outcome is GoalOutcome.COMPLETED
        assert (version(ctl, "front"), version(ctl, "ranker")) == ("v1", "v1")
        undo = ctl.applications.revisions("shop")[-1]
        assert (undo.number, undo.undone_to, undo.members) == (3, 1, {"front": 3, "ranker": 3})
        # Undone again: back to what revision 2 ran, both members at once.
        for goal in (await ctl.applications.undo("shop")).values():
            await goal.wait()
        assert (version(ctl, "front"), version(ctl, "ranker")) == ("v2", "v2")
        status = ctl.applications.status("shop")
        assert (status.entry, status.revision, status.state) == ("front", 4, "HEALTHY")
        assert [(m.name, m.entry, m.revision, m.recorded) for m in status.members] == [
            ("front", True, 4, 4),
            ("ranker", False, 4, 4),
        ]
    # The record was written with the specs, and a new controller over the store reads it.
    stored = json.loads((await store.read_all())["applications/shop"])
    assert [r["number"] for r in stored["revisions"]] == [1, 2, 3, 4]
    async with opened(FakeRuntime(auto_ready=True), store) as ctl:
        assert [r.number for r in ctl.applications.revisions("shop")] == [1, 2, 3, 4]
        for goal in (await ctl.applications.undo("shop", to_revision=1)).values():
            await goal.wait()
        assert (version(ctl, "front"), version(ctl, "ranker")) == ("v1", "v1")


async def test_an_undo_that_one_member_refuses_writes_nothing_for_any() -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        await applied(ctl, shop())
        await applied(ctl, shop("v2", "v2"))
        await ctl.pause("ranker")
        with pytest.raises(RolloutError, match="'ranker' is paused"):
            await ctl.applications.undo("shop")
        assert (version(ctl, "front"), version(ctl, "ranker")) == ("v2", "v2")
        assert len(ctl.applications.revisions("shop")) == 2
        with pytest.raises(RolloutError, match=r"keeps no revision 9 \(kept: 1, 2\)"):
            await ctl.applications.undo("shop", to_revision=9)
        with pytest.raises(controller.ConfigError, match="to_revision"):
            await ctl.applications.undo("shop", to_revision=0)
        with pytest.raises(controller.UnknownApplicationError, match="'nope'"):
            await ctl.applications.undo("nope")


async def test_a_restart_makes_one_application_revision_and_replaces_every_member() -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        await applied(ctl, shop())
        before = {n: {r.tag for r in ctl.status(n).replicas} for n in ("front", "ranker")}
        goals = await ctl.applications.restart("shop")
        for goal in goals.values():
            await goal.wait()
        for name in ("front", "ranker"):
            tags = {r.tag for r in ctl.status(name).replicas if r.state is ReplicaState.RUNNING}
            assert tags
            assert not tags & before[name]
        assert [r.members for r in ctl.applications.revisions("shop")] == [
            {"front": 1, "ranker": 1},
            {"front": 2, "ranker": 2},
        ]


async def test_a_delete_takes_every_member_and_a_member_alone_is_not_deleted() -> None:
    store = controller.MemoryStore()
    async with opened(FakeRuntime(auto_ready=True), store) as ctl:
        await applied(ctl, shop())
        with pytest.raises(RolloutError, match="member of application 'shop'"):
            await ctl.delete("ranker")
        goals = await ctl.applications.delete("shop")
        assert set(goals) == {"front", "ranker"}
        for goal in goals.values():
            await goal.wait()
        assert ctl.backend_names() == ["lonely"]
        assert ctl.applications.names() == []
        assert "applications/shop" not in await store.read_all()


async def test_prune_deletes_an_application_the_file_no_longer_declares() -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        await applied(ctl, shop())
        alone = parse_manifest(
            {"backends": {"lonely": {"entrypoint": "app:Other", "version": "v1"}}}, "x.toml"
        )
        result = await ctl.apply_manifest(alone, prune=True)
        assert set(result.deleted) == {"front", "ranker"}
        assert ctl.applications.names() == []
        # A shutdown's apply of nothing, pruned: every application goes with its members.
        await applied(ctl, shop())
        await ctl.apply({}, prune=True)
        assert ctl.applications.names() == []


async def test_names_are_checked_against_what_runs_before_anything_is_written() -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        await applied(ctl, shop())
        # A second application claiming ranker, while shop (not in the file) holds it.
        other = parse_manifest(
            {
                "backends": {"ranker": {"entrypoint": "app:Ranker", "version": "v9"}},
                "applications": {"search": {"entry": "ranker"}},
            },
            "other.toml",
        )
        with pytest.raises(controller.ConfigError, match="member of application 'shop'"):
            await ctl.apply_manifest(other)
        assert version(ctl, "ranker") == "v1"
        named_as_app = parse_manifest({"backends": {"shop": {"entrypoint": "app:X"}}}, "clash.toml")
        with pytest.raises(controller.ConfigError, match="application's name"):
            await ctl.apply_manifest(named_as_app)
        with pytest.raises(controller.ConfigError, match="application's name"):
            await ctl.deploy("shop", controller.BackendConfig(), controller.ReplicaConfig("m:C"))
        app_named_as_backend = parse_manifest(
            {
                "backends": {"b": {"entrypoint": "app:X"}},
                "applications": {"lonely": {"entry": "b"}},
            },
            "clash.toml",
        )
        with pytest.raises(controller.ConfigError, match="a backend has this name"):
            await ctl.apply_manifest(app_named_as_backend)
        assert "b" not in ctl.backend_names()


@pytest.mark.parametrize(
    ("applications", "problem"),
    [
        ({"shop": {}}, "application 'shop': entry: is required"),
        ({"shop": {"entry": "nope"}}, "entry: must name a backend of this manifest"),
        ({"shop": {"entry": "a", "backends": ["zz"]}}, "'zz' is not a backend of this manifest"),
        ({"shop": {"entry": "a", "backends": "b"}}, "backends: must be a list"),
        ({"shop": {"entry": "a", "backends": ["b", "b"]}}, "names a backend twice"),
        ({"shop": {"entry": "a", "route": "/x"}}, "route: unknown field"),
        ({"a": {"entry": "b"}}, "a backend of this manifest has the name"),
        ({"s1": {"entry": "a"}, "s2": {"entry": "b", "backends": ["a"]}}, "belongs to one"),
        ({"bad name": {"entry": "a"}}, "its name is 1-63 characters"),
        ({"shop": "a"}, "must be a table with 'entry'"),
        ({"shop": {"entry": "a", "canary": {"steps": []}}}, "application 'shop': canary.steps"),
        (["shop"], "applications: must be a table"),
    ],
)
def test_a_wrong_application_names_its_field(applications: object, problem: str) -> None:
    backends = {"a": {"entrypoint": "m:A"}, "b": {"entrypoint": "m:B"}}
    with pytest.raises(ManifestError) as raised:
        parse_manifest({"backends": backends, "applications": applications}, "f.toml")
    assert problem in str(raised.value)


async def test_one_members_canary_aborted_aborts_the_others_and_promote_acts_on_all(
    autojump_clock: trio.testing.MockClock,
) -> None:
    steps = {"steps": [{"weight": 25, "pause_s": 60}], "min_requests": 10}
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        await applied(ctl, shop(canary=steps, own=True))
        result = await ctl.apply_manifest(shop("v2", "v2", canary=steps, own=True))
        await settle()
        assert all(_in_canary(ctl, n) for n in ("front", "ranker"))
        await ctl.abort("ranker", via="cli")
        for name in ("front", "ranker"):
            with contextlib.suppress(controller.GoalFailed):
                await result.goals[name].wait()
            assert result.goals[name].outcome is GoalOutcome.FAILED
        await ctl.wait_until(lambda c: (version(c, "front"), version(c, "ranker")) == ("v1", "v1"))
        # A person's promote reaches every member that is in a canary.
        result = await ctl.apply_manifest(shop("v3", "v3", canary=steps, own=True))
        await settle()
        promoted = await ctl.applications.steer_canary("shop", "promote", "cli")
        assert set(promoted) == {"front", "ranker"}
        for name in ("front", "ranker"):
            await result.goals[name].wait()
        assert (version(ctl, "front"), version(ctl, "ranker")) == ("v3", "v3")
        with pytest.raises(RolloutError, match="no member in a canary release"):
            await ctl.applications.steer_canary("shop", "abort", "cli")


async def test_an_applications_canary_block_starts_every_members_and_one_promotion_ends_all(
    autojump_clock: trio.testing.MockClock,
) -> None:
    steps = {"steps": [{"weight": 25, "pause_s": 60}], "min_requests": 10}
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        await applied(ctl, shop())
        result = await ctl.apply_manifest(shop("v2", "v2", canary=steps))
        assert all(_in_canary(ctl, n) for n in ("front", "ranker"))
        await settle()
        await ctl.promote("front", via="cli")  # one member only: the other follows
        for name in ("front", "ranker"):
            assert await result.goals[name].wait() is GoalOutcome.COMPLETED
        (followed,) = [e.message for e in ctl.status("ranker").events if e.kind == "CanaryPromoted"]
        assert "promoted by its application shop, as the canary of front was promoted" in followed
        # A member's own block wins over the application's.
        own = {"steps": [{"weight": 10, "pause_s": 5}]}
        manifest = parse_manifest(
            {
                "backends": {
                    "front": {"entrypoint": "app:F"},
                    "ranker": {"entrypoint": "app:R", "canary": own},
                },
                "applications": {
                    "shop": {"entry": "front", "backends": ["ranker"], "canary": steps}
                },
            },
            "x.toml",
        ).with_application_canaries()
        canaries = {d.name: d.backend_config.canary for d in manifest.backends}
        assert canaries["front"] == controller.CanaryConfig.from_dict(steps)
        assert canaries["ranker"] == controller.CanaryConfig.from_dict(own)


def _tally(requests: int) -> controller.RequestTally:
    tally = controller.RequestTally()
    for _ in range(requests):
        tally.count(False, 0.01)
    return tally


async def test_members_only_the_entry_calls_follow_its_verdict(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The ingress reports numbers of the entry only (the ranker is reached by handles, which
    report none): the ranker's canary steps at its pauses without waiting for numbers, and is
    promoted when the entry's gates pass its last step."""
    steps = {
        "steps": [{"weight": 25, "pause_s": 60}, {"weight": 50, "pause_s": 60}],
        "min_requests": 10,
    }
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        await applied(ctl, shop())
        result = await ctl.apply_manifest(shop("v2", "v2", canary=steps))
        canary = ctl.status("ranker").backend_config.canary
        assert canary is not None
        assert canary.follows == "front"
        await settle()
        began = trio.current_time()
        for _ in range(2):
            await trio.sleep(61)
            report = controller.LoadReport(
                "test", "front", {}, 0, traffic={"v2": _tally(20), "v1": _tally(60)}
            )
            ctl.report_load(report)
            await settle()
        for name in ("front", "ranker"):
            assert await result.goals[name].wait() is GoalOutcome.COMPLETED
        assert trio.current_time() - began < 200
        passed = [e.message for e in ctl.status("ranker").events if e.kind == "CanaryStepPassed"]
        assert len(passed) == 1  # its first step, with no numbers; the last waited for front


async def test_a_member_whose_entry_is_in_no_canary_is_judged_on_its_own_numbers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    steps = {"steps": [{"weight": 25, "pause_s": 60}], "min_requests": 10}
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        await applied(ctl, shop())
        result = await ctl.apply_manifest(shop("v1", "v2", canary=steps))  # the ranker alone
        with contextlib.suppress(controller.GoalFailed):
            await result.goals["ranker"].wait()
        assert result.goals["ranker"].outcome is GoalOutcome.FAILED
        assert "no verdict within progress_deadline_s" in (result.goals["ranker"].error or "")


async def test_a_canary_may_not_follow_itself_and_a_ring_of_followers_is_judged_on_numbers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    own = {"steps": [{"weight": 50, "pause_s": 60}], "min_requests": 10}
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        with pytest.raises(controller.ConfigError, match="must name another backend"):
            await ctl.deploy("a", controller.BackendConfig(canary={**own, "follows": "a"}), RC)
        goals = {}
        for version in ("v1", "v2"):
            for name, other in (("a", "b"), ("b", "a")):
                block = {**own, "follows": other}
                cfg = controller.BackendConfig(version=version, canary=block)
                goals[name] = await ctl.deploy(name, cfg, RC)
            if version == "v1":
                for goal in goals.values():
                    await goal.wait()
        await settle()
        await trio.sleep(61)
        for name in ("a", "b"):  # each follows the other: neither leads, each on its numbers
            traffic = {"v2": _tally(20), "v1": _tally(20)}
            ctl.report_load(controller.LoadReport("test", name, {}, 0, traffic=traffic))
        for goal in goals.values():
            assert await goal.wait() is GoalOutcome.COMPLETED


async def test_a_plain_undo_goes_back_past_a_restart_and_history_marks_what_is_gone() -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        await applied(ctl, shop())
        await applied(ctl, shop("v2", "v2"))
        for goal in (await ctl.applications.restart("shop")).values():
            await goal.wait()
        # Revision 3 (the restart) runs what 2 ran: a plain undo goes to 1.
        assert ctl.applications.revisions("shop")[-1].restart
        for goal in (await ctl.applications.undo("shop")).values():
            await goal.wait()
        assert ctl.applications.revisions("shop")[-1].undone_to == 1
        assert (version(ctl, "front"), version(ctl, "ranker")) == ("v1", "v1")
        assert all(ctl.applications.restorable(r) for r in ctl.applications.revisions("shop"))


def _in_canary(ctl: controller.Controller, name: str) -> bool:
    rollout = ctl.status(name).rollout
    return rollout is not None and rollout.canary is not None


def _valid(schema: str, body: bytes) -> dict[str, Any]:
    """`body` parsed, after checking it against the OpenAPI document's `schema`."""
    data: dict[str, Any] = json.loads(body)
    document = {"$ref": f"#/components/schemas/{schema}", "components": OPENAPI["components"]}
    errors = [str(e) for e in jsonschema_rs.validator_for(document).iter_errors(data)]
    assert errors == [], errors
    return data


async def test_the_api_shows_an_application_as_a_unit_and_acts_on_it_as_one() -> None:
    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        await applied(ctl, shop())
        await applied(ctl, shop("v2", "v1"))
        app = Api(
            ctl, token="t" * 32, epoch="e", render_metrics=bytes, request_shutdown=lambda: None
        )

        async def send(method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
            status, _, answer = await call(app, method, path, body, token="t" * 32)
            return status, answer

        status, body = await send("GET", "/api/v1/applications")
        listed = _valid("ApplicationList", body)["applications"]
        assert [(a["name"], a["entry"], a["revision"]) for a in listed] == [("shop", "front", 2)]
        status, body = await send("GET", "/api/v1/applications/shop/revisions")
        revisions = _valid("ApplicationRevisions", body)["revisions"]
        assert [(r["number"], r["members"], r["current"]) for r in revisions] == [
            (1, {"front": 1, "ranker": 1}, False),
            (2, {"front": 2, "ranker": 1}, True),
        ]
        status, body = await send("POST", "/api/v1/applications/shop/undo", b'{"to_revision": 1}')
        assert status == 202, body
        assert _valid("Application", body)["revision"] == 3
        await ctl.wait_until(lambda c: version(c, "front") == "v1")
        status, body = await send("POST", "/api/v1/applications/shop/undo", b'{"to_revision": 7}')
        assert (status, json.loads(body)["error"]["type"]) == (404, "UnknownRevision")
        status, body = await send("GET", "/api/v1/applications/nope")
        assert (status, json.loads(body)["error"]["type"]) == (404, "UnknownApplication")
        status, body = await send("POST", "/api/v1/applications/shop/promote")
        assert (status, json.loads(body)["error"]["type"]) == (409, "NoCanary")
        status, body = await send("DELETE", "/api/v1/applications/shop")
        assert status == 202, body
        assert set(_valid("ApplicationDeleted", body)["generations"]) == {"front", "ranker"}
        status, body = await send("GET", "/api/v1/applications/shop")
        assert status == 404
        # The token is needed for every one of them.
        status, _, _ = await call(app, "GET", "/api/v1/applications", token=None)
        assert status == 401


async def test_a_standbys_view_of_the_store_shows_the_applications_as_the_leader_does() -> None:
    store = controller.MemoryStore()
    async with opened(FakeRuntime(auto_ready=True), store) as ctl:
        await applied(ctl, shop())
        await applied(ctl, shop("v2", "v1"))
        view = await store_view(store.data, [])
        assert view.applications.names() == ["shop"]
        assert view.applications.revisions("shop") == ctl.applications.revisions("shop")
        seen, leader = view.applications.status("shop"), ctl.applications.status("shop")
        assert [(m.name, m.revision) for m in seen.members] == [
            (m.name, m.revision) for m in leader.members
        ]


async def test_a_revision_whose_member_revision_was_trimmed_is_not_restorable() -> None:
    def trimmed(version: str) -> controller.Manifest:
        member = {"entrypoint": "app:M", "version": version, "revision_history_limit": 0}
        return parse_manifest(
            {
                "backends": {"front": member, "ranker": member},
                "applications": {"shop": {"entry": "front", "backends": ["ranker"]}},
            },
            "shop.toml",
        )

    async with opened(FakeRuntime(auto_ready=True)) as ctl:
        for version in ("v1", "v2", "v3"):
            await applied(ctl, trimmed(version))
        first, *_, last = ctl.applications.revisions("shop")
        assert not ctl.applications.restorable(first)
        assert ctl.applications.restorable(last)
        with pytest.raises(RolloutError, match="keeps no revision 1"):
            await ctl.applications.undo("shop", to_revision=1)
