"""Start-up recovery: from what the store says and what the runtime has, the backends to run.

Adopt the live replicas an intent names (RECOVERING: confirmed, or replaced, by their loops);
finish the stops and deletes in flight; kill what no intent names; start what is missing, unless
the runtime cannot hold it (that backend is DEPLOY_FAILED, reason ``Infeasible``, and starts
nothing until a deploy that fits). A store it cannot read stops everything before any of this.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import trio

from .._backend.history import plural
from .._backend.loop import Backend
from .._backend.tasks import kill_replica
from .._backend.turns import in_turns, take_turns
from .._model.config.applications import ApplicationRecord
from .._model.decisions.placement import Demand
from .._model.decisions.spec import Spec
from .._model.records.checkpoint import parse_in_steps
from .._model.records.records import (
    RevisionsRecord,
    events_key,
    page_key,
    replicas_key,
    revisions_key,
)
from .._ports.runtime import Runtime
from .._ports.store import Store
from .capacity import shortfalls

logger = logging.getLogger("controller")


async def recover(
    store: Store,
    runtime: Runtime,
    new_backend: Callable[[str, Spec, RevisionsRecord | None], Backend],
    nursery: trio.Nursery,
    restore_nodes: Callable[[Mapping[str, str]], None] = lambda items: None,
    restore_applications: Callable[[Mapping[str, ApplicationRecord]], None] = lambda r: None,
) -> None:
    """Rebuild every stored backend with `new_backend`, and start their tasks in `nursery`.

    The loop goes on meanwhile (the lease's renewal among its tasks): the texts are parsed and
    the backends restored in turns. A replica that dies meanwhile is one that died before its
    adoption, which finds it gone."""
    items = await store.read_all()
    restore_nodes(items)  # the backends' first passes know which nodes are drained
    checkpoint = await in_turns(parse_in_steps(items))
    restore_applications(checkpoint.applications)
    live = set(await runtime.list_replicas())
    backends: list[Backend] = []
    named: set[str] = set()
    gone: list[str] = []
    for done, (name, record) in enumerate(sorted(checkpoint.specs.items()), 1):
        await take_turns(done)
        backend = new_backend(name, Spec.from_record(record), checkpoint.revisions.get(name))
        gone += backend.restore(checkpoint.replicas.get(name), live, checkpoint.events.get(name))
        named.update(backend.replicas)
        backends.append(backend)
    strays = [
        key(name)
        for records, key in (
            (checkpoint.replicas, replicas_key),
            (checkpoint.events, events_key),
            (checkpoint.revisions, revisions_key),
        )
        for name in records
        if name not in checkpoint.specs
    ]
    strays += [
        page_key(name, page)
        for name, record in checkpoint.replicas.items()
        if name not in checkpoint.specs
        for page in record.pages
    ]
    if strays:
        # Records with no spec cannot come from our write order (but for events written as
        # their backend was forgotten); drop them, and let the kill of unnamed replicas below
        # stop whatever they listed.
        await store.write(dict.fromkeys(strays))
    await _block_what_cannot_fit(runtime, backends)
    for backend in backends:
        await nursery.start(backend.run)
    orphans = sorted(live - named)
    if orphans:
        logger.warning("killing %s that no intent names", plural(len(orphans), "replica"))
    # Orphans are killed; replicas that died while no controller ran have their leftovers (a
    # worker's socket and spec files) cleared by the same idempotent kill.
    for tag in orphans + gone:
        nursery.start_soon(kill_replica, runtime, tag)
    if backends:
        logger.info(
            "recovered %s; adopting %s",
            plural(len(backends), "backend"),
            plural(len(named), "replica"),
        )


async def _block_what_cannot_fit(runtime: Runtime, backends: Sequence[Backend]) -> None:
    """A stored spec may ask for more than the runtime holds (stored before it shrank, or by an
    older controller that did not count slots). Starting it would never converge, and a large
    one would exhaust the machine at every start: such a backend starts nothing new until a
    deploy that fits, and says why."""
    # A backend that starts nothing until its next deploy (DEPLOY_FAILED on its starts) wants
    # no room: only what it holds counts.
    growing = [
        b for b in backends if not (b.spec.deleting or b.reading.blocked) and _missing(b) > 0
    ]
    if not growing:
        return
    try:
        nodes = await runtime.capacity()
    except Exception:
        logger.exception("asking the runtime for its capacity at recovery")
        return
    if nodes is None:
        return
    held = [Demand(b.name, _resources(b), len(b.replicas), rules=b.spec.rules) for b in backends]
    for backend in growing:
        want = Demand(
            backend.name, _resources(backend), _missing(backend), rules=backend.spec.rules
        )
        problem = shortfalls(nodes, held, [want])
        if problem is None:
            held.append(want)  # later backends are placed beside this one
        else:
            backend.block_starts(
                f"the stored spec cannot be placed: {problem} Deploy a spec that fits to lift this."
            )


def _missing(backend: Backend) -> int:
    return max(0, backend.reading.desired - len(backend.replicas))


def _resources(backend: Backend) -> Mapping[str, float]:
    return backend.spec.backend_config.resources
