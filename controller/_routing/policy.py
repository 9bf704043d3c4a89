"""A router's request policies, as pure decisions (no I/O, no trio; times are given): which
replica a keyed request goes to (consistent hashing with bounded load), and whether a client
may send one more request (token buckets). The retry budget is ``RetryPolicy.allows``.

Property-tested on their own (tests/test_policy.py)."""

from __future__ import annotations

import bisect
import collections
import functools
import hashlib
import math
from collections.abc import Iterator, Sequence
from typing import final

from .._model.policies import AffinityPolicy

#: Points each replica has on the ring: with 64, each replica's share of the keys is within
#: about a fifth of its fair share (a few points leave some replicas twice the keys of others).
POINTS_PER_REPLICA = 64
#: Keys a rate limiter remembers (per backend, per ingress process); the least recently seen
#: is forgotten first (it comes back with a full bucket), so memory stays bounded whatever
#: keys clients send.
MAX_KEYS = 16_384


def key_hash(key: bytes) -> int:
    """A key's place on the ring (a keyed hash would let no client aim at a replica, but the
    bounded load already keeps one key from overloading any)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


@functools.lru_cache(maxsize=4096)
def _points(tag: str) -> tuple[int, ...]:
    return tuple(key_hash(b"%s#%d" % (tag.encode(), i)) for i in range(POINTS_PER_REPLICA))


@final
class Ring:
    """The replicas of a backend on a hash ring, each at points drawn from its tag: a key
    belongs to the replica whose point follows the key's. A replica that joins takes only the
    keys that now fall before its points; one that leaves gives only its own keys away."""

    __slots__ = ("_hashes", "_owners", "size")

    def __init__(self, tags: Sequence[str]):
        points = sorted((h, index) for index, tag in enumerate(tags) for h in _points(tag))
        self._hashes = [h for h, _ in points]
        self._owners = [index for _, index in points]
        self.size = len(tags)

    def walk(self, point: int) -> Iterator[int]:
        """The replicas (indices into the tags) from `point` on, round the ring, each once."""
        hashes, owners = self._hashes, self._owners
        if not hashes:
            return
        start = bisect.bisect_left(hashes, point)
        seen: set[int] = set()
        for step in range(len(hashes)):
            owner = owners[(start + step) % len(hashes)]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == self.size:
                    return

    def owner(self, key: bytes) -> int | None:
        """The replica a key belongs to, load aside."""
        return next(self.walk(key_hash(key)), None)


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
    `limit`, else the next on the ring that has. Returns (index or None, whether it is the
    owner). None: every replica is at the bound or the limit (the request waits)."""
    bound = min(bounded(loads, load_factor), limit)
    first = True
    for index in ring.walk(key_hash(key)):
        if index not in excluded and loads[index] < bound:
            return index, first
        first = False
    return None, False


def header_value(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of header `name` (lower case), or None."""
    for key, value in headers:
        if key == name:
            return value
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
