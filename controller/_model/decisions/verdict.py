"""A canary judged on its own numbers: what the ingresses count per revision (requests, errors,
a latency histogram), and the gates that compare the canary with the stable revision over the
same step. Pure: no trio, no I/O; the ingress counts with ``bucket_of``, the backend's loop
sums what every ingress reports and asks ``judge``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import final

import attrs

from ..config.canary import CanaryConfig

#: Latency buckets: 0 holds answers under 0.5 ms, bucket k up to 0.5 ms x 1.2^k, so a p99 read
#: off them is within 20 % (a revision twice as slow is told from one 1.5x as slow); the last
#: holds every answer from about 6 minutes on.
BUCKET_BASE_S = 0.0005
BUCKET_GROWTH = 1.2
MAX_BUCKET = 80
_LOG_GROWTH = math.log(BUCKET_GROWTH)
#: The largest count kept (2**53 - 1).
MAX_COUNT = 2**53 - 1
#: The clients a tally names once summed: the heaviest, enough to leave out the one that errs
#: most (``judge``), and to know a tally with one client for one.
MAX_CLIENTS = 16
#: The clients an ingress tracks between two reports (more are counted, not named).
MAX_TRACKED_CLIENTS = 1024
#: The longest client name a report may carry (an address).
MAX_CLIENT_CHARS = 64


def bucket_of(seconds: float) -> int:
    """The histogram bucket an answer time falls in."""
    if seconds < BUCKET_BASE_S:
        return 0
    k = int(math.log(seconds / BUCKET_BASE_S) / _LOG_GROWTH) + 1
    return k if k < MAX_BUCKET else MAX_BUCKET


def bucket_top(k: int) -> float:
    """The longest answer time bucket `k` holds (its upper bound, in seconds)."""
    return BUCKET_BASE_S * BUCKET_GROWTH**k


@final
@attrs.define
class RequestTally:
    """One revision's numbers over a span: requests answered or failed, how many of them were
    errors (a 5xx, or no answer from the replica), and their answer times by bucket."""

    requests: int = 0
    errors: int = 0
    buckets: dict[int, int] = attrs.field(factory=dict)
    clients: dict[str, tuple[int, int]] = attrs.field(factory=dict)
    """Of its requests, the requests and errors of each client (by address): all of them while
    an ingress counts (up to `MAX_TRACKED_CLIENTS`), the `MAX_CLIENTS` heaviest once summed
    (those with the most errors, then requests)."""

    def count(self, error: bool, seconds: float, client: str | None = None) -> None:
        self.requests += 1
        self.errors += error
        k = bucket_of(seconds)
        self.buckets[k] = self.buckets.get(k, 0) + 1
        if client is not None:
            seen = self.clients.get(client)
            if seen is not None:
                self.clients[client] = (seen[0] + 1, seen[1] + error)
            elif len(self.clients) < MAX_TRACKED_CLIENTS:
                self.clients[client] = (1, int(error))

    def add(self, other: RequestTally) -> None:
        # Sums stop at what a double holds exactly (what the API's readers keep): reports can
        # come from anyone holding the token.
        self.requests = min(self.requests + other.requests, MAX_COUNT)
        self.errors = min(self.errors + other.errors, self.requests)
        for k, n in other.buckets.items():
            self.buckets[k] = min(self.buckets.get(k, 0) + n, MAX_COUNT)
        clients = dict(self.clients)
        for client, (requests, errors) in other.clients.items():
            mine = clients.get(client, (0, 0))
            clients[client] = (
                min(mine[0] + requests, self.requests),
                min(mine[1] + errors, self.errors),
            )
        self.clients = _heaviest(clients)

    def without_worst(self) -> tuple[int, int, str | None]:
        """Its requests and errors less those of the client that erred most, and that client
        (None: none named, or it is the only client, so there is no one else to judge by)."""
        if not self.clients:
            return self.requests, self.errors, None
        client, (requests, errors) = max(self.clients.items(), key=lambda kv: (kv[1][1], kv[0]))
        if errors == 0 or requests >= self.requests:
            return self.requests, self.errors, None
        return self.requests - requests, max(0, self.errors - errors), client

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def quantile(self, q: float) -> float | None:
        """The answer time under which a `q` share of the requests fell (a bucket's upper
        bound); None without requests."""
        total = sum(self.buckets.values())
        if total == 0:
            return None
        rank = math.ceil(q * total)
        seen = 0
        for k in sorted(self.buckets):
            seen += self.buckets[k]
            if seen >= rank:
                return bucket_top(k)
        return bucket_top(MAX_BUCKET)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "requests": self.requests,
            "errors": self.errors,
            "buckets": {str(k): n for k, n in sorted(self.buckets.items())},
        }
        clients = _heaviest(self.clients)
        if clients:
            out["clients"] = {c: list(counts) for c, counts in sorted(clients.items())}
        return out


def _heaviest(clients: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """The `MAX_CLIENTS` clients with the most errors, then the most requests: those without
    errors are kept too, so that a tally whose one client never erred in a report still
    counts all of that client's requests, and is known as that client's alone."""
    if len(clients) <= MAX_CLIENTS:
        return dict(clients)
    ranked = sorted(clients.items(), key=lambda kv: (-kv[1][1], -kv[1][0], kv[0]))
    return dict(ranked[:MAX_CLIENTS])


def tally_from_json(data: object) -> RequestTally:
    """A tally as an ingress reports it; ``ValueError`` naming the rule."""
    if not isinstance(data, Mapping) or not (
        {"requests", "errors", "buckets"}
        <= set(data)
        <= {"requests", "errors", "buckets", "clients"}
    ):
        raise ValueError(
            "must be an object with exactly 'requests', 'errors' and 'buckets', and 'clients'"
            " if any"
        )
    requests, errors, buckets = data["requests"], data["errors"], data["buckets"]
    if not _count(requests) or not _count(errors) or errors > requests:
        raise ValueError("requests and errors must be counts, errors at most requests")
    if not isinstance(buckets, Mapping) or len(buckets) > MAX_BUCKET + 1:
        raise ValueError(f"buckets must map at most {MAX_BUCKET + 1} bucket numbers to counts")
    out: dict[int, int] = {}
    for key, n in buckets.items():
        if not isinstance(key, str) or key not in _BUCKET_KEYS or not _count(n):
            raise ValueError(f"buckets: keys are bucket numbers 0-{MAX_BUCKET}, values counts")
        out[int(key)] = n
    if sum(out.values()) != requests:
        raise ValueError("buckets must count every request once")
    return RequestTally(requests, errors, out, _clients(data.get("clients", {}), requests, errors))


def _clients(data: object, requests: int, errors: int) -> dict[str, tuple[int, int]]:
    rule = (
        f"clients must map at most {MAX_CLIENTS} names of up to {MAX_CLIENT_CHARS} characters"
        " to [requests, errors], within the tally's own"
    )
    if not isinstance(data, Mapping) or len(data) > MAX_CLIENTS:
        raise ValueError(rule)
    out: dict[str, tuple[int, int]] = {}
    for client, counts in data.items():
        if (
            not isinstance(client, str)
            or not 0 < len(client) <= MAX_CLIENT_CHARS
            or not isinstance(counts, list)
            or len(counts) != 2
            or not all(_count(n) for n in counts)
            or not counts[1] <= counts[0] <= requests
            or counts[1] > errors
        ):
            raise ValueError(rule)
        out[client] = (counts[0], counts[1])
    return out


_BUCKET_KEYS = frozenset(str(k) for k in range(MAX_BUCKET + 1))


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


@attrs.frozen
class Verdict:
    """What the gates say of a step's numbers."""

    failed: str | None
    """The gate that failed, with its numbers (None: none failed)."""
    enough: bool
    """Both revisions answered ``min_requests`` in the step: a verdict can be given."""
    numbers: str
    """The numbers, as events and the status say them."""


#: How many standard errors of the difference the canary's error rate must exceed the stable's
#: plus the margin by: a gate judged on every report must not fail an identical release on noise
#: (at 10 % errors, 500 requests vary by 1.3 points).
ERROR_Z = 3.0


def _beyond_noise(canary: tuple[int, int], stable: tuple[int, int], allowed: float) -> bool:
    """Whether the canary's error rate (of its requests and errors) is above `allowed` by more
    than `ERROR_Z` standard errors of the difference of two rates (pooled, as a two-proportion
    z-test)."""
    (canary_requests, canary_errors), (stable_requests, stable_errors) = canary, stable
    pooled = (canary_errors + stable_errors) / (canary_requests + stable_requests)
    spread = math.sqrt(pooled * (1 - pooled) * (1 / canary_requests + 1 / stable_requests))
    return canary_errors / canary_requests - allowed > ERROR_Z * spread


def describe(side: str, tally: RequestTally) -> str:
    p99 = tally.quantile(0.99)
    shown = "-" if p99 is None else f"{p99 * 1000:.1f} ms"
    return (
        f"{side} {tally.requests} requests, {tally.errors} errors "
        f"({tally.error_rate:.1%}), p99 {shown}"
    )


def judge(config: CanaryConfig, canary: RequestTally, stable: RequestTally) -> Verdict:
    """The gates over one step's numbers: the canary's error rate at most the stable's plus
    ``max_error_rate_increase``, its p99 at most ``max_p99_ratio`` times the stable's (or
    ``p99_slack_s`` above it, whichever is more), once both answered ``min_requests``.

    No single client decides the error gate: each revision's rate is taken without the client
    that erred most on it, where it had others. A client that sends requests the app fails
    cannot so abort an identical release, nor hide a failing one by failing the stable's."""
    numbers = f"{describe('canary', canary)}; {describe('stable', stable)}"
    need = config.min_requests
    if canary.requests < need or stable.requests < need:
        return Verdict(None, False, numbers)
    *ours_counted, ours_left = canary.without_worst()
    *theirs_counted, theirs_left = stable.without_worst()
    for side, left, counted in (
        ("canary", ours_left, ours_counted),
        ("stable", theirs_left, theirs_counted),
    ):
        if left is not None:
            numbers += f"; the {side}'s {counted[0]} requests, {counted[1]} errors without {left}"
    requests, errors = ours_counted
    stable_requests, stable_errors = theirs_counted
    if requests and stable_requests:
        rate, stable_rate = errors / requests, stable_errors / stable_requests
        allowed = stable_rate + config.max_error_rate_increase
        if rate > allowed + 1e-12 and _beyond_noise(
            (requests, errors), (stable_requests, stable_errors), allowed
        ):
            return Verdict(
                f"error rate {rate:.1%} > stable {stable_rate:.1%} + "
                f"{config.max_error_rate_increase:.1%}",
                True,
                numbers,
            )
    ours, theirs = canary.quantile(0.99), stable.quantile(0.99)
    if ours is not None and theirs is not None:
        bound = max(theirs * config.max_p99_ratio, theirs + config.p99_slack_s)
        if ours > bound * (1 + 1e-9):
            return Verdict(
                f"p99 {ours * 1000:.1f} ms > {bound * 1000:.1f} ms (stable's "
                f"{theirs * 1000:.1f} ms x {config.max_p99_ratio:g}, or + "
                f"{config.p99_slack_s * 1000:g} ms)",
                True,
                numbers,
            )
    return Verdict(None, True, numbers)
