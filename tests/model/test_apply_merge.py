"""An apply merges with what the manifest applied last, as ``kubectl apply`` does: re-applying an
unchanged file (or restarting the daemon with the same ``--config``) keeps what ``scale``,
``undo`` or a deploy changed since; a field the file changes wins; a field it drops goes back
to its default. FakeRuntime and MemoryStore under MockClock; the daemon's restart story is in
test_daemon.py."""

from __future__ import annotations

import pytest

import controller
from controller._model.config.last_applied import BackendDiff, merged
from controller._model.config.manifest import parse_manifest
from controller.testing import FakeRuntime

from ..conftest import opened

pytestmark = pytest.mark.usefixtures("autojump_clock")


def manifest(**fields: object) -> controller.Manifest:
    echo = {"entrypoint": "app.replica:Echo", "version": "v1", "num_replicas": 2, **fields}
    return parse_manifest({"backends": {"echo": echo}}, "backends.toml")


async def test_re_applying_the_same_file_keeps_a_scale_and_a_rollout_made_since() -> None:
    store = controller.MemoryStore()
    async with opened(FakeRuntime(auto_ready=True), store) as ctl:
        first = await ctl.apply_manifest(manifest())
        await first.goals["echo"].wait()
        await (await ctl.scale("echo", 4)).wait()
        # A rollout to v1b by another way than the file (a deploy of the API, say).
        now = ctl.status("echo").backend_config
        rc = ctl.status("echo").replica_config
        v1b = controller.BackendConfig(**{**_fields(now), "version": "v1b"})
        await (await ctl.deploy("echo", v1b, rc)).wait()
        generation = ctl.status("echo").generation
        again = await ctl.apply_manifest(manifest())
        assert again.changed == frozenset()  # nothing written
        status = ctl.status("echo")
        assert (status.generation, status.backend_config.num_replicas) == (generation, 4)
        assert status.backend_config.version == "v1b"
    # A restart (a new controller over the same store) applying the same file: the same.
    async with opened(FakeRuntime(auto_ready=True), store) as ctl:
        assert (await ctl.apply_manifest(manifest())).changed == frozenset()
        status = ctl.status("echo")
        assert (status.generation, status.backend_config.num_replicas) == (generation, 4)


async def test_a_field_the_file_changes_wins_and_one_it_drops_goes_back_to_its_default() -> None:
    async with opened(FakeRuntime(auto_ready=True), controller.MemoryStore()) as ctl:
        await (await ctl.apply_manifest(manifest(max_surge=2))).goals["echo"].wait()
        await (await ctl.scale("echo", 4)).wait()
        # The file now says 3 replicas (not what it said), and no longer names max_surge.
        applied = await ctl.apply_manifest(manifest(num_replicas=3))
        await applied.goals["echo"].wait()
        config = ctl.status("echo").backend_config
        assert config.num_replicas == 3
        assert config.max_surge == controller.BackendConfig().max_surge
        # The file changed a field to the value it has live: written (the base of the next
        # merge), and a later scale is kept by the next unchanged apply.
        await (await ctl.scale("echo", 5)).wait()
        assert (await ctl.apply_manifest(manifest(num_replicas=3))).changed == frozenset()
        assert ctl.status("echo").backend_config.num_replicas == 5


async def test_a_backend_never_applied_by_a_manifest_takes_the_file_whole() -> None:
    async with opened(FakeRuntime(auto_ready=True), controller.MemoryStore()) as ctl:
        rc = controller.ReplicaConfig("app.replica:Echo")
        await (await ctl.deploy("echo", controller.BackendConfig(num_replicas=5), rc)).wait()
        await (await ctl.apply_manifest(manifest())).goals["echo"].wait()
        config = ctl.status("echo").backend_config
        assert (config.num_replicas, config.version) == (2, "v1")


async def test_a_dry_run_shows_each_field_and_writes_nothing() -> None:
    store = controller.MemoryStore()
    async with opened(FakeRuntime(auto_ready=True), store) as ctl:
        await (await ctl.apply_manifest(manifest())).goals["echo"].wait()
        one = controller.BackendConfig(num_replicas=1)
        await (await ctl.deploy("other", one, controller.ReplicaConfig("app.replica:Echo"))).wait()
        await (await ctl.scale("echo", 4)).wait()
        before = _specs(await store.read_all())
        changed = manifest(num_replicas=3, user_config={"greeting": "hi"})
        diffs = await ctl.preview_manifest(changed, prune=True)
        assert diffs == [
            BackendDiff(
                "echo",
                "changed",
                {"num_replicas": (4, 3), "user_config": (None, {"greeting": "hi"})},
            ),
            BackendDiff("other", "deleted"),
        ]
        assert await ctl.preview_manifest(manifest()) == [BackendDiff("echo", "unchanged")]
        assert _specs(await store.read_all()) == before


async def test_a_merge_that_breaks_a_rule_between_fields_is_refused_naming_it() -> None:
    store = controller.MemoryStore()
    async with opened(FakeRuntime(auto_ready=True), store) as ctl:
        await (await ctl.apply_manifest(manifest())).goals["echo"].wait()
        # Live, max_surge went to 0 (a deploy); the file now asks max_unavailable = 0 too.
        now = ctl.status("echo")
        surgeless = controller.BackendConfig(**{**_fields(now.backend_config), "max_surge": 0})
        await (await ctl.deploy("echo", surgeless, now.replica_config)).wait()
        before = _specs(await store.read_all())
        with pytest.raises(controller.ConfigError, match=r"backend 'echo': .*may not both be 0"):
            await ctl.apply_manifest(manifest(max_unavailable=0))
        with pytest.raises(controller.ConfigError, match="max_unavailable may not both be 0"):
            await ctl.preview_manifest(manifest(max_unavailable=0))
        assert _specs(await store.read_all()) == before


def test_the_merge_compares_values_as_the_configs_hold_them() -> None:
    # 2 and 2.0 are one count; the file said 2 before and says 2.0 now: not a change.
    decl = manifest(num_replicas=2.0).backends[0]
    live = (controller.BackendConfig(num_replicas=7, version="v1"), decl.replica_config)
    last = '{"entrypoint":"app.replica:Echo","num_replicas":2,"version":"v1"}'
    assert merged(decl, last, live)[0].num_replicas == 7


async def test_one_and_one_point_zero_are_different_values() -> None:
    # Found by a trial: max_surge 1 (one replica) then 1.0 (all of them), and true then 1 in a
    # user config, were taken for the same values: the dry run said unchanged.
    async with opened(FakeRuntime(auto_ready=True), controller.MemoryStore()) as ctl:
        first = manifest(max_surge=1, user_config={"verbose": True})
        await (await ctl.apply_manifest(first)).goals["echo"].wait()
        then = manifest(max_surge=1.0, user_config={"verbose": 1})
        [diff] = await ctl.preview_manifest(then)
        assert diff.fields == {
            "max_surge": (1, 1.0),
            "user_config": ({"verbose": True}, {"verbose": 1}),
        }
        await (await ctl.apply_manifest(then)).goals["echo"].wait()
        config = ctl.status("echo").backend_config
        assert type(config.max_surge) is float
        assert config.user_config == {"verbose": 1}
        assert isinstance(config.user_config, dict)
        assert type(config.user_config["verbose"]) is int


def _specs(stored: dict[str, str]) -> dict[str, str]:
    """The specs and revisions stored (replica records change as the loops work)."""
    return {k: v for k, v in stored.items() if k.startswith(("spec/", "revisions/"))}


def _fields(config: controller.BackendConfig) -> dict[str, object]:
    from controller._model.config.manifest import config_to_dict

    return dict(config_to_dict(config))
