"""Opening a controller: its lifetime, in nurseries nested like ownership, and the recovery that
comes first; closing it leaves every replica as it is, exactly as a crash would."""

from __future__ import annotations

import random
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import final

import attrs
import trio

from .._backend.observe import NullObserver, Observer
from .._model.decisions.policy import RestartPolicy
from .._model.records.code_report import CodeReport
from .._ports.runtime import Runtime
from .._ports.store import Store
from .._routing.sources import ControllerSource
from .._serving import handles
from .controller import Controller
from .recovery import recover


@asynccontextmanager
async def open_controller(
    *,
    runtime: Runtime,
    store: Store,
    restart_policy: RestartPolicy | None = None,
    seed: int | None = None,
    observer: Observer | None = None,
    code_path: Sequence[str] | None = None,
) -> AsyncIterator[Controller]:
    """Open a controller over `runtime` and `store`; close it on exit.

    `restart_policy` sets the backoff after failures (``RestartPolicy()`` by default). `seed`
    fixes the backoff jitter, for reproducible tests (replica tags stay random: they must be
    unique across controller lifetimes). `observer` is told of the loops' work (for metrics).
    `code_path` is where replicas import their code from (``sys.path`` by default): each
    revision records a digest of its entrypoint's source found there, read without importing.

    Opening recovers: it reads the store, adopts the live replicas its intent names, stops those it
    meant to stop, kills replicas of the runtime that no intent names, and starts what is missing.
    A store it cannot read raises ``CheckpointError`` before anything is touched. A stored spec
    that the runtime cannot hold does not stop the opening: that backend is DEPLOY_FAILED
    (reason ``Infeasible``) and starts nothing until a deploy that fits.

    Closing cancels the controller's tasks and leaves every replica as it is, exactly as a crash
    would: the next controller over the same store picks up where this one stopped. Whoever still
    waits on it (a goal, a watch) gets ``ControllerClosedError``.
    """
    controller = Controller(
        runtime,
        store,
        restart_policy or RestartPolicy(),
        random.Random(seed),
        observer or NullObserver(),
        list(sys.path if code_path is None else code_path),
    )
    try:
        # Lifetimes nest like ownership: the runtime outlives the backends that use it, so the
        # backends' shielded cleanup (a kill begun, a drain) never finds it gone, and a task
        # that had not run yet when the close came cannot mistake a closed runtime for a
        # failed replica and kill it.
        async with trio.open_nursery() as outer:
            await outer.start(runtime.serve, _Listener(controller))
            try:
                async with trio.open_nursery() as inner:
                    controller._opened(inner)
                    # Handles made in this run (``ctl.handle``, replicas FakeRuntime serves
                    # here) follow this controller, unless something said otherwise.
                    source = partial(ControllerSource, controller)
                    handles.configure(source, replace=False, owner=controller)
                    await recover(
                        store,
                        runtime,
                        controller._restored,
                        inner,
                        controller._nodes.restore,
                        controller.applications.restore,
                    )
                    try:
                        yield controller
                    finally:
                        handles.forget(controller)
                        controller._close()
                        inner.cancel_scope.cancel()
            finally:
                outer.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The body's own exception reaches the caller as itself, not wrapped by our nurseries.
        raise _only_error(group) from None


def _only_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception inside nested groups of one, or the group itself."""
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
        inner = inner.exceptions[0]
    return group if isinstance(inner, BaseExceptionGroup) else inner


@final
@attrs.frozen
class _Listener:
    """What the runtime tells the controller of its replicas on its own (``ReplicaListener``):
    deaths, and the load replicas report of themselves."""

    controller: Controller

    def __call__(self, tag: str, reason: str) -> None:
        self.controller._on_death(tag, reason)

    def load(
        self,
        tag: str,
        ongoing: int | None,
        served: int | None = None,
        code: CodeReport | None = None,
    ) -> None:
        self.controller._on_replica_load(tag, ongoing, served, code)

    def nodes_changed(self) -> None:
        self.controller._on_nodes_changed()

    def lost_with_node(self, tag: str, node: str, reason: str) -> None:
        self.controller._on_death(tag, reason, node=node)
