"""Crash at every step: for each scenario and every step k of it, crash the controller at k
(before the step's work, and again just after it), reopen a controller over the same store and
runtime, and check that it converges with nothing lost, duplicated or orphaned.

Under MockClock with FakeRuntime (instant starts and drains) and MemoryStore, so that the whole
sweep runs in seconds. ``nox -s reliability`` prints the counts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest
import trio
import trio.testing

import controller
from controller._backend import pages
from controller._backend.pages import PAGE_SIZE
from controller._model.config.manifest import parse_manifest
from controller._model.records.checkpoint import parse_all
from controller.testing import ControllerCrash, FakeRuntime, FakeState, FaultInjector

from ..conftest import FIGURES, RC, config, opened

Op = Callable[[controller.Controller], Awaitable[None]]


def deploy(n: int, version: str = "v1", user_config: object = None) -> Op:
    async def op(ctl: controller.Controller) -> None:
        cfg = config(num_replicas=n, version=version, user_config=user_config)
        await (await ctl.deploy("a", cfg, RC)).wait()

    op.__name__ = f"deploy({n}, {version}, {user_config})"
    return op


def undo(to_revision: int) -> Op:
    async def op(ctl: controller.Controller) -> None:
        # Named, so that the retry after a crash is the same undo (a plain one done twice
        # would go back and forth).
        await (await ctl.undo("a", to_revision=to_revision)).wait()

    op.__name__ = f"undo(to_revision={to_revision})"
    return op


def failed_release(n: int, version: str) -> Op:
    """A release whose replicas cannot start, with on_failure = "rollback": its goal fails,
    and the backend goes back to what ran before by itself."""

    async def op(ctl: controller.Controller) -> None:
        cfg = config(num_replicas=n, version=version, on_failure="rollback")
        with contextlib.suppress(controller.GoalFailed):
            await (await ctl.deploy("a", cfg, RC)).wait()

        def rolled_back(c: controller.Controller) -> bool:
            status = c.status("a")
            rollout = status.rollout
            return (
                status.state is controller.BackendState.HEALTHY
                and rollout is not None
                and rollout.automatic
            )

        await ctl.wait_until(rolled_back)

    op.__name__ = f"failed_release({n}, {version})"
    return op


async def delete(ctl: controller.Controller) -> None:
    try:
        goal = await ctl.delete("a")
    except controller.UnknownBackendError:
        return  # deleted already: the crash came after the delete was done
    await goal.wait()


def application(version: str) -> Op:
    """Backends a and b applied as application ab, both at `version`."""

    async def op(ctl: controller.Controller) -> None:
        member = {"entrypoint": "app.replica:Echo", "num_replicas": 3, "version": version}
        manifest = parse_manifest(
            {
                "backends": {"a": member, "b": member},
                "applications": {"ab": {"entry": "a", "backends": ["b"]}},
            },
            "ab.toml",
        )
        for goal in (await ctl.apply_manifest(manifest)).goals.values():
            await goal.wait()

    op.__name__ = f"application({version})"
    return op


def undo_application(to_revision: int) -> Op:
    async def op(ctl: controller.Controller) -> None:
        for goal in (await ctl.applications.undo("ab", to_revision=to_revision)).values():
            await goal.wait()
        # One batch: whatever the crash, the application's latest revision names what every
        # member asks for, and the undo was recorded once.
        latest = ctl.applications.revisions("ab")[-1]
        assert latest.number == 3
        for name, number in latest.members.items():
            rollout = ctl.status(name).rollout
            assert rollout is not None
            assert rollout.revision == number
            assert ctl.status(name).backend_config.version == "v1"

    op.__name__ = f"undo_application(to_revision={to_revision})"
    return op


@dataclass
class Scenario:
    name: str
    setup: list[Op]  # done first, by a controller that does not crash
    steps: list[Op]  # done by the controller that crashes at step k
    floor: int = 0  # the fewest replicas that must serve throughout the recovery


SCENARIOS = [
    Scenario("deploy 0 -> 5", [], [deploy(5)]),
    Scenario("scale 5 -> 10 -> 2", [deploy(5)], [deploy(10), deploy(2)]),
    # num_replicas - max_unavailable (0.25 of 10, rounded down) must serve throughout.
    Scenario("rolling update of 10", [deploy(10, "v1")], [deploy(10, "v2")], floor=8),
    Scenario("reconfigure 10", [deploy(10, user_config=1)], [deploy(10, user_config=2)]),
    Scenario("delete 5", [deploy(5)], [delete]),
    # Back to revision 1 from 2: v1's replicas are started anew, v2's drained, as any update.
    Scenario("undo of 10", [deploy(10, "v1"), deploy(10, "v2")], [undo(1)], floor=8),
    # v2 never starts: nothing of v1 is stopped, before, during or after the rollback.
    # Both members of an application back to revision 1 in one batch.
    Scenario(
        "undo of an application of 2 x 3",
        [application("v1"), application("v2")],
        [undo_application(1)],
    ),
    Scenario(
        "automatic rollback of 10",
        [deploy(10, "v1")],
        [failed_release(10, "bad")],
        floor=10,
    ),
]


async def run_scenario(
    scenario: Scenario, crash_at: int | None, after: bool
) -> tuple[FaultInjector, FakeRuntime, controller.MemoryStore]:
    rt = FakeRuntime(auto_ready=True, failing_starts={"bad"})
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        for op in scenario.setup:
            await op(ctl)
    faults = FaultInjector(crash_at, after=after)
    try:
        async with opened(faults.runtime(rt), faults.store(store)) as ctl:
            for op in scenario.steps:
                await op(ctl)
    except* ControllerCrash:
        pass
    return faults, rt, store


async def recover_and_check(scenario: Scenario, rt: FakeRuntime, store: controller.Store) -> None:
    """A new controller over what the crash left: the user retries the last step; it must
    converge with the runtime's live replicas exactly those the status shows, and keep the
    scenario's floor of serving replicas all along."""
    fewest = len(rt.tags(FakeState.READY))

    def note(r: FakeRuntime) -> bool:
        nonlocal fewest
        fewest = min(fewest, len(r.tags(FakeState.READY)))
        return False

    async with opened(rt, store) as ctl, trio.open_nursery() as watching:
        watching.start_soon(rt.wait_until, note)
        await scenario.steps[-1](ctl)
        watching.cancel_scope.cancel()
        assert fewest >= scenario.floor, f"only {fewest} replicas served during the recovery"
        status = ctl.status()
        shown = [r.tag for b in status.backends for r in b.replicas]
        assert len(shown) == len(set(shown)), "a tag shows twice"
        live = set(rt.tags(FakeState.READY))
        leftover = set(rt.tags(FakeState.STARTING)) | set(rt.tags(FakeState.DRAINING))
        assert leftover == set(), "a replica is stuck half-started or half-stopped"
        assert set(shown) == live, "the runtime's live set differs from the status"
        for backend in status.backends:
            want = backend.backend_config.num_replicas
            assert backend.goal_done
            assert backend.counts == {controller.ReplicaState.RUNNING: want}
    starts = [tag for _, tag, what in rt.history if what == "start"]
    assert len(starts) == len(set(starts)), "a replica was started twice for one intent"
    # The store holds what runs: the record and exactly the pages it lists.
    kept = parse_all(await store.read_all())  # refuses a page no record lists
    stored = [r.tag for record in kept.replicas.values() for r in record.replicas]
    assert sorted(stored) == sorted(rt.tags(FakeState.READY))


TRIED: dict[str, int] = {}


@pytest.mark.parametrize("page_size", [PAGE_SIZE, 2], ids=["one record", "pages of 2"])
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
async def test_crash_at_every_step(
    scenario: Scenario,
    page_size: int,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With pages of 2, the replicas of every scenario span pages: each write holds some.
    monkeypatch.setattr(pages, "PAGE_SIZE", page_size)
    clean, _, _ = await run_scenario(scenario, None, after=False)
    total = clean.steps
    assert total > 0
    tried = 0
    for after in (False, True):
        for k in range(1, total + 1):
            faults, rt, store = await run_scenario(scenario, k, after)
            try:
                await recover_and_check(scenario, rt, store)
            except AssertionError as exc:
                where = "after" if after else "before"
                raise AssertionError(
                    f"{scenario.name}: crash {where} step {k} ({faults.log[-1]}): {exc}"
                ) from exc
            # A step still in flight when the scenario ended (a drain the close cancelled) never
            # finishes, so a crash "after" it never happens: such points are not counted.
            tried += faults.crashed
    if page_size != PAGE_SIZE:
        FIGURES[f"crash points, {scenario.name}, pages of 2"] = f"{tried} tried, all held"
        return
    TRIED[scenario.name] = tried
    FIGURES[f"crash points, {scenario.name}"] = f"{total} steps, {tried} tried, all held"


def test_at_least_200_crash_points_in_all() -> None:
    # Runs after the sweeps above (pytest keeps file order).
    if len(TRIED) < len(SCENARIOS):
        pytest.skip("run with the whole file")
    total = sum(TRIED.values())
    FIGURES["crash points in all"] = f"{total} tried, {total} held"
    assert total >= 200
