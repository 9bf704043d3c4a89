"""Text from replicas (their output, errors and tracebacks) made safe to show on a terminal or
write into a log line."""

from __future__ import annotations

import re

#: What a replica's output may not send to the terminal as it is: C0 controls but tab and
#: newline (escape sequences start with ESC), DEL, C1 controls, the bidi controls that make a
#: line read other than it is (Trojan Source), the line and paragraph separators (a line break
#: to editors and to Python's splitlines), and the invisible characters that hide text or
#: make two different names look alike (the zero-width space, word joiner and invisible
#: operators, the byte-order mark, the tag characters, soft hyphen). The zero-width joiner and
#: non-joiner stay: emoji sequences and Persian and Indic scripts need them.
UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u061c\u200b\u200e\u200f\u2028-\u202e\u2060-\u2069"
    "\ufeff\U000e0000-\U000e007f]"
)


def safe_text(text: str) -> str:
    """`text` with every control a terminal would act on shown as an escape (``\x1b``)."""
    return UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


#: The same, and the newline and carriage return: a log line holds one record, so a replica's
#: error cannot forge another.
_UNSAFE_IN_A_LINE = re.compile(f"[\n\r]|{UNSAFE.pattern}")


def one_line(text: str) -> str:
    """`text` as `safe_text` shows it, with newlines escaped too."""
    return _UNSAFE_IN_A_LINE.sub(lambda m: m.group().encode("unicode_escape").decode(), text)
