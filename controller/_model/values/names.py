"""What a backend's name may be: it becomes store keys and replica tag prefixes, so it is kept
plain. Written as an ASCII pattern, once, for the checks and the API's JSON Schema alike."""

from __future__ import annotations

import re

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"
NAME = re.compile(NAME_PATTERN)
