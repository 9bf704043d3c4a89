"""The README against the code: every reason the code can give is listed; every example it
names is shipped (tests/house/test_examples.py runs them)."""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

import pytest

from controller import BackendReason
from controller._model.decisions.autoscale import ScaleReason
from controller._sources import load_manifest

from ..documents import all_text
from ..pristine import EXAMPLES

ROOT = Path(__file__).parent.parent.parent
#: The README and the pages of docs/, which the README links to.
README = all_text()


def reason_aliases() -> dict[str, tuple[str, ...]]:
    """Every ``...Reason = Literal[...]`` in the package, read from the source: a new kind of
    reason is found without this test being told of it. (mypy holds the code to these
    aliases: a reason outside them does not type-check.)"""
    found = {}
    for path in sorted((ROOT / "controller").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.endswith("Reason")
                and isinstance(node.value, ast.Subscript)
                and ast.unparse(node.value.value) in ("Literal", "typing.Literal")
            ):
                values = ast.literal_eval(node.value.slice)
                found[node.targets[0].id] = values if isinstance(values, tuple) else (values,)
    return found


def test_the_source_holds_the_reasons_the_package_exports() -> None:
    aliases = reason_aliases()
    assert aliases["BackendReason"] == typing.get_args(BackendReason)
    assert aliases["ScaleReason"] == typing.get_args(ScaleReason)


def test_every_reason_the_code_can_give_is_in_the_readme() -> None:
    missing = [
        f"{alias}: {reason}"
        for alias, reasons in reason_aliases().items()
        for reason in reasons
        if f"`{reason}`" not in README
    ]
    assert missing == []


def test_every_example_the_readme_names_is_shipped() -> None:
    named = set(re.findall(r"\bexamples/[\w./-]*\w", README))
    assert "examples/broken.toml" in named
    assert sorted(path for path in named if not (ROOT / path).is_file()) == []


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_every_example_manifest_is_valid_and_its_code_is_shipped_beside_it(path: Path) -> None:
    manifest = load_manifest(path)
    for backend in manifest.backends:
        module = backend.replica_config.entrypoint.partition(":")[0]
        assert (EXAMPLES / f"{module.replace('.', '/')}.py").is_file(), backend.name


def test_the_readme_says_how_to_deploy_code_from_a_directory_of_ones_own() -> None:
    # Where a ModuleNotFoundError's hint sends the user: --pythonpath is the daemon's, so a
    # directory of one's own takes a restart with it added.
    own = README.split("**Your own code.**", 1)[1].split("\n\n", 1)[0]
    assert "--pythonpath" in own
    assert "restart the daemon with it added" in own
    assert "ModuleNotFoundError" in own


def test_the_readmes_fakeruntime_test_runs_as_written(tmp_path: Path) -> None:
    """Found by a newcomer: the README's test for FakeRuntime missed its imports and the
    pytest-trio mode it needs. It runs here as written, in a project of its own."""
    import subprocess
    import sys

    blocks = re.findall(r"```python\n(.*?)```", README, re.DOTALL)
    (snippet,) = [b for b in blocks if "def test_ignored_drain_is_killed_at_the_deadline" in b]
    (tmp_path / "test_drain.py").write_text(snippet)
    (tmp_path / "pytest.ini").write_text("[pytest]\ntrio_mode = true\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert b"1 passed" in result.stdout


def test_the_readmes_asyncio_snippet_runs_as_written(tmp_path: Path) -> None:
    """Found by a newcomer: the asyncio snippet named a runtime, a store and configs it never
    made. It runs here as written."""
    import subprocess
    import sys

    blocks = re.findall(r"```python\n(.*?)```", README, re.DOTALL)
    (snippet,) = [b for b in blocks if "open_in_guest_mode(runtime=runtime" in b]
    (tmp_path / "app.py").write_text(snippet)
    result = subprocess.run(
        [sys.executable, "app.py"], cwd=tmp_path, capture_output=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().strip() == "BackendState.HEALTHY"
