"""The terms the API's schemas are written in (``schemas`` and the modules it gathers): a
reference, an object that takes no other property, the common types, a change's message."""

from __future__ import annotations

from typing import Any

from .._model.config.cause import MAX_MESSAGE
from .._model.records.revisions import STARTED_WITH


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(required: dict[str, Any], **optional: Any) -> dict[str, Any]:
    """An object with exactly these properties (those in `required` always present)."""
    return {
        "type": "object",
        "required": list(required),
        "properties": {**required, **optional},
        "additionalProperties": False,
    }


STRING = {"type": "string"}
INT = {"type": "integer"}
COUNT = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
BOOL = {"type": "boolean"}
NULLABLE_STRING = {"type": ["string", "null"]}
#: One line of text: no control characters (Cause's rule for its message and manifest).
ONE_LINE = r"^[^\x00-\x1f\x7f]*$"
MESSAGE_TEXT = {"type": "string", "maxLength": MAX_MESSAGE, "pattern": ONE_LINE}
SAYS = (
    "What the person says of the change, kept in the revision it makes (one line, at most "
    f"{MAX_MESSAGE} characters)"
)
MESSAGE = {**MESSAGE_TEXT, "type": ["string", "null"], "description": SAYS}
#: Who asks, over HTTP: a client of the API, or the CLI through it.
#: What changes how replicas start under the version they run (``Revision.same_version``).
SAME_VERSION = {
    "type": "array",
    "items": {"enum": list(STARTED_WITH)},
    "description": "What changes how replicas start under the version they run: the replicas "
    "running keep the old, new ones get the new (a new version replaces them)",
}
VIA_HTTP = {"enum": ["api", "cli"], "description": "Who asks: `api` (the default) or `cli`"}
