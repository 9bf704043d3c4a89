"""A canary release's split of a backend's requests at the ingress: which revision a request
goes to, by weight, by a sticky hash of a header or cookie, or as a forcing header says; and
what the ingress counts of each revision for the controller's gates.

The controller tells the split in the backend's snapshot (``traffic``, the canary's weight and
the two revisions' versions) and its config (``canary``: the sticky and forcing headers).
"""

from __future__ import annotations

import contextvars
import random
import zlib
from collections.abc import Sequence
from typing import Literal

import attrs

from .policy import cookie_value, header_value

#: Where a request went among its backend's revisions: of a canary release's split, ``canary``
#: or ``stable``; in a rolling update, the ``new`` version's replicas or the ``old`` ones.
Side = Literal["canary", "stable", "new", "old"]
_SIDES: dict[bytes, Side] = {b"canary": "canary", b"stable": "stable", b"new": "new", b"old": "old"}

#: The side a request reached: the ingress and a handle tell the replica, and the calls its
#: handler makes keep to the same side of their callees (a canary's request meets canaries
#: downstream, a new replica's request new ones).
SIDE_HEADER = b"x-controller-side"
#: The side the request a handler serves went to (set by a replica's server around each
#: handler, from `SIDE_HEADER`); a handle's call inherits it. None: no split chose one.
current_side: contextvars.ContextVar[Side | None] = contextvars.ContextVar(
    "controller_request_side", default=None
)


def side_of_header(value: bytes) -> Side | None:
    return _SIDES.get(value)


def reached_side(split: Split | None, new_version: str, version: str) -> Side | None:
    """The side a request on a replica of `version` reached: of a canary's `split`, the
    canary's or the stable's revision; in a rolling update (no split, `new_version` given), the
    new version's or an old one's; None when every replica runs one version. The replica is
    told it, and the calls its handler makes keep to the same side of their callees."""
    if split is not None:
        return split.side_of(version)
    if not new_version:
        return None
    return "new" if version == new_version else "old"


def callee_side(inherited: Side | None, split: Split | None) -> Side | None:
    """The side of a callee an inherited side keeps to. A callee's canary takes only a
    canary's requests as its own (not a rolling update's new replicas': a caller's rollout must
    not pour its traffic onto a callee's canary at 5 %); a callee's rolling update takes a
    canary's as the new version's (a promoted canary's revision is the new one)."""
    if inherited is None:
        return None
    if split is not None:
        return inherited if inherited in ("canary", "stable") else None
    return {"canary": "new", "stable": "old"}.get(inherited, inherited)  # type: ignore[return-value]


@attrs.frozen
class Split:
    """How one backend's requests are split now."""

    canary_version: str
    stable_version: str
    weight: float
    """The canary's percent of requests."""
    sticky_header: bytes | None = None
    """A header name (lower case) whose value picks the revision by hash."""
    sticky_cookie: bytes | None = None
    force_header: bytes | None = None
    """A header name whose value ``canary`` or ``stable`` picks the revision."""

    def side_of(self, version: str) -> Side | None:
        if version == self.canary_version:
            return "canary"
        return "stable" if version == self.stable_version else None


def choose_side(split: Split, headers: Sequence[tuple[bytes, bytes]], rng: random.Random) -> Side:
    """Where one request goes. A forcing header wins (not toward a canary at weight 0: that
    one was aborted); then a sticky header or cookie, hashed to a point in 0-100 that goes to
    the canary below its weight, so that a client on the canary stays there as the weight
    grows; else a draw."""
    weight = split.weight
    if split.force_header is not None and weight > 0:
        forced = header_value(headers, split.force_header)
        if forced is not None:
            value = forced.strip().lower()
            if value == b"canary":
                return "canary"
            if value == b"stable":
                return "stable"
    key = None
    if split.sticky_header is not None:
        key = header_value(headers, split.sticky_header)
    if key is None and split.sticky_cookie is not None:
        key = cookie_value(headers, split.sticky_cookie)
    point = (zlib.crc32(key) % 10_000) / 100 if key else rng.random() * 100
    return "canary" if point < weight else "stable"
