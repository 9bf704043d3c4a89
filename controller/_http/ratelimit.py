"""Warnings that a client can cause, at most one a period per kind: a flood of bad requests
must not become a flood of log lines (their counts are in the metrics)."""

from __future__ import annotations

import logging
from typing import final

import trio

#: At most one line per kind of warning this often; the next says how many were left out.
PERIOD_S = 10.0


@final
class RateLimitedLog:
    def __init__(self, logger: logging.Logger, period_s: float = PERIOD_S):
        self.logger = logger
        self.period_s = period_s
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def warn(self, kind: str, message: str, *args: object, exc_info: bool = False) -> None:
        """Log `message` at warning, unless a warning of `kind` was logged within the period."""
        now = trio.current_time()
        if now - self._last.get(kind, -self.period_s) < self.period_s:
            self._quiet[kind] = self._quiet.get(kind, 0) + 1
            return
        self._last[kind] = now
        left_out = self._quiet.pop(kind, 0)
        if left_out:
            message += " (and %d more like it in the last %gs)"
            args = (*args, left_out, self.period_s)
        if len(self._last) > 1000:
            self._last.clear()  # kinds name backends: bounded, should a client vary them
        self.logger.warning(message, *args, exc_info=exc_info)
