"""What the core tells an observer (the daemon's metrics) about its own work.

Runtime and store timings need no hook: an observer wraps the runtime and the store. Only what
happens inside a backend's loop is reported from here.
"""

from __future__ import annotations

from typing import Protocol


class Observer(Protocol):
    """Called from the backend loops; must return at once and never raise."""

    def events_handled(self, backend: str, count: int, latency_s: float) -> None:
        """A pass of `backend`'s loop handled `count` events; `latency_s` is the time from the
        loop taking the first of them to every action of the pass being launched (trio time)."""
        ...

    def failure(self, backend: str, kind: str) -> None:
        """A replica of `backend` failed: `kind` is StartFailed, Died, Unhealthy or
        ReconfigureFailed."""
        ...

    def late_checks(self, backend: str, count: int) -> None:
        """`count` health checks of `backend` came due while the one before was unanswered:
        each fails as late, without a call to the runtime (which times only the calls)."""
        ...

    def autoscaled(self, backend: str, before: int, after: int) -> None:
        """`backend`'s autoscaler changed its replica count from `before` to `after`."""
        ...

    def unknown_load(self, backend: str, count: int) -> None:
        """A load report named `count` replicas `backend` does not have: dropped."""
        ...

    def rollout(self, backend: str, outcome: str) -> None:
        """A rollout of `backend` ended: `outcome` is complete or failed."""
        ...

    def forgotten(self, backend: str) -> None:
        """`backend` was deleted: whatever is kept per backend can go."""
        ...


class NullObserver:
    """Observes nothing: the default."""

    def events_handled(self, backend: str, count: int, latency_s: float) -> None:
        pass

    def failure(self, backend: str, kind: str) -> None:
        pass

    def late_checks(self, backend: str, count: int) -> None:
        pass

    def autoscaled(self, backend: str, before: int, after: int) -> None:
        pass

    def unknown_load(self, backend: str, count: int) -> None:
        pass

    def rollout(self, backend: str, outcome: str) -> None:
        pass

    def forgotten(self, backend: str) -> None:
        pass
