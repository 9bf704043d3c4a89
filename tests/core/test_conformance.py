"""The runtime conformance checks of ``controller.testing``, run against FakeRuntime (under
MockClock; the real runtimes run them in their own test modules)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

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


def test_a_runtimes_optional_parts_are_found_by_their_protocols(tmp_path: Path) -> None:
    from controller._local.runtime import LocalRuntime
    from controller._ports.runtime import batched_checks, log_source, node_runtime
    from controller._ports.wrap import RuntimeWrapper

    local = LocalRuntime(runtime_dir=tmp_path / "rt")
    fake = FakeRuntime(nodes={"a": {}})
    assert node_runtime(local) is local  # one node, which can be cordoned
    assert node_runtime(fake) is fake
    assert batched_checks(local) is local
    assert batched_checks(fake) is fake
    assert log_source(local) is local
    assert log_source(fake) is None
    # A wrapper has a NodeRuntime's methods whatever it wraps; it says whether they lead on.
    assert node_runtime(RuntimeWrapper(object())) is None  # type: ignore[arg-type]
    wrapped = RuntimeWrapper(fake)
    assert node_runtime(wrapped) is wrapped
    assert log_source(RuntimeWrapper(local)) is None
