"""A standby's view: the backends as the store holds them, in a controller that never runs.

It answers status, revisions and watch exactly as a leader's controller does (the same code
builds them), from what the leader last wrote: its replicas as the intent names them, those
that served still serving. It checks nothing and acts on nothing: a standby only reads.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import NoReturn, final

import trio

from .._backend.observe import NullObserver
from .._backend.turns import in_turns, take_turns
from .._core.controller import Controller
from .._model.decisions.policy import RestartPolicy
from .._model.decisions.spec import ReplicaSpec, Spec
from .._model.records.checkpoint import parse_in_steps
from .._model.values.json_values import JSON
from .._ports.runtime import DeathListener, ReplicaInfo


async def store_view(data: Mapping[str, str], code_path: Sequence[str]) -> Controller:
    """A controller holding what `data` (a store's keys) says; ``CheckpointError`` if it cannot
    be read.

    Built in turns with the rest of the daemon's loop: a store of 16,000 backends took 6 s to
    parse and restore, in one step that held the standby's API (and every task of its loop)
    that long."""
    checkpoint = await in_turns(parse_in_steps(dict(data)))
    ctl = Controller(
        _Inert(), _Inert(), RestartPolicy(), random.Random(0), NullObserver(), list(code_path)
    )
    for done, (name, record) in enumerate(sorted(checkpoint.specs.items()), 1):
        await take_turns(done)
        backend = ctl._restored(name, Spec.from_record(record), checkpoint.revisions.get(name))
        replicas = checkpoint.replicas.get(name)
        # Taken as alive as the leader last knew them: a standby does not look.
        named = {r.tag for r in replicas.replicas} if replicas is not None else set()
        backend.restore(replicas, named, checkpoint.events.get(name))
        backend.show_as_stored()
    ctl.applications.restore(checkpoint.applications)
    return ctl


@final
class _Inert:
    """The runtime and store of a view: never called, since the view never runs."""

    def _refuse(self) -> NoReturn:
        raise RuntimeError("a standby's view of the store acts on nothing")

    async def serve(
        self,
        on_death: DeathListener,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        self._refuse()

    async def capacity(self) -> None:
        self._refuse()

    async def list_replicas(self) -> list[str]:
        self._refuse()

    async def start_replica(self, spec: ReplicaSpec) -> ReplicaInfo:
        self._refuse()

    async def adopt_replica(self, tag: str) -> ReplicaInfo:
        self._refuse()

    async def reconfigure_replica(self, tag: str, user_config: JSON) -> None:
        self._refuse()

    async def check_health_replica(self, tag: str) -> None:
        self._refuse()

    async def drain_replica(self, tag: str) -> None:
        self._refuse()

    async def kill_replica(self, tag: str) -> None:
        self._refuse()

    def fence(self, epoch: int) -> None:
        self._refuse()

    async def read_all(self) -> dict[str, str]:
        self._refuse()

    async def write(self, changes: Mapping[str, str | None]) -> None:
        self._refuse()
