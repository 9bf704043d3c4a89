"""The examples the tests run: a pristine copy, not the working tree's.

The README invites its reader to edit ``examples/backends.toml`` and ``examples/echo_replica.py``
and to run the tests beside the daemon; tests that read those files from the working tree then
failed, and read as "the project is broken". So when ``examples/`` differs from the commit
checked out (``git status``), the tests run the committed copy, extracted once per commit into
this user's private dir in the temp dir; otherwise (no edits, no git, not a checkout) the
working tree's.
``CONTROLLER_TEST_EXAMPLES=worktree`` runs the working tree's whatever it holds: for someone
changing the examples themselves.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
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


def _cache() -> Path | None:
    """This user's dir for the extracted copies (0700, theirs), or None if it is not safe to
    trust: on a shared machine another user could plant code in /tmp for the tests to import."""
    base = Path(tempfile.gettempdir()) / f"controller-examples-{os.getuid()}"
    try:
        base.mkdir(mode=0o700, exist_ok=True)
        info = base.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    return base


def _pristine(commit: str) -> Path:
    """The examples of `commit`, extracted once into this user's cache (shared by the test
    processes: each extracts into a dir of its own and renames it into place), or into a
    fresh dir of this run's if the cache cannot be trusted."""
    cache = _cache()
    target = None if cache is None else cache / commit[:12]
    if target is not None and (target / "examples").is_dir():
        return target / "examples"
    archive = _git("archive", "--format=tar", commit, "examples")
    if archive is None:
        return WORKTREE
    staging = Path(tempfile.mkdtemp(prefix="controller-examples-", dir=cache))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(staging, filter="data")
    if target is None:
        return staging / "examples"
    with contextlib.suppress(OSError):  # another test process put it there first
        staging.rename(target)
    if (target / "examples").is_dir():
        shutil.rmtree(staging, ignore_errors=True)
        return target / "examples"
    return staging / "examples"  # the target is something else: this run's own copy


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
