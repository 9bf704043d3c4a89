"""``controller run --reload``, a development mode: when the source of a backend's code changes
on disk, the leader restarts that backend (``rollout restart``) once the files have settled.

There is no portable way to be told of a file's change without a dependency, and this is a
development aid, so it looks: every `RELOAD_PERIOD_S`, in a thread, the source of each running
revision's entrypoint is digested as a deploy pins it (each entrypoint once). A digest that
differs from the revision's and stays the same for one more look (the editor done saving)
starts a restart. The restarted revision pins that digest, so a restart is never repeated for
the same edit, nor for one that failed (its replicas' errors say why; the next edit tries again).
What is looked at is what a revision pins: the entrypoint's module, or its whole top-level
package; another plain module beside it that it imports is not (make the code a package).
"""

from __future__ import annotations

import logging

import attrs
import trio

from .._core.controller import Controller
from .._model.config.cause import Cause
from .._model.records.revisions import Revision
from .._model.values.code import CodeDigest
from .._model.values.errors import ControllerClosedError, ControllerError
from .._sources import code_digest

logger = logging.getLogger("controller.daemon")

#: How often the sources are looked at; a change is acted on one look after it stops changing.
RELOAD_PERIOD_S = 0.5

_CAUSE = Cause("controller", "--reload: the code changed on disk")


@attrs.define
class CodeWatch:
    """What the last look saw: each entrypoint's digest (None: not found)."""

    ctl: Controller
    seen: dict[str, str | None] = attrs.field(factory=dict)

    async def run(self) -> None:
        while True:
            await trio.sleep(RELOAD_PERIOD_S)
            try:
                await self.look()
            except ControllerClosedError:
                return

    async def look(self) -> None:
        """One look: restart each backend whose code changed and has settled since the last."""
        running = self._running()
        entrypoints = {r.content.replica_config.entrypoint for r in running.values()}
        now = await trio.to_thread.run_sync(_digests, sorted(entrypoints), self.ctl.code_path)
        before, self.seen = self.seen, now
        for name, revision in running.items():
            entrypoint = revision.content.replica_config.entrypoint
            digest = now[entrypoint]
            recorded = None if revision.code is None else revision.code.digest
            if digest is None or digest == recorded:
                # Not found now, or what runs. A revision made before its module was found
                # (None) is restarted once it is: writing the code after declaring the
                # backend is a way to start.
                continue
            if before.get(entrypoint) != digest:
                continue  # still changing: the next look decides
            await self._restart(name, revision.number)

    def _running(self) -> dict[str, Revision]:
        """Each backend's revision to compare: the one it rolls out or runs, unless it is
        deleting or paused (a restart would be refused)."""
        found = {}
        for status in self.ctl.status().backends:
            rollout = status.rollout
            if status.deleting or rollout is None or rollout.paused:
                continue
            for revision in self.ctl.revisions(status.name, check_code=False):
                if revision.number == rollout.revision:
                    found[status.name] = revision
        return found

    async def _restart(self, name: str, number: int) -> None:
        try:
            goal = await self.ctl.restart(name, cause=_CAUSE)
        except ControllerClosedError:
            raise
        except ControllerError as exc:
            # Deleted or paused meanwhile, or the store failed: the next look tries again.
            logger.warning("--reload: backend %s not restarted: %s", name, exc)
            return
        logger.info(
            "--reload: the code of backend %s changed on disk: restarting revision %d "
            "(generation %d)",
            name,
            number,
            goal.generation,
        )


def _digests(entrypoints: list[str], code_path: tuple[str, ...]) -> dict[str, str | None]:
    found: dict[str, CodeDigest | None] = {e: code_digest(e, code_path) for e in entrypoints}
    return {e: None if d is None else d.digest for e, d in found.items()}
