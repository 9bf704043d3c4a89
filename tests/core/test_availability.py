"""Availability and lifecycle at the edges: a restart mid-rollout, the surge bound with replicas
still draining, failures after a version proved it can start, a bad user config, a hung replica,
waiters when the controller closes, a store that fails while a backend is forgotten, races
between deploys, a deploy cancelled half-way. FakeRuntime under MockClock."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import attrs
import pytest
import trio
import trio.testing

import controller
from controller import BackendState, GoalOutcome
from controller._model.values.json_values import JSON
from controller._ports.wrap import RuntimeWrapper, StoreWrapper
from controller.testing import FakeRuntime
from controller.testing import FakeState as S

from ..conftest import RC, config, opened, serving, settle

T = TypeVar("T")


def ready(rt: FakeRuntime) -> int:
    return len(rt.tags(S.READY))


class Floor:
    """Records the fewest READY replicas, and the most replicas alive (starting, ready or
    draining), at every change of a runtime."""

    def __init__(self, rt: FakeRuntime):
        self.rt = rt
        self.fewest_ready = ready(rt)
        self.most_alive = len(rt.tags())

    async def watch(self) -> None:
        def note(rt: FakeRuntime) -> bool:
            self.fewest_ready = min(self.fewest_ready, ready(rt))
            self.most_alive = max(self.most_alive, len(rt.tags()))
            return False

        await self.rt.wait_until(note)


async def test_a_restart_mid_rollout_keeps_every_old_replica_serving(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    store = controller.MemoryStore()
    v1 = config(num_replicas=3, version="v1", max_surge=1, max_unavailable=0)
    v2 = config(num_replicas=3, version="v2", max_surge=1, max_unavailable=0)
    async with opened(rt, store) as ctl:
        await ctl.deploy("a", v1, RC)
        await settle()
        for tag in rt.tags(S.STARTING):
            rt.finish_start(tag)
        await ctl.deploy("a", v2, RC)
        await settle()
        assert len(rt.tags(S.STARTING)) == 1  # the surge replica, still starting
    # Reopened: the three v1 replicas are being adopted, and may be serving routers still.
    async with opened(rt, store) as ctl, trio.open_nursery() as nursery:
        floor = Floor(rt)
        nursery.start_soon(floor.watch)
        await settle()
        assert all(rt.replicas[t].drain_requested_at is None for t in rt.tags(S.READY))
        while rt.tags(S.STARTING):
            rt.finish_start(rt.tags(S.STARTING)[0])
            await settle()
        await (await ctl.deploy("a", v2, RC)).wait()
        assert floor.fewest_ready >= 3  # max_unavailable=0, across the restart too
        nursery.cancel_scope.cancel()


async def test_draining_replicas_count_in_the_surge_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True, auto_drain=False)
    async with opened(rt) as ctl:
        one = config(num_replicas=1, max_surge=0, max_unavailable=1, graceful_shutdown_timeout_s=60)
        await (await ctl.deploy("a", one, RC)).wait()
        await ctl.deploy("a", config(**{**_fields(one), "version": "v2"}), RC)
        await settle()
        (old,) = rt.tags(S.DRAINING)
        # At most num_replicas + max_surge = 1 in all: the new one waits for the old to go.
        assert rt.tags(S.STARTING) == []
        assert rt.tags(S.READY) == []
        rt.finish_drain(old)
        await serving(ctl, "a", 1)

    rt = FakeRuntime(auto_ready=True, auto_drain=False)
    async with opened(rt) as ctl, trio.open_nursery() as nursery:
        ten = config(num_replicas=10, version="v1", max_surge=1, max_unavailable=0)
        await (await ctl.deploy("a", ten, RC)).wait()
        floor = Floor(rt)
        floor.most_alive = 0
        nursery.start_soon(floor.watch)
        goal = await ctl.deploy(
            "a", config(num_replicas=2, version="v2", max_surge=1, max_unavailable=0), RC
        )
        while not goal.done:
            for tag in rt.tags(S.DRAINING):
                rt.finish_drain(tag)
            await settle()
        assert floor.most_alive == 10  # never a start while 10 are still there in all
        nursery.cancel_scope.cancel()


def _fields(cfg: controller.BackendConfig) -> dict[str, object]:
    import attrs

    return attrs.asdict(cfg, recurse=False)


async def test_start_failures_after_the_version_proved_itself_do_not_fail_the_deploy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    async with opened(rt) as ctl:
        goal = await ctl.deploy("a", config(num_replicas=2), RC)
        await settle()
        first, second = rt.tags(S.STARTING)
        rt.finish_start(first)
        rt.fail_start(second, "ValueError", "flaky disk")
        for _ in range(4):  # more failures in a row than max_failed_starts
            await rt.wait_until(lambda r: bool(r.tags(S.STARTING)))
            rt.fail_start(rt.tags(S.STARTING)[0], "ValueError", "flaky disk")
        await settle()
        status = ctl.status("a")
        assert not goal.done
        assert (status.state, status.reason) == (BackendState.UNHEALTHY, "ReplicaFailures")
        assert "flaky disk" in status.message
        await rt.wait_until(lambda r: bool(r.tags(S.STARTING)))
        rt.finish_start(rt.tags(S.STARTING)[0])
        assert await goal.wait() is GoalOutcome.COMPLETED


async def test_a_bad_user_config_halts_and_rolls_back_with_the_backend_serving(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True, auto_reconfigure=False)
    async with opened(rt) as ctl:
        good = config(num_replicas=2, user_config={"n": 1})
        await (await ctl.deploy("a", good, RC)).wait()
        goal = await ctl.deploy("a", config(num_replicas=2, user_config="oops"), RC)
        await settle()
        (first,) = [t for t in rt.tags() if rt.replicas[t].reconfiguring == "oops"]
        rt.fail_reconfigure(first, "TypeError", "config must be a mapping")
        with pytest.raises(controller.GoalFailed, match="config must be a mapping"):
            await goal.wait()
        assert goal.outcome is GoalOutcome.FAILED
        await settle()
        # The failed one is taken back to the config before; the other was never touched.
        assert rt.replicas[first].reconfiguring == {"n": 1}
        rt.finish_reconfigure(first)
        await settle()
        assert {rt.replicas[t].user_config.__repr__() for t in rt.tags()} == {"{'n': 1}"}
        assert len(ctl.snapshot("a").replicas) == 2
        status = ctl.status("a")
        assert (status.state, status.reason) == (BackendState.DEPLOY_FAILED, "ReconfigureFailed")
        # A replica that dies meanwhile is replaced with the config before, not the bad one.
        before = set(rt.tags())
        rt.crash(first)
        await rt.wait_until(lambda r: len(r.tags(S.READY)) == 2)
        (new,) = set(rt.tags(S.READY)) - before
        assert rt.replicas[new].user_config == {"n": 1}


class FailingConfigs(RuntimeWrapper):
    """A runtime whose replicas refuse any user config that has a "raise" key."""

    async def reconfigure_replica(self, tag: str, user_config: JSON) -> None:
        if isinstance(user_config, dict) and "raise" in user_config:
            await trio.lowlevel.checkpoint()
            raise controller.ReplicaError(tag, "ValueError", f"refused {user_config}")
        await self.inner.reconfigure_replica(tag, user_config)


async def test_two_bad_user_configs_in_a_row_go_back_to_the_last_good_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    async with opened(FailingConfigs(rt)) as ctl:
        await (await ctl.deploy("a", config(num_replicas=2, user_config={"a": 1}), RC)).wait()
        tags = set(rt.tags())
        for bad in ({"raise": 1}, {"raise": 2}):
            goal = await ctl.deploy("a", config(num_replicas=2, user_config=bad), RC)
            with pytest.raises(controller.GoalFailed):
                await goal.wait()
            await settle()
            # Taken back to the config that worked, never to the one that failed before.
            assert set(rt.tags(S.READY)) == tags
            assert [rt.replicas[t].user_config for t in tags] == [{"a": 1}, {"a": 1}]
            assert len(ctl.snapshot("a").replicas) == 2
            assert ctl.status("a").state is BackendState.DEPLOY_FAILED
        assert rt.start_calls == 2


async def test_a_failed_rollback_replaces_the_replica_with_the_config_before(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True, auto_reconfigure=False)
    async with opened(rt) as ctl:
        await (await ctl.deploy("a", config(num_replicas=1, user_config=1), RC)).wait()
        (first,) = rt.tags()
        await ctl.deploy("a", config(num_replicas=1, user_config=2), RC)
        await settle()
        rt.fail_reconfigure(first)
        await settle()
        rt.fail_reconfigure(first)  # the rollback fails too
        await rt.wait_until(
            lambda r: r.replicas[first].state is S.DEAD and len(r.tags(S.READY)) == 1
        )
        (new,) = rt.tags(S.READY)
        assert rt.replicas[new].spec.user_config == 1


async def test_removing_the_user_config_calls_no_reconfigure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt) as ctl:
        await (await ctl.deploy("a", config(num_replicas=1, user_config={"k": 1}), RC)).wait()
        (tag,) = rt.tags()
        await (await ctl.deploy("a", config(num_replicas=2, user_config=None), RC)).wait()
        assert rt.replicas[tag].reconfigure_calls == 0  # not handed None
        assert len(rt.tags()) == 2  # kept, not restarted
        assert all(r.spec.user_config is None for r in rt.replicas.values() if r.tag != tag)


async def test_a_hung_replica_leaves_the_snapshot_within_a_period_and_is_replaced(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    cfg = config(num_replicas=2, health_check_period_s=10, health_check_timeout_s=30)
    async with opened(rt) as ctl:
        await (await ctl.deploy("a", cfg, RC)).wait()
        t0 = trio.current_time()
        hung, _ = rt.tags()
        rt.replicas[hung].health_hangs = True
        await trio.sleep(20.5)  # its check at +10 hangs; at +20 it is late
        assert hung not in {r.tag for r in ctl.snapshot("a").replicas}
        assert ctl.status("a").state is BackendState.UNHEALTHY
        # Never two checks at once; replaced at the third failure: late at +20 and +30, then
        # the check itself times out at +40.
        await rt.wait_until(lambda r: r.replicas[hung].state is not S.READY)
        assert trio.current_time() == t0 + 40
        assert rt.replicas[hung].health_checks == [t0 + 10]
        await serving(ctl, "a", 2)


class _SlowChecks(RuntimeWrapper):
    """Every check answers, and passes, `seconds` after it is asked."""

    def __init__(self, inner: FakeRuntime, seconds: float):
        super().__init__(inner)
        self.seconds = seconds

    async def check_health_replica(self, tag: str) -> None:
        await trio.sleep(self.seconds)
        await self.inner.check_health_replica(tag)


async def test_a_check_always_slower_than_the_period_fails_until_the_replica_is_replaced(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Found by a trial: each slow check was counted late (failed), then its pass reset the count,
    # so the replica went in and out of the snapshot for ever and was never replaced.
    rt = FakeRuntime(auto_ready=True)
    cfg = config(num_replicas=1, health_check_period_s=10, health_check_timeout_s=30)
    async with opened(_SlowChecks(rt, 12)) as ctl:
        await (await ctl.deploy("a", cfg, RC)).wait()
        t0 = trio.current_time()
        (slow,) = rt.tags()
        with trio.fail_after(200):
            await rt.wait_until(lambda r: r.replicas[slow].state is not S.READY)
        # Checks at +10, +30 and +50 (one at a time), each late at +20, +40 and +60: the third
        # late check is the third failure in a row.
        assert trio.current_time() == t0 + 60
        # (The runtime hears each 12 s after it is asked; the third had not reached it yet.)
        assert rt.replicas[slow].health_checks == [t0 + 22, t0 + 42]
        await serving(ctl, "a", 1)


async def test_checks_turned_off_bring_back_a_replica_they_had_taken_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Found by a trial: with checks off, nothing would ever bring it back into the snapshot.
    rt = FakeRuntime(auto_ready=True)
    checked = config(num_replicas=2, health_check_period_s=10, health_check_failure_threshold=99)
    async with opened(rt) as ctl:
        await (await ctl.deploy("a", checked, RC)).wait()
        failing, _ = rt.tags()
        rt.replicas[failing].health_error = ("RuntimeError", "sick")
        await trio.sleep(10.5)
        assert failing not in {r.tag for r in ctl.snapshot("a").replicas}
        unchecked = config(
            num_replicas=2, health_check_period_s=0, health_check_failure_threshold=99
        )
        await (await ctl.deploy("a", unchecked, RC)).wait()
        await serving(ctl, "a", 2)
        assert failing in {r.tag for r in ctl.snapshot("a").replicas}
        assert ctl.status("a").state is BackendState.HEALTHY


async def test_waiters_get_controller_closed_error_when_it_closes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()  # starts hang: the goal never completes
    outcomes: dict[str, str] = {}

    async def outcome(name: str, wait: object) -> None:
        try:
            await wait  # type: ignore[misc]
        except controller.ControllerClosedError:
            outcomes[name] = "closed"

    async with trio.open_nursery() as waiters, opened(rt) as ctl:
        goal = await ctl.deploy("a", config(num_replicas=1), RC)
        waiters.start_soon(outcome, "goal", goal.wait())
        waiters.start_soon(outcome, "changes_since", ctl.changes_since(10**9))
        waiters.start_soon(outcome, "listen", ctl.listen_for_change({"a": 10**9}))

        async def watch() -> None:
            async for _ in ctl.watch("zzz"):
                pass

        waiters.start_soon(outcome, "watch", watch())
        await settle()
    assert outcomes == dict.fromkeys(["goal", "changes_since", "listen", "watch"], "closed")
    with pytest.raises(controller.ControllerClosedError):
        await goal.wait()


class FailOnce:
    """A MemoryStore whose first write matching `keys` fails, as a disk error would."""

    def __init__(self, keys: set[str]) -> None:
        self.inner = controller.MemoryStore()
        self.keys = keys
        self.failed = 0

    async def read_all(self) -> dict[str, str]:
        return await self.inner.read_all()

    async def write(self, changes: Mapping[str, str | None]) -> None:
        if not self.failed and self.keys <= set(changes):
            self.failed += 1
            raise controller.StoreError("writing: disk I/O error")
        await self.inner.write(changes)


async def test_a_store_failing_while_a_backend_is_forgotten_is_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = FailOnce({"spec/a", "replicas/a"})
    async with opened(FakeRuntime(auto_ready=True), store) as ctl:
        await (await ctl.deploy("a", config(num_replicas=1), RC)).wait()
        await (await ctl.delete("a")).wait()
        assert store.failed == 1
        assert ctl.status().backends == ()
        assert "spec/a" not in store.inner.data
        await (await ctl.deploy("b", config(num_replicas=1), RC)).wait()  # still alive


async def test_two_deploys_at_once_do_not_overcommit_capacity() -> None:
    rt = FakeRuntime(auto_ready=True, capacity={"CPU": 2})
    async with opened(rt) as ctl:
        outcomes: list[str] = []

        async def deploy(name: str) -> None:
            try:
                await ctl.deploy(name, config(num_replicas=2, resources={"CPU": 1}), RC)
                outcomes.append("deployed")
            except controller.InfeasibleError:
                outcomes.append("refused")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(deploy, "a")
            nursery.start_soon(deploy, "b")
        assert sorted(outcomes) == ["deployed", "refused"]


class Gate:
    """A MemoryStore whose writes wait for `open` once it is armed."""

    def __init__(self) -> None:
        self.inner = controller.MemoryStore()
        self.open: trio.Event | None = None
        self.waiting = trio.Event()

    async def read_all(self) -> dict[str, str]:
        return await self.inner.read_all()

    async def write(self, changes: Mapping[str, str | None]) -> None:
        if self.open is not None:
            self.waiting.set()
            await self.open.wait()
        await self.inner.write(changes)


async def test_a_deploy_cancelled_after_its_write_began_is_applied_all_the_same(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = Gate()
    rt = FakeRuntime(auto_ready=True)
    async with opened(rt, store) as ctl:
        store.open = trio.Event()
        with trio.CancelScope() as scope:

            async def cancel_when_written() -> None:
                await store.waiting.wait()
                scope.cancel()  # e.g. hypercorn cancelling the request at shutdown
                assert store.open is not None
                store.open.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_when_written)
                await ctl.deploy("a", config(num_replicas=1), RC)
        store.open = None
        # Durable, and applied: no phantom spec that only the next start would see.
        assert "spec/a" in store.inner.data
        await ctl.wait_until(lambda c: len(c.snapshot("a").replicas) == 1)
        assert ctl.status("a").generation == 1


class Held:
    """A MemoryStore whose writes that touch `key`, once `armed`, wait until `release`."""

    def __init__(self, key: str) -> None:
        self.inner = controller.MemoryStore()
        self.key = key
        self.armed = False
        self.held = trio.Event()
        self.release = trio.Event()

    async def read_all(self) -> dict[str, str]:
        return await self.inner.read_all()

    async def write(self, changes: Mapping[str, str | None]) -> None:
        if self.armed and self.key in changes and not self.release.is_set():
            self.held.set()
            await self.release.wait()
        await self.inner.write(changes)


async def test_a_prune_racing_a_delete_neither_fails_nor_loses_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from controller._api.app import Api

    from ..asgi import call

    TOKEN = "s3cret"  # any: the app is called in process, with it

    store = Held("spec/x1")
    async with opened(FakeRuntime(auto_ready=True), store) as ctl:
        for name in ("x1", "x2"):
            await (await ctl.deploy(name, config(num_replicas=1), RC)).wait()
        app = Api(
            ctl, token=TOKEN, epoch="e", render_metrics=lambda: b"", request_shutdown=lambda: None
        )
        replies: dict[str, int] = {}
        store.armed = True

        async def prune() -> None:
            body = b'{"backends": {}, "prune": true}'
            replies["apply"] = (await call(app, "POST", "/api/v1/apply", body, token=TOKEN))[0]

        async def delete() -> None:
            path = "/api/v1/backends/x2"
            query = b"force=true"
            replies["delete"] = (await call(app, "DELETE", path, query=query, token=TOKEN))[0]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(prune)
            await store.held.wait()  # the prune is writing; x2 is deleted meanwhile
            nursery.start_soon(delete)
            await settle()
            store.release.set()
        assert replies == {"apply": 200, "delete": 202}
        await ctl.wait_until(lambda c: c.status().backends == ())


async def test_name_churn_leaves_nothing_behind(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import controller._backend.watch
    from controller._api.metrics import Metrics

    monkeypatch.setattr(controller._backend.watch, "TOMBSTONES_KEPT", 20)
    metrics = Metrics()
    rt = FakeRuntime(auto_ready=True)
    async with controller.open_controller(
        runtime=rt, store=controller.MemoryStore(), observer=metrics
    ) as ctl:
        await (await ctl.deploy("first", config(num_replicas=1), RC)).wait()
        first = ctl.snapshot("first")
        for i in range(300):
            name = f"churn{i}"
            await (await ctl.deploy(name, config(num_replicas=1), RC)).wait()
            rt.crash(rt.tags(backend=name)[0])  # a failure: a metric series per backend
            await serving(ctl, name, 1)
            await (await ctl.delete(name)).wait()
        await (await ctl.delete("first")).wait()
        hub = ctl._hub
        assert len(hub._latest) <= 20  # tombstones bounded
        assert hub.floor > first.snapshot_id
        assert ctl._desk.locked_names == 0  # no lock per name left
        assert "churn" not in metrics.render().decode()  # no series per deleted backend
        # A watcher that held "first" from before learns it is gone, though its tombstone
        # was dropped.
        gone = (await ctl.listen_for_change({"first": first.snapshot_id}))["first"]
        assert not gone.exists


async def test_a_runtime_bug_in_a_health_check_is_logged_with_its_traceback(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    class Buggy(RuntimeWrapper):
        async def check_health_replica(self, tag: str) -> None:
            raise KeyError("a bug in the runtime, not in the replica")

    rt = Buggy(FakeRuntime(auto_ready=True))
    async with opened(rt) as ctl:
        await (await ctl.deploy("a", config(health_check_period_s=10), RC)).wait()
        await trio.sleep(10.5)
        records = [r for r in caplog.records if "runtime error checking" in r.getMessage()]
        assert records
        assert records[0].exc_info is not None  # the traceback, where the bug is


async def test_a_cancelled_start_is_not_counted_as_a_failed_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from controller._api.metrics import Metrics

    metrics = Metrics()
    rt = FakeRuntime()  # starts hang until the test says
    async with controller.open_controller(
        runtime=metrics.wrap_runtime(rt), store=controller.MemoryStore(), observer=metrics
    ) as ctl:
        await ctl.deploy("a", config(num_replicas=1), RC)
        await settle()
        await (await ctl.delete("a")).wait()  # cancels the start in flight
    text = metrics.render().decode()
    assert 'controller_replica_start_seconds_count{outcome="cancelled"} 1.0' in text
    assert 'outcome="failed"' not in text


class NotRetryable:
    """A store whose writes fail with an error that no retry can cure."""

    def __init__(self) -> None:
        self.inner = controller.MemoryStore()
        self.fail = False

    async def read_all(self) -> dict[str, str]:
        return await self.inner.read_all()

    async def write(self, changes: Mapping[str, str | None]) -> None:
        if self.fail and "replicas/a" in changes:
            raise controller.CheckpointError("the schema moved under us")
        await self.inner.write(changes)


async def test_only_retryable_store_errors_are_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A checkpoint write that fails with an error no retry can cure is not retried for ever: it
    # ends the controller, as a bug would, and says what it was.
    assert not controller.CheckpointError.retryable
    assert controller.StoreError.retryable
    store = NotRetryable()

    async def scale_up() -> None:
        async with opened(FakeRuntime(auto_ready=True), store) as ctl:
            await (await ctl.deploy("a", config(num_replicas=1), RC)).wait()
            store.fail = True
            await ctl.deploy("a", config(num_replicas=2), RC)
            await trio.sleep_forever()  # until the writer's failure ends the controller

    with pytest.raises(controller.CheckpointError, match="schema moved"):
        await scale_up()


# -- found by trying it from outside: restarts that forgot what the last controller knew --


def listed(ctl: controller.Controller, name: str) -> set[str]:
    return {r.tag for r in ctl.snapshot(name).replicas}


async def test_a_restarted_controller_lists_the_replicas_that_served_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    store = controller.MemoryStore()
    async with opened(rt, store) as ctl:
        await (await ctl.deploy("a", config(num_replicas=3, health_check_period_s=10), RC)).wait()
        before = ctl.snapshot("a").replicas
    hung = sorted(rt.tags())[0]
    rt.replicas[hung].adoption_hangs = True  # stopped while no controller ran
    async with opened(rt, store) as ctl:
        # Before any adoption has answered, routers are told of every replica that served, at
        # its address: a restart never leaves a serving backend with nobody to route to.
        assert sorted(ctl.snapshot("a").replicas, key=str) == sorted(before, key=str)
        await settle()
        assert len(listed(ctl, "a")) == 3  # the silent one too, for now
        await trio.sleep(10)  # a health-check period without an answer: out, like a late check
        await settle()
        assert listed(ctl, "a") == set(rt.tags()) - {hung}
        assert hung in {r.tag for r in ctl.status("a").replicas}  # until start_timeout_s
        await ctl.wait_until(lambda c: hung not in {r.tag for r in c.status("a").replicas})
        await ctl.wait_until(lambda c: len(listed(c, "a")) == 3)


def failing_version(version: str, error: str, message: str) -> Callable[[FakeRuntime], bool]:
    """For ``rt.wait_until`` in a background task: every start of `version` fails with `error`,
    every other start succeeds, as they come (it never returns)."""

    def answer(r: FakeRuntime) -> bool:
        for tag in r.tags(S.STARTING):
            if r.replicas[tag].spec.version == version:
                r.fail_start(tag, error, message)
            else:
                r.finish_start(tag)
        return False

    return answer


async def test_a_failed_deploy_stays_failed_across_a_restart(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    store = controller.MemoryStore()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rt.wait_until, failing_version("v2", "ValueError", "bad port"))
        async with opened(rt, store) as ctl:
            await (await ctl.deploy("a", config(num_replicas=2, user_config={"n": 1}), RC)).wait()
            await (await ctl.deploy("b", config(num_replicas=1, version="v1"), RC)).wait()
            for replica in rt.replicas.values():
                replica.reconfigure_error = ("ValueError", "bad config")
            bad_config = await ctl.deploy("a", config(num_replicas=2, user_config={"n": 2}), RC)
            bad_version = await ctl.deploy("b", config(num_replicas=1, version="v2"), RC)
            for goal in (bad_config, bad_version):
                with pytest.raises(controller.GoalFailed):
                    await goal.wait()
            await settle()
            reconfigures = sum(r.reconfigure_calls for r in rt.replicas.values())
            starts = rt.start_calls
        async with opened(rt, store) as ctl:
            await trio.sleep(300)  # long past every backoff
            # Neither is tried again: no replica is handed the bad config, none of v2 starts.
            assert sum(r.reconfigure_calls for r in rt.replicas.values()) == reconfigures
            assert rt.start_calls == starts
            for name, reason in (("a", "ReconfigureFailed"), ("b", "StartFailures")):
                status = ctl.status(name)
                assert (status.state, status.reason) == (BackendState.DEPLOY_FAILED, reason)
            assert "bad config" in (ctl.status("a").last_error or "")
            assert ctl.status("b").message.count("until the next deploy") == 1
            assert (len(listed(ctl, "a")), len(listed(ctl, "b"))) == (2, 1)
            # The next deploy tries again.
            goal = await ctl.deploy("b", config(num_replicas=1, version="v3"), RC)
            await goal.wait()
        nursery.cancel_scope.cancel()


class SlowEvents(StoreWrapper):
    """A store whose writes of events take a second: one is still in flight when the backend's
    loop forgets it (as with a real store, whose writes from two tasks may land in any order)."""

    async def around(self, op: str, keys: Sequence[str], work: Callable[[], Awaitable[T]]) -> T:
        if any(key.startswith("events/") for key in keys):
            await trio.sleep(1)
        return await work()


async def test_a_deleted_backend_leaves_no_key_in_the_store(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    store = controller.MemoryStore()
    async with opened(rt, SlowEvents(store)) as ctl:
        for n in (0, 1):
            await (await ctl.deploy(f"n{n}", config(num_replicas=n), RC)).wait()
            await (await ctl.delete(f"n{n}")).wait()
            await trio.sleep(5)
            assert await store.read_all() == {}
        await ctl.deploy("n2", config(num_replicas=0), RC)
        await (await ctl.delete("n2")).wait()
    # Closed at once after the delete: the closing flush must not write its events back.
    assert await store.read_all() == {}


async def test_a_restart_counts_a_failed_backend_at_what_it_holds_not_what_it_wants(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Found by an attack: after a restart, backends that had failed to start were counted at
    # their desired size, so a healthy backend missing one replica was refused room.
    rt = FakeRuntime(max_replicas=4)
    store = controller.MemoryStore()
    no_module = failing_version("bad", "ModuleNotFoundError", "No module named 'nope'")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rt.wait_until, no_module)
        async with opened(rt, store) as ctl:
            await (await ctl.deploy("echo", config(num_replicas=2), RC)).wait()
            await (await ctl.deploy("greeter", config(num_replicas=1), RC)).wait()
            for name in ("bad1", "bad2", "bad3"):
                with pytest.raises(controller.GoalFailed):
                    await (await ctl.deploy(name, config(version="bad"), RC)).wait()
                await settle()  # its failed replica's leftovers are cleared: it holds none
        (greeter,) = rt.tags(backend="greeter")
        rt.crash(greeter)  # while no controller runs
        async with opened(rt, store) as ctl:
            await ctl.wait_until(lambda c: c.status("greeter").goal_done)
            assert len(rt.tags(S.READY, backend="greeter")) == 1
            for name in ("bad1", "bad2", "bad3"):
                status = ctl.status(name)
                assert (status.state, status.reason) == (
                    BackendState.DEPLOY_FAILED,
                    "StartFailures",
                )
        nursery.cancel_scope.cancel()


class RefusedVersion(FailingConfigs):
    """As `FailingConfigs`, and no replica of version v2 starts."""

    async def start_replica(
        self, spec: controller.ReplicaSpec
    ) -> controller.ReplicaInfo | str | None:
        if spec.version.startswith("v2"):
            await trio.lowlevel.checkpoint()
            raise controller.ReplicaError(spec.tag, "ImportError", "no module named v2")
        return await self.inner.start_replica(spec)


async def test_a_bad_user_config_after_a_version_failed_to_start_halts_with_the_backend_serving(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Found by trying it: v2 failed to start (halted, v1 serving); a deploy of v1 again with a
    config its replicas refuse was not taken for an in-place change (the spec before it was
    v2's), so each refusal killed a v1 replica, and its replacement failed to start with that
    config: no replica served."""
    rt = FakeRuntime(auto_ready=True)
    async with opened(RefusedVersion(rt)) as ctl:
        v1 = config(num_replicas=2, user_config={"a": 1})
        await (await ctl.deploy("a", v1, RC)).wait()
        tags = set(rt.tags())
        failed = await ctl.deploy("a", config(num_replicas=2, version="v2"), RC)
        with pytest.raises(controller.GoalFailed, match="consecutive replica starts failed"):
            await failed.wait()
        assert ctl.status("a").reason == "StartFailures"
        goal = await ctl.deploy("a", config(num_replicas=2, user_config={"raise": 1}), RC)
        with pytest.raises(controller.GoalFailed, match="the new user config failed"):
            await goal.wait()
        await settle()
        assert set(rt.tags(S.READY)) == tags  # none killed
        assert [rt.replicas[t].user_config for t in tags] == [{"a": 1}, {"a": 1}]
        assert len(ctl.snapshot("a").replicas) == 2
        status = ctl.status("a")
        assert (status.state, status.reason) == (BackendState.DEPLOY_FAILED, "ReconfigureFailed")


async def test_a_hung_reconfigure_is_cut_at_start_timeout_and_says_which(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True, auto_reconfigure=False)
    async with opened(rt) as ctl:
        good = config(num_replicas=1, user_config={"n": 1}, start_timeout_s=3)
        await (await ctl.deploy("a", good, RC)).wait()
        goal = await ctl.deploy("a", attrs.evolve(good, user_config={"n": 2}), RC)
        with pytest.raises(
            controller.GoalFailed, match=r"ReconfigureTimeout: no answer within start_timeout_s=3"
        ):
            await goal.wait()
        assert ctl.status("a").reason == "ReconfigureFailed"
