"""The fencing actor of a RayKVStore: the one writer of the lease and of fenced intent in its
namespace of Ray's KV store.

Ray's KV store puts one key at a time, and has put-if-absent but no compare-and-swap, so it
cannot check a lease and write intent in one step by itself. This actor can: it is a plain
(sync) actor, so Ray runs its calls one at a time, in the order they reach it, and each call's
compare and write happen with no other call between them. Every claim, renewal and fenced write
of the namespace goes through it (one named, detached actor per namespace), so the KV store holds
only what the actor's serial order allowed:

- a fenced write is checked against the lease when the actor runs it, not when it was sent: a
  stale leader's write that was already on its way when a claim arrived runs after the claim and
  is refused; one that ran before the claim landed before it, as it would have in SQLite;
- a batch of several keys is applied through a journal key; a crash halfway leaves the journal,
  and the actor, restarted by Ray (``max_restarts=-1``), applies it again in ``__init__``, before
  it runs any other call: the batch lands in full, before anything later. Nobody else applies
  that journal (a reader would race the actor's next batch): ``RayKVStore.read_all`` asks the
  actor to when it finds one.

The actor keeps nothing of its own: it reads the lease from the KV store in every call, so a
restart loses nothing. Replies are JSON text, never pickled exceptions.
"""

from __future__ import annotations

import json
from typing import Any, final

from ray.exceptions import RayError
from ray.experimental import internal_kv

from .._model.decisions.lease import Lease, same_grant
from .._model.values.errors import StoreError

#: Where the intent's keys live (``read_all`` lists this prefix).
DATA = b"k/"
#: The lease, one key beside the intent.
LEASE = b"lease"
#: The batch of a fenced write being applied (present only while one is, or after a crash).
FENCED_JOURNAL = b"fenced-journal"
#: The Ray namespace of the fencing actors; each is named after its store's namespace. Not the
#: store's own Ray namespace: a RayRuntime of that name would take the actor for a replica.
ACTOR_NAMESPACE = "controller-fences"


def apply(namespace: str, changes: dict[str, str | None]) -> None:
    """Put or delete each key of `changes` under the data prefix (idempotent)."""
    for key, value in changes.items():
        raw = DATA + key.encode()
        if value is None:
            internal_kv._internal_kv_del(raw, namespace=namespace)
        else:
            internal_kv._internal_kv_put(raw, value, namespace=namespace)


@final
class FenceActor:
    """Built by RayKVStore as a named, detached actor; not meant to be used directly."""

    def __init__(self, namespace: str) -> None:
        self._namespace = namespace
        # Ray runs __init__ before any call, after a restart too: a batch a crash left halfway
        # lands before anything that comes after it.
        self._repair()

    def repair(self) -> str:
        """Apply a fenced batch left halfway by a crash, if there is one."""

        def repair() -> dict[str, Any]:
            self._repair()
            return {}

        return self._reply(repair)

    def claim(self, seen_json: str | None, new_json: str) -> str:
        """Store the lease `new_json` if the stored one is still as `seen_json` shows it."""

        def claim() -> dict[str, Any]:
            seen = None if seen_json is None else Lease.from_json(seen_json)
            if not same_grant(self._lease(), seen):
                return {"claimed": False}
            self._put(LEASE, new_json)
            return {"claimed": True}

        return self._reply(claim)

    def renew(self, lease_json: str) -> str:
        """Store the lease `lease_json` if the stored one still has its epoch."""

        def renew() -> dict[str, Any]:
            lease = Lease.from_json(lease_json)
            refused = self._refused(lease.epoch)
            if refused is None:
                self._put(LEASE, lease_json)
            return refused or {}

        return self._reply(renew)

    def write(self, epoch: int, changes_json: str) -> str:
        """Write `changes_json` (a JSON object of keys to text or null) if the stored lease's
        epoch is `epoch`."""

        def write() -> dict[str, Any]:
            refused = self._refused(epoch)
            if refused is not None:
                return refused
            changes: dict[str, str | None] = json.loads(changes_json)
            if len(changes) == 1:
                apply(self._namespace, changes)  # one key: atomic as it is
            elif changes:
                self._put(FENCED_JOURNAL, changes_json)
                apply(self._namespace, changes)
                internal_kv._internal_kv_del(FENCED_JOURNAL, namespace=self._namespace)
            return {}

        return self._reply(write)

    # -- internals --

    def _reply(self, work: Any) -> str:
        try:
            result: dict[str, Any] = work()
        except StoreError as exc:  # a damaged lease: nothing was written
            return json.dumps({"ok": False, "error": str(exc)})
        except (RayError, ConnectionError, TimeoutError, OSError) as exc:  # the KV store's
            return json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return json.dumps({"ok": True, **result})

    def _lease(self) -> Lease | None:
        text = internal_kv._internal_kv_get(LEASE, namespace=self._namespace)
        return None if text is None else Lease.from_json(text.decode())

    def _refused(self, epoch: int) -> dict[str, Any] | None:
        """None if the stored lease's epoch is `epoch` (0: no lease), else the refusal."""
        lease = self._lease()
        held = lease.epoch if lease is not None else 0
        return None if held == epoch else {"ok": False, "fenced": held}

    def _put(self, key: bytes, text: str) -> None:
        internal_kv._internal_kv_put(key, text, namespace=self._namespace)

    def _repair(self) -> None:
        journal = internal_kv._internal_kv_get(FENCED_JOURNAL, namespace=self._namespace)
        if journal is not None:
            apply(self._namespace, json.loads(journal))
            internal_kv._internal_kv_del(FENCED_JOURNAL, namespace=self._namespace)
