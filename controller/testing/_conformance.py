"""What every runtime must do for the controller, as checks any runtime can be run through.

Each check is an async function of a ``Subject``: the runtime under test and what the checks
need to drive it. ``LocalRuntime``, ``RayRuntime`` and ``FakeRuntime`` all pass them; a new
runtime gets them for free::

    @pytest.mark.parametrize("check", controller.testing.CONFORMANCE_CHECKS)
    async def test_my_runtime(check):
        await check(Subject(...))

They use the real clock (bound them with ``trio.fail_after`` for real runtimes); they leave no
replica behind when they pass.

``FENCING_CHECKS`` check ``Runtime.fence``: they drive two or three runtimes over the same
replicas at once, so ``Subject.runtime`` must return a new runtime on each call (for a
FakeRuntime, ``rt.view``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar, final

import attrs
import trio

from .._core.open import open_controller
from .._model.config.config import BackendConfig
from .._model.config.replica_config import ReplicaConfig
from .._model.decisions.spec import ReplicaSpec
from .._model.values.errors import FencedError
from .._ports.runtime import Runtime
from .._ports.store import Store
from .._ports.wrap import RuntimeWrapper

T = TypeVar("T")


@attrs.frozen
class Subject:
    """A runtime to check."""

    runtime: Callable[[], Runtime]
    """A runtime over the place replicas live; called again for a second controller, which must
    find the replicas of the first (adoption)."""
    store: Store
    """A store that outlives the controllers of a check."""
    replica: ReplicaConfig
    """A replica class whose drain returns at once."""
    ignores_drain: ReplicaConfig
    """A replica class whose drain never returns."""
    crash: Callable[[Runtime, str], Awaitable[None]]
    """Kill the replica of a tag from outside the controller, as a crash would."""


@final
class _Calls(RuntimeWrapper):
    """Records (op, tag, how) of every replica call: how is "done", "failed" or "cancelled"."""

    def __init__(self, inner: Runtime):
        super().__init__(inner)
        self.calls: list[tuple[str, str | None, str]] = []

    async def around(self, op: str, tag: str | None, work: Callable[[], Awaitable[T]]) -> T:
        how = "failed"
        try:
            result = await work()
            how = "done"
            return result
        except trio.Cancelled:
            how = "cancelled"
            raise
        finally:
            self.calls.append((op, tag, how))

    def ops(self, tag: str) -> list[tuple[str, str]]:
        return [(op, how) for op, t, how in self.calls if t == tag]


def _config(n: int, grace: float = 60.0) -> BackendConfig:
    return BackendConfig(
        num_replicas=n,
        version="v1",
        graceful_shutdown_timeout_s=grace,
        health_check_period_s=0,
    )


async def check_start_and_delete(subject: Subject) -> None:
    """Replicas start, are listed by the runtime under their tags, and are gone once deleted."""
    calls = _Calls(subject.runtime())
    async with open_controller(runtime=calls, store=subject.store) as ctl:
        await (await ctl.deploy("conf-start", _config(2), subject.replica)).wait()
        tags = sorted(r.tag for r in ctl.status("conf-start").replicas)
        assert len(tags) == 2
        assert sorted(await calls.inner.list_replicas()) == tags
        await (await ctl.delete("conf-start")).wait()
        assert await calls.inner.list_replicas() == []


async def check_drain_honoured(subject: Subject) -> None:
    """A stop drains first, and the kill comes once the drain has returned."""
    calls = _Calls(subject.runtime())
    async with open_controller(runtime=calls, store=subject.store) as ctl:
        await (await ctl.deploy("conf-drain", _config(1), subject.replica)).wait()
        (tag,) = [r.tag for r in ctl.status("conf-drain").replicas]
        await (await ctl.delete("conf-drain")).wait()
        assert [op for op, _ in calls.ops(tag)][-2:] == ["drain", "kill"]
        assert ("drain", "done") in calls.ops(tag)


async def check_drain_ignored(subject: Subject) -> None:
    """A drain that does not return is cut at the graceful-shutdown deadline, then killed."""
    calls = _Calls(subject.runtime())
    grace = 1.0
    async with open_controller(runtime=calls, store=subject.store) as ctl:
        await (await ctl.deploy("conf-ignore", _config(1, grace), subject.ignores_drain)).wait()
        (tag,) = [r.tag for r in ctl.status("conf-ignore").replicas]
        t0 = trio.current_time()
        await (await ctl.delete("conf-ignore")).wait()
        assert trio.current_time() - t0 >= grace
        assert calls.ops(tag)[-2:] == [("drain", "cancelled"), ("kill", "done")]
        assert await calls.inner.list_replicas() == []


async def check_death_is_reported(subject: Subject) -> None:
    """A replica killed from outside is reported dead, and replaced."""
    calls = _Calls(subject.runtime())
    async with open_controller(runtime=calls, store=subject.store) as ctl:
        await (await ctl.deploy("conf-death", _config(1), subject.replica)).wait()
        (victim,) = [r.tag for r in ctl.status("conf-death").replicas]
        await subject.crash(calls.inner, victim)
        await ctl.wait_until(
            lambda c: any(
                r.tag != victim and r.state.value == "RUNNING"
                for r in c.status("conf-death").replicas
            )
        )
        # Told in its events (its last error goes once the backend is healthy again).
        (died,) = [e for e in ctl.status("conf-death").events if e.kind == "Died"]
        assert victim in died.message, died
        await (await ctl.delete("conf-death")).wait()


async def check_adoption(subject: Subject) -> None:
    """A second controller over the same place and store adopts the replicas: none restarted."""
    first = _Calls(subject.runtime())
    async with open_controller(runtime=first, store=subject.store) as ctl:
        await (await ctl.deploy("conf-adopt", _config(2), subject.replica)).wait()
        tags = sorted(r.tag for r in ctl.status("conf-adopt").replicas)
    second = _Calls(subject.runtime())
    async with open_controller(runtime=second, store=subject.store) as ctl:
        await ctl.wait_until(
            lambda c: all(r.state.value == "RUNNING" for r in c.status("conf-adopt").replicas)
        )
        assert sorted(r.tag for r in ctl.status("conf-adopt").replicas) == tags
        assert [op for op, _, _ in second.calls if op == "start"] == []
        await (await ctl.delete("conf-adopt")).wait()


async def check_trio_methods(subject: Subject) -> None:
    """A replica's async methods run under trio (``reconfigure``, ``check_health`` and ``drain``
    of ``controller.testing:TrioReplica`` await trio), whatever loop the runtime has."""
    calls = _Calls(subject.runtime())
    config = attrs.evolve(_config(1), user_config={"n": 1})
    replica = ReplicaConfig("controller.testing:TrioReplica")
    async with open_controller(runtime=calls, store=subject.store) as ctl:
        await (await ctl.deploy("conf-trio", config, replica)).wait()
        (tag,) = [r.tag for r in ctl.status("conf-trio").replicas]
        await calls.inner.check_health_replica(tag)
        again = attrs.evolve(config, user_config={"n": 2})
        await (await ctl.deploy("conf-trio", again, replica)).wait()
        assert ctl.status("conf-trio").replicas[0].tag == tag  # reconfigured in place
        await (await ctl.delete("conf-trio")).wait()
        assert ("reconfigure", "done") in calls.ops(tag)
        assert ("drain", "done") in calls.ops(tag)


#: Every check, in the order to run them.
CONFORMANCE_CHECKS: Sequence[Callable[[Subject], Awaitable[None]]] = (
    check_start_and_delete,
    check_drain_honoured,
    check_drain_ignored,
    check_death_is_reported,
    check_adoption,
    check_trio_methods,
)


async def check_fencing(subject: Subject) -> None:
    """A runtime fenced at epoch 2 that adopted a replica outranks one fenced at 1 over the same
    replica, which started it, and one never fenced: their drain, reconfigure and kill are
    refused with ``FencedError`` and change nothing (the replica is still listed and answers
    the new leader); the new leader's reconfigure, drain and kill work."""
    stale, leader, unfenced = subject.runtime(), subject.runtime(), subject.runtime()
    assert len({id(stale), id(leader), id(unfenced)}) == 3, (
        "Subject.runtime must return a new runtime on each call for the fencing checks"
    )
    tag = "conf-fence#0"
    spec = ReplicaSpec(
        tag=tag,
        backend="conf-fence",
        version="v1",
        replica_config=subject.replica,
        user_config=None,
        resources={},
    )
    async with trio.open_nursery() as nursery:
        for runtime in (stale, leader, unfenced):
            await nursery.start(runtime.serve, _no_deaths)
        stale.fence(1)
        await stale.start_replica(spec)
        leader.fence(2)
        assert tag in await leader.list_replicas()
        await leader.adopt_replica(tag)
        for runtime, epoch in ((stale, 1), (unfenced, 0)):
            await _refused(runtime, epoch, tag)
            assert tag in await leader.list_replicas(), f"epoch {epoch}'s refused kill killed it"
        await leader.check_health_replica(tag)
        await leader.reconfigure_replica(tag, {"from": 2})
        await leader.drain_replica(tag)
        await leader.kill_replica(tag)
        assert tag not in await leader.list_replicas()
        nursery.cancel_scope.cancel()


def _no_deaths(tag: str, reason: str) -> None:
    pass


async def _refused(runtime: Runtime, epoch: int, tag: str) -> None:
    """Check that `runtime`, at `epoch`, is refused the drain, reconfigure and kill of `tag`."""
    for what in ("drain", "reconfigure", "kill"):
        refusal: FencedError | None = None
        try:
            if what == "drain":
                await runtime.drain_replica(tag)
            elif what == "reconfigure":
                await runtime.reconfigure_replica(tag, {"from": epoch})
            else:
                await runtime.kill_replica(tag)
        except FencedError as exc:
            refusal = exc
        assert refusal is not None, f"{what} from epoch {epoch}: not refused after epoch 2 adopted"
        assert refusal.epoch == epoch, f"{what} from epoch {epoch}: refused as {refusal.epoch}'s"
        assert refusal.newer in (2, None), f"{what}: refused for epoch {refusal.newer}, not 2"


#: The checks of ``Runtime.fence`` (see the module's docstring).
FENCING_CHECKS: Sequence[Callable[[Subject], Awaitable[None]]] = (check_fencing,)
