"""The documentation as the tests read it: the README and the pages of ``docs/``, and the code
blocks in them, each with where it stands."""

from __future__ import annotations

import re
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    """The README first, then every page of ``docs/``."""
    return [README, *sorted(DOCS.glob("*.md"))]


def all_text() -> str:
    return "\n".join(page.read_text() for page in pages())


def page(name: str) -> str:
    """The page ``docs/<name>``."""
    return (DOCS / name).read_text()


@attrs.frozen
class Block:
    path: Path
    line: int
    language: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(*languages: str) -> list[Block]:
    """Every fenced code block of `languages` in the documentation, in order."""
    found = []
    for path in pages():
        text = path.read_text()
        for match in re.finditer(r"```(\w+)\n(.*?)```", text, re.DOTALL):
            if match.group(1) in languages:
                line = text.count("\n", 0, match.start()) + 1
                found.append(Block(path, line, match.group(1), match.group(2)))
    return found
