"""The documentation's code as written: every Python block of the README and of ``docs/`` is
run (a whole program) or, for a fragment (top-level ``await``, or a part of a program), parsed
with every import it makes resolved; every TOML block is read, and each backend in it checked
as a manifest's; every command line of a ``sh`` or ``console`` block that runs the CLI is
parsed by the CLI's own parser; every link to a file or a heading leads somewhere. The README's
walkthroughs run end to end elsewhere (test_readme_examples.py, test_canary_daemon.py,
test_readme.py); here each block is held to the code, quickly."""

from __future__ import annotations

import ast
import importlib
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from controller._cli.main import build_parser
from controller._sources import load_manifest

from ..documents import ROOT, Block, blocks, pages
from ..pristine import EXAMPLES

PYTHON = blocks("python")


def fragment(block: Block) -> bool:
    """A part of a program: ``await`` outside a function, or ``...`` where the reader puts
    their own."""
    try:
        compile(block.code, block.where, "exec")
    except SyntaxError:
        return True  # top-level await: parsed with it allowed below
    tree = ast.parse(block.code)
    return any(isinstance(n, ast.Constant) and n.value is Ellipsis for n in ast.walk(tree))


def test_the_documentation_has_the_blocks_it_is_known_for() -> None:
    # A change to how blocks are found must not leave the tests below with nothing to check.
    assert len(PYTHON) >= 11
    assert sum(not fragment(b) for b in PYTHON) >= 6


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.where)
def test_every_python_block_parses_and_its_imports_resolve(block: Block) -> None:
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT | ast.PyCF_ONLY_AST
    tree = compile(block.code, block.where, "exec", flags=flags)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{block.where}: {node.module}.{alias.name}"


@pytest.mark.parametrize("block", [b for b in PYTHON if not fragment(b)], ids=lambda b: b.where)
def test_every_whole_python_program_runs_as_written(block: Block, tmp_path: Path) -> None:
    """Run in a directory of its own beside a copy of the examples (the paths the pages use)."""
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    (tmp_path / "snippet.py").write_text(block.code)
    result = subprocess.run(
        [sys.executable, "snippet.py"],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"{block.where}:\n{result.stderr.decode()}"


@pytest.mark.parametrize("block", blocks("toml"), ids=lambda b: b.where)
def test_every_toml_block_reads_and_its_backends_are_valid(block: Block, tmp_path: Path) -> None:
    data = tomllib.loads(block.code)
    backends = data.get("backends", {})
    whole = {name: b for name, b in backends.items() if "entrypoint" in b}
    if not whole:
        return  # a part of a backend (its retries, an application's members): read above
    file = tmp_path / "manifest.toml"
    file.write_text(block.code)
    manifest = load_manifest(file)
    assert {b.name for b in manifest.backends} >= set(whole)


def _command_lines() -> list[tuple[str, list[str]]]:
    """Each command that runs the CLI: in ``sh`` blocks every line, in ``console`` blocks those
    after ``$`` (the others are what the command printed)."""
    found = []
    for block in blocks("sh", "console"):
        for line in block.code.replace("\\\n", " ").splitlines():
            if block.language == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            lexer.commenters = "#"
            command: list[str] = []
            for word in [*lexer, ";"]:
                if word not in ("&&", ";", "||", "|", "&"):
                    command.append(word)
                    continue
                if command[:3] == ["python3", "-m", "controller"]:
                    found.append((block.where, command[3:]))
                elif command[:1] == ["controller"]:
                    found.append((block.where, command[1:]))
                command = []
    return found


COMMANDS = _command_lines()


def test_the_documentation_has_the_commands_it_is_known_for() -> None:
    assert len(COMMANDS) >= 30


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=lambda x: x if isinstance(x, str) else "")
def test_every_cli_command_in_the_documentation_parses(where: str, argv: list[str]) -> None:
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{where}: `controller {shlex.join(argv)}` does not parse (exit {exc.code})")


def _slug(heading: str) -> str:
    """The anchor GitHub makes of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_to_a_file_or_a_heading_leads_somewhere() -> None:
    broken = []
    for path in pages():
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            goal = (path.parent / file).resolve() if file else path
            if not goal.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
                continue
            if anchor and goal.suffix == ".md":
                headings = re.findall(r"(?m)^#+ (.+)$", goal.read_text())
                if anchor not in {_slug(h) for h in headings}:
                    broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert broken == []


def test_the_readme_s_first_screen_is_the_two_commands_and_what_to_drive() -> None:
    """What a newcomer met: a 1,700-line README whose first screen packed adoption, merge
    semantics, standbys and Linux into one paragraph. The depth is in docs/, one page a
    subject, each linked from the README."""
    readme = pages()[0].read_text()
    first = readme.splitlines()[:70]
    assert "python3 -m pip install nox && python3 -m nox -s tests   # the tests" in "\n".join(first)
    assert any(line.startswith("curl '127.0.0.1:8000/hello?name=you'") for line in first)
    assert len(readme.splitlines()) < 250
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", readme))
    assert {p.name for p in pages()[1:]} <= linked
