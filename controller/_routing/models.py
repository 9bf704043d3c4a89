"""Model multiplexing as routers and replicas both speak it: the header a request names its model
in, the header a multiplexed replica's every answer says what it holds in, and the rule by
which a model hot enough spreads to more replicas. Pure: no trio, no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from .._http.errors import Reply
from .._model.records.multiplexing import MODEL_ID as _MODEL_ID
from .._model.records.multiplexing import MODEL_ID_RULE as MODEL_ID_RULE
from .._model.records.multiplexing import Held as Held

#: A request's model (Ray Serve's ``serve_multiplexed_model_id``): routed to a replica that holds
#: it, and what ``controller.model_id()`` returns in its handler.
MODEL_HEADER: Final = b"x-model-id"
#: Set by a multiplexed replica on each answer: ``<generation> <capacity> <model> ...``. Routers
#: read it (and take it off before the client sees the answer).
HELD_HEADER: Final = b"x-replica-models"
#: A model goes to a replica that does not hold it once every holder has this fraction of its
#: backend's max_ongoing_requests in flight from this router (at least one request): a hot
#: model spreads, and the replica it spreads to loads it.
SPREAD_FRACTION: Final = 0.5


def model_id_problem(value: object) -> str | None:
    """Why `value` is not a model's id (None if it is one)."""
    if not isinstance(value, str):
        return f"must be a string ({MODEL_ID_RULE}), not {type(value).__name__}"
    if _MODEL_ID.fullmatch(value) is None:
        shown = value if len(value) <= 40 else value[:40] + "..."
        return f"must be {MODEL_ID_RULE} (got {shown!r})"
    return None


def model_of(value: bytes) -> str | None:
    """The model a request's `MODEL_HEADER` names; None if it is not a model's id."""
    try:
        text = value.decode("ascii")
    except UnicodeDecodeError:
        return None
    return text if _MODEL_ID.fullmatch(text) is not None else None


def requested_model(headers: Sequence[tuple[bytes, bytes]]) -> str | None:
    """The model a request names (None: it names none). Raises `Reply` (400) for a
    `MODEL_HEADER` that is not a model's id, before it is routed anywhere."""
    for name, value in headers:
        if name == MODEL_HEADER:
            model = model_of(value.strip(b" \t"))
            if model is None:
                message = f"x-model-id: must be {MODEL_ID_RULE} (got {shown_value(value)})"
                raise Reply(400, "BadModelId", message)
            return model
    return None


def shown_value(value: bytes) -> str:
    """A header's value as an error message quotes it: its first 40 bytes, as UTF-8 (what
    was meant), marked if cut."""
    shown = repr(value[:40].decode("utf-8", "replace"))
    return shown + " (cut)" if len(value) > 40 else shown


def take_header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The value of header `name` in an answer's `headers`, taken out of them (the last one
    looked at first: a replica's server adds it last); None if there is none."""
    for index in range(len(headers) - 1, -1, -1):
        if headers[index][0] == name:
            return headers.pop(index)[1]
    return None


def parse_held(value: bytes) -> Held | None:
    """A `HELD_HEADER` value read back; None if it is not one (a replica of someone else's)."""
    try:
        parts = value.decode("ascii").split(" ")
        generation, capacity = int(parts[0]), int(parts[1])
    except (UnicodeDecodeError, ValueError, IndexError):
        return None
    named = parts[2:]
    models = frozenset(m.removeprefix("~") for m in named)
    if generation < 0 or capacity < 1 or len(models) > 10_000:
        return None
    if any(_MODEL_ID.fullmatch(m) is None for m in models):
        return None
    loading = frozenset(m[1:] for m in named if m.startswith("~"))
    return Held(generation, capacity, models, loading)


def spreads_at(max_ongoing: int) -> int:
    """The requests in flight to each holder from which a model goes to another replica."""
    return max(1, int(max_ongoing * SPREAD_FRACTION))
