"""Wrong tokens, counted per client address: how long to hold each answer, when to refuse at
once, and what to log. Pure: plain values in, plain values out (``throttle`` feeds it trio's
time and carries its verdicts out).

The right token is never held up: it is checked before anything here is asked, so no one's
wrong guesses slow or lock out the real user, who on a daemon bound to loopback shares the
address 127.0.0.1 with every other local client (its own ingress processes among them). What
this bounds is a client that waits for its answers: past a few free failures, each wrong token
is answered only after a delay that doubles, up to a ceiling; and a client that does not wait
(many requests at once) is refused with 429 beyond a few answers held. Such a client still
learns at once when a guess is right, which no limit can stop without also holding up the
right token; against it stands the token itself (256 random bits).
"""

from __future__ import annotations

import math
from typing import final

import attrs

#: Failures an address may make in a row before its answers are held (typos, a stale token).
FREE_FAILURES = 5
#: The first held answer's delay; each further failure doubles it, up to `MAX_DELAY_S`.
FIRST_DELAY_S = 0.1
MAX_DELAY_S = 2.0
#: Answers held at once for one address; a failure beyond them is refused at once (429).
MAX_HELD = 8
#: An address with no failure for this long starts afresh.
FORGET_S = 600.0
#: Addresses kept at most; beyond, the one whose last failure is oldest is forgotten.
MAX_ADDRESSES = 4096
#: One log line per address per interval, beside the first failure's own.
SUMMARY_S = 60.0


@attrs.frozen
class Verdict:
    """What to do with one wrong token."""

    delay_s: float
    """Hold the 401 this long (0: answer at once)."""
    refused: bool
    """Answer 429 at once instead: the address has `MAX_HELD` answers held already."""
    retry_after_s: int
    """For the 429's Retry-After: the delay a failure gets now, rounded up."""
    first: bool
    """The first failure of the address in a while: log it now (the rest go in summaries)."""


@attrs.define
class _Address:
    failures: int
    """In a row: none of them `FORGET_S` after the one before."""
    last: float
    held: int = 0
    window_start: float | None = None
    """When the summary interval under way began (None: none is; the next failure is logged)."""
    in_window: int = 0
    """Failures in that interval, the first one logged included."""
    refused: int = 0
    longest_s: float = 0.0


@final
@attrs.define
class FailureTable:
    """Failures per client address, bounded: `max_addresses` at most, each forgotten
    `forget_s` after its last failure (and once its answers are out and its count logged)."""

    free: int = FREE_FAILURES
    first_delay_s: float = FIRST_DELAY_S
    max_delay_s: float = MAX_DELAY_S
    max_held: int = MAX_HELD
    forget_s: float = FORGET_S
    max_addresses: int = MAX_ADDRESSES
    summary_s: float = SUMMARY_S
    _addresses: dict[str, _Address] = attrs.field(factory=dict, init=False)
    _lines: list[str] = attrs.field(factory=list, init=False)
    """Summaries due, taken by `due`."""
    _due_at: float | None = attrs.field(default=None, init=False)
    """No interval ends before this (None: none is under way): `due` scans the addresses only
    then, so that a failure costs the same however many addresses are kept."""

    def __len__(self) -> int:
        return len(self._addresses)

    def failed(self, address: str, now: float) -> Verdict:
        """A wrong token from `address` at `now`. If the verdict is not a refusal, the answer
        is held: call `released` once it is out."""
        entry = self._addresses.pop(address, None)
        if entry is None or now - entry.last >= self.forget_s:
            if entry is not None:
                self._summarize(address, entry, now)
            entry = _Address(failures=0, last=now)
        # Last in the dict: the oldest failure is first, for `_forget` to drop.
        self._addresses[address] = entry
        entry.failures += 1
        entry.last = now
        delay = self.delay_s(entry.failures)
        refused = delay > 0 and entry.held >= self.max_held
        first = entry.window_start is None
        if first:
            entry.window_start = now
            end = now + self.summary_s
            self._due_at = end if self._due_at is None else min(self._due_at, end)
        entry.in_window += 1
        if refused:
            entry.refused += 1
        else:
            entry.held += 1
            entry.longest_s = max(entry.longest_s, delay)
        self._forget(now)
        return Verdict(delay, refused, max(1, math.ceil(delay)), first)

    def released(self, address: str) -> None:
        """A held answer is out (or its request gone)."""
        entry = self._addresses.get(address)
        if entry is not None and entry.held > 0:
            entry.held -= 1

    def delay_s(self, failures: int) -> float:
        """How long the answer to the `failures`-th failure in a row is held."""
        if failures <= self.free:
            return 0.0
        # Capped before the power: a long run of failures must not overflow the float.
        doublings = min(failures - self.free - 1, 64)
        return min(self.first_delay_s * 2.0**doublings, self.max_delay_s)

    def next_due(self) -> float | None:
        """When the next summary may be due (None: no interval is under way)."""
        return self._due_at

    def due(self, now: float, *, all_now: bool = False) -> list[str]:
        """The summary lines of the intervals that ended by `now` (with `all_now`, of every
        interval under way: the daemon is stopping). An interval with no failure past its first
        (logged already) ends without a line, and the next failure is logged at once."""
        if all_now or (self._due_at is not None and now >= self._due_at):
            self._due_at = None
            for address, entry in list(self._addresses.items()):
                start = entry.window_start
                if start is not None and (all_now or now >= start + self.summary_s):
                    self._summarize(address, entry, now)
                if entry.window_start is not None:
                    end = entry.window_start + self.summary_s
                    self._due_at = end if self._due_at is None else min(self._due_at, end)
        self._forget(now)
        lines, self._lines = self._lines, []
        return lines

    def _summarize(self, address: str, entry: _Address, now: float) -> None:
        start = entry.window_start
        if start is not None and entry.in_window > 1:
            span = now - start
            line = f"{entry.in_window} failed logins from {address} in the last {span:.0f} s"
            how = [f"answers held up to {entry.longest_s:g} s"] if entry.longest_s else []
            how += [f"{entry.refused} refused with 429"] if entry.refused else []
            self._lines.append(line + (f" ({', '.join(how)})" if how else ""))
            # Another interval begins: one line per interval while failures go on.
            entry.window_start = now
        else:
            entry.window_start = None
        entry.in_window = entry.refused = 0
        entry.longest_s = 0.0

    def _forget(self, now: float) -> None:
        """Drop addresses quiet for `forget_s` (their answers out, their count logged), then
        the oldest beyond `max_addresses` (its count logged first)."""
        # Ordered by last failure: the first young one (or one with an answer still held,
        # which a delay far shorter than `forget_s` makes young anyway) ends the look.
        while self._addresses:
            address, entry = next(iter(self._addresses.items()))
            if now - entry.last < self.forget_s or entry.held:
                break
            self._summarize(address, entry, now)
            del self._addresses[address]
        while len(self._addresses) > self.max_addresses:
            address = next(iter(self._addresses))
            self._summarize(address, self._addresses.pop(address), now)
