"""A replica whose worker, once it has imported this, speaks the wire of a version from before
health checks went over the monitor connection: its ``hello`` does not say it answers them, and
its monitor connection answers nothing (a line on it ends it, as that version's did). For the
tests of a worker started by an older version and adopted after an upgrade."""

from __future__ import annotations

from typing import Any

from controller._local import worker as _worker
from controller._local.wire import MONITOR_CHECKS, LineStream

_new_hello = _worker.Worker.hello


def _old_hello(self: _worker.Worker) -> dict[str, Any]:
    reply = _new_hello(self)
    del reply[MONITOR_CHECKS]
    return reply


async def _old_monitor(self: _worker.Worker, lines: LineStream) -> None:
    # As before: nothing is answered, and whatever comes (a hang-up, in that version) ends it.
    await lines.receive()


_worker.Worker.hello = _old_hello  # type: ignore[method-assign]
_worker.Worker.monitor = _old_monitor  # type: ignore[method-assign]


class OldWorker:
    def check_health(self) -> None:
        pass
