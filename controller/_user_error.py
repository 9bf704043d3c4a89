"""How both replica hosts (the LocalRuntime worker, the Ray actor) report the user's exception.

Kept free of heavy imports, because every replica process imports it.
"""

from __future__ import annotations

#: Bounds on what one error reply carries: a message goes into one-line statuses, and a reply
#: must stay far below the wire's line limit, whatever the user's code raised.
MAX_MESSAGE = 2000
MAX_TRACEBACK = 32_000


def describe_error(exc: BaseException, traceback: str) -> dict[str, str]:
    """The user's exception as data: its type, its message and its traceback (the end of it,
    which names the failing line, if it is too long)."""
    message = str(exc)
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + "..."
    if len(traceback) > MAX_TRACEBACK:
        traceback = "...\n" + traceback[-MAX_TRACEBACK:]
    return {"error_type": type(exc).__name__, "message": message, "traceback": traceback}
