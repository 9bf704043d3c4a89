"""The controller's errors: one base class, permanent or retryable, messages that say what to do."""

from __future__ import annotations

from typing import ClassVar


class ControllerError(Exception):
    """Base class of every error the controller raises on purpose."""

    #: Whether doing the same thing again later may succeed without a change of input.
    retryable: ClassVar[bool] = False


class ConfigError(ControllerError, ValueError):
    """Bad input: names the field and the rule it broke. Raised before anything is written."""

    def __init__(self, field: str, rule: str, value: object = None, *, show_value: bool = True):
        self.field = field
        self.rule = rule
        self.value = value
        shown = _short_repr(value)
        got = f" (got {shown})" if show_value else ""
        super().__init__(f"{field}: {rule}{got}")


def _short_repr(value: object, limit: int = 120) -> str:
    # Values come from users and attackers: a 400-digit number must not become the message.
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's digit limit for str()
        return f"<{type(value).__name__} too large to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class UnknownBackendError(ControllerError, LookupError):
    """A call named a backend the controller does not have."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(
            f"backend {name!r} is not deployed (`controller status` lists those that are)"
        )

    def __str__(self) -> str:
        # LookupError's str() would quote the whole message as a repr.
        return str(self.args[0])


class UnknownApplicationError(ControllerError, LookupError):
    """A call named an application the controller does not have."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(
            f"application {name!r} is not applied (`controller status` lists those that are)"
        )

    def __str__(self) -> str:
        return str(self.args[0])


class InfeasibleError(ControllerError):
    """The runtime cannot place the replicas a deploy asks for; nothing was written or started."""


class RouteConflictError(ControllerError):
    """A deploy gives a backend a route another backend has; nothing was written. Each route
    leads to one backend: delete the other's route first (or in the same apply)."""


class GoalFailed(ControllerError):
    """A goal will not be reached: for a deploy, replicas kept failing to start."""

    retryable = True

    def __init__(self, backend: str, reason: str, traceback: str | None = None):
        self.backend = backend
        self.reason = reason
        self.traceback = traceback
        """The replica's own traceback of the last failure, where its runtime reported one."""
        super().__init__(f"backend {backend!r}: {reason}")


class CheckpointError(ControllerError):
    """The store holds a checkpoint this controller cannot read; the data was left untouched."""


class ControllerClosedError(ControllerError):
    """The controller was closed while the call was waiting."""


class ReplicaError(ControllerError):
    """A runtime's report that one replica failed: its start, or a call into the user's class.

    `error_type` and `message` carry the user's exception (``ValueError`` and its text) so that the
    goal and the status can show it.
    """

    retryable = True

    def __init__(self, tag: str, error_type: str, message: str, traceback: str | None = None):
        self.tag = tag
        self.error_type = error_type
        self.message = message
        self.traceback = traceback
        """The user's traceback as text, where the runtime has it (None otherwise)."""
        super().__init__(f"replica {tag}: {error_type}: {message}")

    @property
    def summary(self) -> str:
        """The user's error as ``Type: message``, without the replica tag."""
        return f"{self.error_type}: {self.message}"


class ReplicaGoneError(ReplicaError):
    """The runtime does not have the named replica (it died, or was never started)."""

    def __init__(self, tag: str, message: str = "the runtime has no such replica"):
        super().__init__(tag, "ReplicaGone", message)


class StoreError(ControllerError):
    """The store failed to read or write; nothing in that write landed. The message keeps the
    store's own error (``disk I/O error``, ``database is locked``...)."""

    retryable = True


class StartupError(ControllerError):
    """The daemon cannot start: its state dir is unsafe or in use, its address is taken, its
    store cannot be opened. The message is one line that names what and what to do; nothing was
    changed, and no replica was touched."""


class ManifestError(ControllerError, ValueError):
    """A declared set of backends (a config file, an apply request) is wrong; `problems` lists
    every fault found, each naming where, which backend and which field. Nothing was applied."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        listing = "\n".join(f"  - {p}" for p in problems)
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"{len(problems)} {noun} in {source}; nothing was applied:\n{listing}")


class RolloutError(ControllerError):
    """A rollout command (undo, pause, resume) cannot be done as asked; nothing was written.
    `reason` says why in one word: ``UnknownRevision``, ``NoGoodRevision``, ``Paused``,
    ``Deleting`` or ``CodeChanged``."""

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(message)


class CodeChangedError(RolloutError):
    """An undo would run today's code under an old revision's name: the entrypoint's source on
    disk is not what the revision recorded. Pass ``force`` to undo anyway."""

    def __init__(self, message: str):
        super().__init__("CodeChanged", message)


class FencedError(ControllerError):
    """A newer leader has taken over: the store or a replica refused a command from this
    controller's `epoch`, which is no longer the newest. Nothing of the command took effect; a
    controller that meets this stops acting at once and steps down."""

    def __init__(self, what: str, epoch: int, newer: int | None = None):
        self.what = what
        self.epoch = epoch
        self.newer = newer
        """The epoch that fenced it, where the refuser said."""
        by = f" (epoch {newer} leads now)" if newer is not None else ""
        super().__init__(
            f"{what}: refused, epoch {epoch} is no longer the leader's{by}; this controller "
            "steps down"
        )


class UnknownNodeError(ControllerError, LookupError):
    """A call named a node the runtime does not have (or, by a prefix, several)."""

    def __str__(self) -> str:
        return str(self.args[0])


class NodesUnsupportedError(ControllerError):
    """A call about nodes, to a controller whose runtime has no nodes of its own to tell apart
    (LocalRuntime: one machine)."""
