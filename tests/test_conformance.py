"""The runtime conformance checks of ``controller.testing``, run against FakeRuntime (under
MockClock; the real runtimes run them in their own test modules)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

import controller
from controller.testing import CONFORMANCE_CHECKS, FakeRuntime, Subject

HONOURS = controller.ReplicaConfig("app:Drains")
IGNORES = controller.ReplicaConfig("app:IgnoresDrain")


async def crash(runtime: controller.Runtime, tag: str) -> None:
    assert isinstance(runtime, FakeRuntime)
    runtime.crash(tag)
    await trio.lowlevel.checkpoint()


@pytest.mark.parametrize("check", CONFORMANCE_CHECKS, ids=lambda c: c.__name__)
async def test_fake_runtime_conforms(
    check: Callable[[Subject], Awaitable[None]], autojump_clock: trio.testing.MockClock
) -> None:
    rt = FakeRuntime(auto_ready=True, hung_drains={IGNORES.entrypoint})
    subject = Subject(
        runtime=lambda: rt,  # one instance: its replicas outlive a controller, as processes do
        store=controller.MemoryStore(),
        replica=HONOURS,
        ignores_drain=IGNORES,
        crash=crash,
    )
    with trio.fail_after(3600):
        await check(subject)
    assert rt.tags() == []
