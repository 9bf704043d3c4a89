"""The examples the tests run: a pristine copy, not the working tree's.

The README invites its reader to edit ``examples/backends.toml`` and ``examples/echo_replica.py``
and to run the tests beside the daemon; tests that read those files from the working tree then
failed, and read as "the project is broken". So when ``examples/`` differs from the commit
checked out (``git status``), the tests run the committed copy, extracted once per commit into
the temp dir; otherwise (no edits, no git, not a checkout) the working tree's.
``CONTROLLER_TEST_EXAMPLES=worktree`` runs the working tree's whatever it holds: for someone
changing the examples themselves.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).parent.parent
WORKTREE = ROOT / "examples"


def _git(*args: str) -> bytes | None:
    try:
        result = subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, check=False, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None


def _edited() -> str | None:
    """The commit checked out, if the working tree's examples differ from it (else None)."""
    if os.environ.get("CONTROLLER_TEST_EXAMPLES") == "worktree":
        return None
    changes = _git("status", "--porcelain", "--", "examples")
    commit = _git("rev-parse", "HEAD")
    if not changes or not commit:
        return None
    return commit.decode().strip()


def _pristine(commit: str) -> Path:
    """The examples of `commit`, extracted once into the temp dir (shared by the test
    processes: each extracts into a dir of its own and renames it into place)."""
    target = Path(tempfile.gettempdir()) / f"controller-examples-{commit[:12]}"
    if (target / "examples").is_dir():
        return target / "examples"
    archive = _git("archive", "--format=tar", commit, "examples")
    if archive is None:
        return WORKTREE
    staging = Path(tempfile.mkdtemp(prefix="controller-examples-"))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(staging, filter="data")
    try:
        staging.rename(target)
    except OSError:  # another test process put it there first
        shutil.rmtree(staging, ignore_errors=True)
    return target / "examples"


_COMMIT = _edited()
#: The examples directory the tests use.
EXAMPLES = WORKTREE if _COMMIT is None else _pristine(_COMMIT)
#: Where a README command's ``examples/...`` paths are read from (its working directory).
EXAMPLES_ROOT = EXAMPLES.parent
#: Said in the test run's header when the copy is not the working tree's.
NOTICE = (
    None
    if EXAMPLES == WORKTREE
    else f"examples/ has local edits: the tests run the committed copy ({EXAMPLES}); "
    "CONTROLLER_TEST_EXAMPLES=worktree runs yours"
)
