"""What one ingress knows of each routed backend: its replicas, with the requests this ingress
has in flight to each, and its queue of requests waiting for room. Changed only by the
ingress's own tasks (trio is single-threaded, so no locks)."""

from __future__ import annotations

import collections
import random
from collections.abc import Callable
from typing import Literal, final

import attrs
import trio

from .._model.config.policies import AffinityPolicy, RateLimitPolicy, RetryPolicy
from .._model.decisions.verdict import RequestTally
from .choice import choose, choose_near
from .model_routes import ModelRoutes
from .models import Held
from .policy import Buckets, Ring, choose_by_key
from .split import Side, Split, reached_side


@attrs.frozen
class RouteInfo:
    """A backend as the ingress needs it, from a watch snapshot (in process or over HTTP)."""

    name: str
    snapshot_id: int
    exists: bool
    deleting: bool
    route_prefix: str | None
    max_ongoing_requests: int
    max_queued_requests: int
    replicas: tuple[tuple[str, str], ...]
    """(tag, address) of each replica that serves."""
    scales_from_zero: bool = False
    """Autoscaled down to 0 replicas when idle: with none, requests wait in the queue (their
    load brings a replica up) instead of getting 503 at once."""
    split: Split | None = None
    """A canary release's split of the requests (None: every replica alike)."""
    versions: tuple[tuple[str, str], ...] = ()
    """(tag, version) of each replica."""
    version: str = ""
    """The version its replicas move to: in a rolling update (no split), a replica of it is
    on the new side, the others on the old (the sides a request tree keeps to)."""
    request_timeout_s: float = 60.0
    """The backend's deadline for a whole request (``BackendConfig.request_timeout_s``)."""
    retries: RetryPolicy = attrs.field(factory=RetryPolicy)
    affinity: AffinityPolicy | None = None
    rate_limit: RateLimitPolicy | None = None
    held: tuple[tuple[str, Held], ...] = ()
    """(tag, models) of each multiplexed replica, as the controller last heard from it."""


def _host(address: str) -> str:
    return address.rpartition(":")[0].strip("[]")


@final
@attrs.define(eq=False)
class Slot:
    """One replica, and the requests this ingress has sent it and not yet seen answered."""

    tag: str
    address: str
    in_flight: int = 0
    uploads: int = 0
    """Of what it was sent, the uploads (bodies too large to read first) not yet answered:
    counted apart from ``in_flight``, which ``max_ongoing_requests`` bounds."""
    latency_s: float = 0.0
    """Its recent answer time (peak-sensitive average of the time to a response's head)."""
    index: int = -1
    """Where it is in its backend's list (kept by ``BackendRoutes.update``)."""
    gone: bool = False
    """It left the snapshot: it is chosen no more; requests already sent to it complete."""
    version: str = ""
    """Its version, while its backend's requests are split (else not needed)."""
    held: Held | None = None
    """The models it holds, as its newest answer said (None: not multiplexed, or not heard)."""


#: The answer time a refused connection counts as (see ``BackendRoutes.refused``).
REFUSED_PENALTY_S = 10.0

RejectCause = Literal["queue_full", "queue_timeout", "no_replicas"]


class Rejected(Exception):
    """No replica can take the request: 503 with Retry-After."""

    def __init__(self, cause: RejectCause, message: str):
        super().__init__(message)
        self.cause = cause


@final
@attrs.define(eq=False)
class _Waiter:
    event: trio.Event = attrs.field(factory=trio.Event)
    slot: Slot | None = None
    excluded: frozenset[str] = frozenset()
    key: bytes | None = None
    model: str | None = None


@final
@attrs.define(eq=False)
class BackendRoutes:
    """One backend's replicas and queue at this ingress."""

    name: str
    rng: random.Random
    on_change: Callable[[BackendRoutes], None]
    """Called when in-flight or queued counts change (the load reporter coalesces)."""
    max_ongoing: int = 100
    max_queued: int = 1000
    request_timeout_s: float = 60.0
    route_prefix: str = "-"
    scales_from_zero: bool = False
    slots: list[Slot] = attrs.field(factory=list)
    by_tag: dict[str, Slot] = attrs.field(factory=dict)
    _queue: collections.deque[_Waiter] = attrs.field(factory=collections.deque)
    _loads: list[int] = attrs.field(factory=list)  # slots' in_flight, for `choose`
    _latencies: list[float] = attrs.field(factory=list)  # slots' latency_s, for `choose`
    _leaving: dict[str, Slot] = attrs.field(factory=dict)
    """Replicas gone from the snapshot with requests still in flight."""
    local_host: str | None = None
    """Replicas at this host are tried first (``IngressConfig.prefer_host``)."""
    _local: list[int] = attrs.field(factory=list)
    """The indices of those, when some replicas are elsewhere (else none: no choice to make)."""
    split: Split | None = None
    """A canary release's split: each request goes to a side first, then to a replica of it."""
    _sides: dict[str, list[int]] = attrs.field(factory=dict)
    """The indices of each side's replicas (of a split, or of a rolling update)."""
    _target: str = ""
    """In a rolling update (no split, replicas of two versions or more): the new version."""
    tallies: dict[str, RequestTally] = attrs.field(factory=dict)
    """What was answered since the last load report, by replica version, while split."""
    retries: RetryPolicy = attrs.field(factory=RetryPolicy)
    retrying: int = 0
    """Requests of this router being tried again (each counted until it ends)."""
    affinity: AffinityPolicy | None = None
    _ring: Ring | None = None
    """The replicas on a hash ring, while there is an affinity policy."""
    _ring_tags: tuple[str, ...] = ()
    rate_limit: RateLimitPolicy | None = None
    limiter: Buckets | None = None
    """The rate limit's buckets, while there is one (only an ingress uses them)."""
    counts: dict[str, int] = attrs.field(factory=dict)
    """What the policies did (``retried``, ``retry_refused``, ``keyed``, ``spilled``,
    ``rate_limited``), and model routing (``model_held``: to a replica holding the request's
    model; ``model_load``: to one that loads it), for metrics."""
    models: ModelRoutes = attrs.field(factory=ModelRoutes)
    """Where its models are, while its replicas are multiplexed (and requests name models)."""

    @property
    def queued(self) -> int:
        return len(self._queue)

    def update(self, info: RouteInfo) -> list[Slot]:
        """Take a new snapshot: replicas not in it leave the choice at once. Returns the slots
        that left with nothing in flight (their idle connections can be closed)."""
        self.max_ongoing = info.max_ongoing_requests
        self.max_queued = info.max_queued_requests
        self.request_timeout_s = info.request_timeout_s
        self.retries = info.retries
        self._rate_limit(info.rate_limit)
        self.route_prefix = info.route_prefix or "-"
        self.scales_from_zero = info.scales_from_zero
        fresh = dict(info.replicas)
        closed: list[Slot] = []
        for slot in self.slots:
            if fresh.get(slot.tag) != slot.address:
                slot.gone = True
                del self.by_tag[slot.tag]
                if slot.in_flight or slot.uploads:
                    self._leaving[slot.tag] = slot
                else:
                    closed.append(slot)
        self.slots = [s for s in self.slots if not s.gone]
        # A new replica starts at the others' average answer time: neither shunned nor sent
        # every request until its first answer.
        timed = [s.latency_s for s in self.slots if s.latency_s > 0]
        start = sum(timed) / len(timed) if timed else 0.0
        for tag, address in info.replicas:
            if tag not in self.by_tag:
                slot = Slot(tag, address, latency_s=start)
                self.by_tag[tag] = slot
                self.slots.append(slot)
        for index, slot in enumerate(self.slots):
            slot.index = index
        for tag, held in info.held:
            # The controller's word, where it is newer than this router's (answers carry it).
            known = self.by_tag.get(tag)
            if known is not None and (
                known.held is None or known.held.generation < held.generation
            ):
                known.held = held
        self.models.index(self.slots)
        self.split = info.split
        self._sides = {}
        versions = dict(info.versions)
        for slot in self.slots:
            slot.version = versions.get(slot.tag, "")
        mixed = len({s.version for s in self.slots}) > 1
        self._target = info.version if info.split is None and mixed else ""
        if info.split is not None or self._target:
            for slot in self.slots:
                side = self.side_of(slot)
                if side is not None:
                    self._sides.setdefault(side, []).append(slot.index)
        self._loads = [s.in_flight for s in self.slots]
        self._latencies = [s.latency_s for s in self.slots]
        self.affinity = info.affinity
        tags = tuple(s.tag for s in self.slots)
        if info.affinity is None:
            self._ring, self._ring_tags = None, ()
        elif self._ring is None or tags != self._ring_tags:
            self._ring, self._ring_tags = Ring(tags), tags
        if self.local_host is not None:
            near = [s.index for s in self.slots if _host(s.address) == self.local_host]
            self._local = near if len(near) < len(self.slots) else []
        self._serve_queue()
        # A queue no replica will ever empty: those waiting hear so now, not at their timeout.
        # (One that scales from zero: their load is what brings its first replica.)
        if not self.slots and not self.scales_from_zero:
            while self._queue:
                self._queue.popleft().event.set()
        self.on_change(self)
        return closed

    def side_of(self, slot: Slot) -> Side | None:
        """The side a request on `slot` reached (``split.reached_side``)."""
        return reached_side(self.split, self._target, slot.version)

    def try_acquire(
        self,
        excluded: frozenset[str] = frozenset(),
        side: Side | None = None,
        key: bytes | None = None,
        model: str | None = None,
    ) -> Slot | None:
        """A replica with room for one more request (counted as in flight), or None. With a
        `side` of a canary release: one of that revision's while one has room (else any).
        With a `key` under an affinity policy: the key's replica on the ring, or the next
        with room under the bound. With a `model`: one that holds it (``by_model``)."""
        if self._queue and not excluded:
            return None  # first come, first served: those waiting go first
        if model is not None:
            index = self.by_model(model, excluded, side)
            return None if index is None else self._take(index)
        if key is not None and self._ring is not None:
            return self._by_key(key, excluded, side)
        if side is not None and not excluded:
            group = self._sides.get(side)
            if group:
                pick = choose_near(group, self._loads, self.max_ongoing, self.rng)
                if pick is not None:
                    return self._take(pick)
        if self._local and not excluded:
            near = choose_near(self._local, self._loads, self.max_ongoing, self.rng)
            if near is not None:
                return self._take(near)
        index = choose(
            self._loads, self.max_ongoing, self.rng, self._indices(excluded), self._latencies
        )
        if index is None:
            return None
        return self._take(index)

    async def acquire(
        self,
        excluded: frozenset[str] = frozenset(),
        key: bytes | None = None,
        model: str | None = None,
    ) -> Slot:
        """A replica for one request: at once if one has room, else after waiting in the
        queue (first in, first out). Raises `Rejected` if no replica serves, if the queue is
        full, or if the caller's deadline cancels the wait (as queue_timeout)."""
        slot = self.try_acquire(excluded, key=key, model=model)
        if slot is not None:
            return slot
        return await self.wait(excluded, key, model)

    async def wait(
        self,
        excluded: frozenset[str] = frozenset(),
        key: bytes | None = None,
        model: str | None = None,
    ) -> Slot:
        """`acquire` once ``try_acquire`` found no room: wait in the queue."""
        waits_for_first = self.scales_from_zero and not self.slots and not excluded
        if all(s.tag in excluded for s in self.slots) and not waits_for_first:
            raise Rejected("no_replicas", f"backend {self.name!r} has no replica that serves")
        if len(self._queue) >= self.max_queued:
            raise Rejected(
                "queue_full",
                f"backend {self.name!r} is at capacity: every replica has max_ongoing_requests="
                f"{self.max_ongoing} in flight and max_queued_requests={self.max_queued} wait",
            )
        waiter = _Waiter(excluded=excluded, key=key, model=model)
        self._queue.append(waiter)
        self.on_change(self)
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.slot is not None:
                self.release(waiter.slot)  # handed a replica just as it gave up
            else:
                self._remove(waiter)
            raise
        if waiter.slot is None:
            raise Rejected("no_replicas", f"backend {self.name!r} has no replica that serves")
        return waiter.slot

    def release(self, slot: Slot) -> None:
        """A request to `slot` ended (answered, failed or abandoned)."""
        slot.in_flight -= 1
        if slot.gone:
            if slot.in_flight == 0 and slot.uploads == 0:
                self._leaving.pop(slot.tag, None)
        else:
            self._loads[slot.index] = slot.in_flight
            self._serve_queue()
        self.on_change(self)

    def take_upload(self, excluded: frozenset[str], side: Side | None) -> Slot | None:
        """A replica for an upload (a body too large to read before choosing): the less
        loaded of two, of the `side` drawn while it has replicas, whatever their room. It is
        counted in the replica's ``uploads``: its budget is the ingress's, not
        ``max_ongoing_requests``, so that a slow upload takes no request's room. None if no
        replica serves."""
        unbounded = 1 << 62
        index: int | None = None
        group = self._sides.get(side) if side is not None and not excluded else None
        if group:
            index = choose_near(group, self._loads, unbounded, self.rng)
        if index is None:
            index = choose(self._loads, unbounded, self.rng, self._indices(excluded))
        if index is None:
            return None
        slot = self.slots[index]
        slot.uploads += 1
        self.on_change(self)
        return slot

    def release_upload(self, slot: Slot) -> None:
        """An upload to `slot` ended."""
        slot.uploads -= 1
        if slot.gone and slot.in_flight == 0 and slot.uploads == 0:
            self._leaving.pop(slot.tag, None)
        self.on_change(self)

    def answered(self, slot: Slot, seconds: float) -> None:
        """`slot` started an answer `seconds` after its request was sent. The estimate is of
        how fast the replica can answer, not of its queue (the requests in flight stand for
        that): a faster answer moves it half way at once, a slower one a tenth of the way, so
        an answer that waited behind others does not make a fast replica look slow, while one
        that stays slow is found so within a few answers."""
        latency = slot.latency_s
        weight = 0.5 if seconds < latency else 0.1
        slot.latency_s = seconds if latency == 0 else latency + (seconds - latency) * weight
        if not slot.gone:
            self._latencies[slot.index] = slot.latency_s

    def count(self, slot: Slot, error: bool, seconds: float, client: str | None = None) -> None:
        """A request `slot` took has ended (`error`: a 5xx, or no answer): counted for the
        gates of a canary release, while there is one, with the `client` (address) it came
        from (no single client decides a verdict)."""
        if self.split is None or not slot.version:
            return
        tally = self.tallies.get(slot.version)
        if tally is None:
            tally = self.tallies[slot.version] = RequestTally()
        tally.count(error, seconds, client)

    def take_tallies(self) -> dict[str, RequestTally]:
        """What was counted since the last call (for a load report)."""
        taken, self.tallies = self.tallies, {}
        return taken

    def give_back(self, tallies: dict[str, RequestTally]) -> None:
        """Counts a report could not deliver: sent with the next."""
        for version, tally in tallies.items():
            self.tallies.setdefault(version, RequestTally()).add(tally)

    def refused(self, slot: Slot) -> None:
        """A connection to `slot` failed before the request went out: it counts as a replica
        that takes `REFUSED_PENALTY_S` to answer, so it is chosen only to explore (or when all
        others are far busier) until answers bring its time down. A replica that died while
        its controller is away is so left alone, without being dropped."""
        self.answered(slot, REFUSED_PENALTY_S)

    def in_flight(self) -> dict[str, int]:
        """Requests in flight per replica tag, uploads included (replicas gone included until
        they finish)."""
        out = {s.tag: s.in_flight + s.uploads for s in self.slots if s.in_flight or s.uploads}
        out.update((s.tag, s.in_flight + s.uploads) for s in self._leaving.values())
        return out

    def _take(self, index: int) -> Slot:
        slot = self.slots[index]
        slot.in_flight += 1
        self._loads[index] = slot.in_flight
        self.on_change(self)
        return slot

    def _indices(self, excluded: frozenset[str]) -> frozenset[int]:
        if not excluded:
            return frozenset()
        return frozenset(self.by_tag[t].index for t in excluded if t in self.by_tag)

    def _serve_queue(self) -> None:
        while self._queue:
            waiter = self._queue[0]
            excluded = self._indices(waiter.excluded)
            if waiter.model is not None:
                index = self.by_model(waiter.model, waiter.excluded, None)
            elif waiter.key is not None and self._ring is not None:
                index = self._keyed(waiter.key, excluded)
            else:
                index = choose(self._loads, self.max_ongoing, self.rng, excluded)
            if index is None:
                return
            self._queue.popleft()
            waiter.slot = self._take(index)
            waiter.event.set()

    # -- models --

    def by_model(self, model: str, excluded: frozenset[str], side: Side | None) -> int | None:
        """The replica for a request naming `model` (not yet counted as in flight), by
        ``ModelRoutes.choose``, among those of the request's `side` where there is one."""
        group = self._sides.get(side) if side is not None else None
        allowed = None if not group else frozenset(group)
        index, what = self.models.choose(
            model,
            self.slots,
            self._loads,
            self.max_ongoing,
            self.rng,
            self._indices(excluded),
            allowed,
        )
        if what is not None:
            self.counted(what)
        return index

    def heard(self, slot: Slot, value: bytes) -> None:
        """`slot`'s answer said what it holds (a ``HELD_HEADER`` value)."""
        if not slot.gone:
            self.models.heard(slot, value)

    def asked(self, model: str) -> None:
        """A request named `model` (counted once, however many replicas it is sent to)."""
        self.models.asked(model)

    def held_models(self) -> dict[str, Held]:
        """What each replica holds, as this router heard (or guessed)."""
        return {s.tag: s.held for s in self.slots if s.held is not None}

    # -- the policies --

    def _by_key(self, key: bytes, excluded: frozenset[str], side: Side | None) -> Slot | None:
        skip = self._indices(excluded)
        group = self._sides.get(side) if side is not None else None
        if group:
            # A canary's split picks the revision first; the key, the replica within it.
            inside = set(group)
            skip = skip | {i for i in range(len(self.slots)) if i not in inside}
            index = self._keyed(key, skip)
            if index is not None:
                return self._take(index)
            skip = self._indices(excluded)
        index = self._keyed(key, skip)
        return None if index is None else self._take(index)

    def _keyed(self, key: bytes, skip: frozenset[int]) -> int | None:
        assert self._ring is not None
        assert self.affinity is not None
        index, owner = choose_by_key(
            self._ring, key, self._loads, self.max_ongoing, self.affinity.load_factor, skip
        )
        if index is not None:
            self.counted("keyed" if owner else "spilled")
        return index

    def retry(self, tried: int, retrying: bool) -> str | None:
        """Whether a request that reached none of the `tried` replicas it was sent to goes to
        another: None if so (from its first retry on, it counts in the retry budget until the
        caller's ``retry_done``), else why not."""
        policy = self.retries
        if tried > policy.max_retries:
            return f"tried {tried} replicas (retries.max_retries={policy.max_retries})"
        if tried >= len(self.slots) + len(self._leaving):
            return f"tried every replica ({tried})"
        if not retrying:
            active = sum(self._loads) + len(self._queue)
            if not policy.allows(self.retrying, active):
                self.counted("retry_refused")
                return (
                    f"not tried again: the retry budget is spent ({self.retrying} requests "
                    f"retrying, at most {policy.budget_percent:g} % of those under way or "
                    f"{policy.min_retry_concurrency})"
                )
            self.retrying += 1
        self.counted("retried")
        return None

    def retry_done(self) -> None:
        self.retrying -= 1

    def _rate_limit(self, policy: RateLimitPolicy | None) -> None:
        self.rate_limit = policy
        if policy is None:
            self.limiter = None
        elif self.limiter is None:
            self.limiter = Buckets(policy.requests_per_s, policy.capacity)
        else:
            self.limiter.reset(policy.requests_per_s, policy.capacity)

    def counted(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def _remove(self, waiter: _Waiter) -> None:
        try:
            self._queue.remove(waiter)
        except ValueError:
            return  # already handed nothing (no replicas left)
        self.on_change(self)
