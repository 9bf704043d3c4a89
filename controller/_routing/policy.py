"""A router's request policies, as pure decisions (no I/O, no trio; times are given): which
replica a keyed request goes to (rendezvous hashing with bounded load), and whether a client
may send one more request (token buckets). The retry budget is ``RetryPolicy.allows``.

Property-tested on their own (tests/serving/test_policy.py)."""

from __future__ import annotations

import collections
import hashlib
import math
from collections.abc import Sequence
from typing import final

from .._model.config.policies import AffinityPolicy

#: The replicas a key's cached preference keeps (the first is its owner; the rest take it
#: while the owner is at the load bound); past them, the whole order is worked out again.
CACHED_CHOICES = 4
#: Keys whose preferences are cached, per backend and router.
CACHED_KEYS = 16_384
#: Keys a rate limiter remembers (per backend, per ingress process); the least recently seen
#: is forgotten first (it comes back with a full bucket), so memory stays bounded whatever
#: keys clients send.
MAX_KEYS = 16_384


_MASK = (1 << 64) - 1


def key_hash(key: bytes) -> int:
    """A key's 64-bit hash."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def _mix(x: int) -> int:
    """SplitMix64's finalizer: a key's hash and a replica's seed into a score."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


@final
class Ring:
    """A backend's replicas, each key's in an order of preference of its own: rendezvous
    (highest random weight) hashing, a score per key and replica from the replica's tag, the
    highest first. A replica that joins takes just the keys it scores highest for, about
    1/N of them, from every other alike; one that leaves gives away just its own, each to its
    key's next. (A hash ring's points place replicas unevenly unless each has hundreds; this
    costs a score per replica, for a key not seen lately.)"""

    __slots__ = ("_cache", "_seeds", "size")

    def __init__(self, tags: Sequence[str]):
        self._seeds = [key_hash(tag.encode()) for tag in tags]
        self.size = len(tags)
        self._cache: collections.OrderedDict[bytes, tuple[int, ...]] = collections.OrderedDict()

    def order(self, key: bytes, whole: bool = False) -> tuple[int, ...]:
        """The replicas (indices into the tags) in `key`'s order of preference: its first
        `CACHED_CHOICES`, or all of them (`whole`)."""
        if not whole:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        h = key_hash(key)
        scores = [_mix(h ^ seed) for seed in self._seeds]
        ranked = tuple(sorted(range(self.size), key=scores.__getitem__, reverse=True))
        if whole:
            return ranked
        if len(self._cache) >= CACHED_KEYS:
            self._cache.popitem(last=False)
        first = self._cache[key] = ranked[:CACHED_CHOICES]
        return first

    def owner(self, key: bytes) -> int | None:
        """The replica a key belongs to, load aside."""
        first = self.order(key)
        return first[0] if first else None


def bounded(loads: Sequence[int], load_factor: float) -> int:
    """The most requests one replica may hold for a keyed request to be added: `load_factor`
    times the mean with this one counted, rounded up (Mirrokni, Thorup and Zadimoghaddam's
    consistent hashing with bounded loads)."""
    return math.ceil(load_factor * (sum(loads) + 1) / len(loads))


def choose_by_key(
    ring: Ring,
    key: bytes,
    loads: Sequence[int],
    limit: int,
    load_factor: float,
    excluded: frozenset[int] = frozenset(),
) -> tuple[int | None, bool]:
    """The replica for a keyed request: its key's owner if that has room under the bound and
    `limit`, else the next in the key's order that has. Returns (index or None, whether it is
    the owner). None: every replica is at the bound or the limit (the request waits)."""
    bound = min(bounded(loads, load_factor), limit)
    first = ring.order(key)
    for choices in (first, ring.order(key, whole=True)):
        for index in choices:
            if index not in excluded and loads[index] < bound:
                return index, index == first[0]
        if len(first) == ring.size:
            break  # the first were all of them
    return None, False


def header_value(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of header `name` (lower case), without the whitespace around it (not
    part of the value, RFC 9110 5.5: ``key `` is ``key``, not a key of its own), or None."""
    for key, value in headers:
        if key == name:
            return value.strip(b" \t")
    return None


def cookie_value(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The value of cookie `name`, from the request's Cookie headers, or None."""
    for key, value in headers:
        if key != b"cookie":
            continue
        for pair in value.split(b";"):
            cookie, _, found = pair.strip().partition(b"=")
            if cookie == name:
                return found.strip(b'" ')
    return None


@final
class Buckets:
    """Token buckets by key: each holds up to `capacity` tokens and gains `rate` a second; a
    request takes one. At most `max_keys` are kept, the least recently used forgotten first."""

    __slots__ = ("_buckets", "capacity", "max_keys", "rate")

    def __init__(self, rate: float, capacity: int, max_keys: int = MAX_KEYS):
        self.rate, self.capacity, self.max_keys = rate, capacity, max_keys
        self._buckets: collections.OrderedDict[bytes, list[float]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: bytes, now: float) -> float:
        """Take a token for `key` at time `now`: 0.0 if one was there, else the seconds until
        one will be (nothing is taken then)."""
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                self._buckets.popitem(last=False)
            bucket = self._buckets[key] = [float(self.capacity), now]
        else:
            self._buckets.move_to_end(key)
            tokens, then = bucket
            bucket[0] = min(float(self.capacity), tokens + (now - then) * self.rate)
            bucket[1] = now
        if bucket[0] >= 1.0:
            bucket[0] -= 1.0
            return 0.0
        return (1.0 - bucket[0]) / self.rate

    def reset(self, rate: float, capacity: int) -> None:
        """New settings: buckets kept, each capped at the new capacity."""
        self.rate, self.capacity = rate, capacity
        for bucket in self._buckets.values():
            bucket[0] = min(bucket[0], float(capacity))


def session_key(
    policy: AffinityPolicy | None, headers: Sequence[tuple[bytes, bytes]]
) -> bytes | None:
    """The key an affinity policy reads from a request (its header's value, else its
    cookie's), or None (no policy, or the request carries neither)."""
    if policy is None:
        return None
    key = None
    if policy.header is not None:
        key = header_value(headers, policy.header.encode("ascii"))
    if not key and policy.cookie is not None:
        key = cookie_value(headers, policy.cookie.encode("ascii"))
    return key or None
