"""The user's files the controller reads: a manifest file, and the source an entrypoint would
import (its digest, found without importing it). The model above which this sits (``_model``)
reads no file.

Code pinning: the controller must never run user code, and ``importlib.util.find_spec("a.b")``
imports ``a``; so the module is located the way ``PathFinder`` would locate it, by looking at
directories only.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tomllib
from collections.abc import Sequence
from importlib.machinery import BYTECODE_SUFFIXES, EXTENSION_SUFFIXES
from pathlib import Path
from typing import NoReturn

from ._model.config.manifest import MAX_MANIFEST_BYTES, Manifest, parse_manifest
from ._model.values.code import CodeDigest
from ._model.values.errors import ManifestError

# FileFinder's order within one directory: a compiled extension shadows a .py file of the same
# name, and a .pyc one without source; both mean there is no source for us to pin.
_SUFFIXES = (*EXTENSION_SUFFIXES, ".py", *BYTECODE_SUFFIXES)
# A deploy that makes a revision reads these on the controller's loop: bounded, so that a huge
# package (a framework checked out beside the code) costs a deploy ~0.1 s at most, not seconds.
_MAX_FILES = 1_000
_MAX_BYTES = 16 * 1024 * 1024


# -- a manifest file --


def load_manifest(path: str | Path) -> Manifest:
    """Read and check a manifest file (``.toml``, or ``.json``); ``ManifestError`` lists every
    fault."""
    path = Path(path)
    source = str(path)
    try:
        with path.open("rb") as f:
            # Bounded: a device or a pipe named by mistake (/dev/zero) must not read forever.
            raw = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise ManifestError(source, [f"cannot read the file: {exc.strerror or exc}"]) from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(
            source, [f"the file is over {MAX_MANIFEST_BYTES} bytes, the most an apply may send"]
        )
    try:
        data = json.loads(raw) if path.suffix == ".json" else tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(source, [f"not valid {_format(path)}: {exc}"]) from None
    except RecursionError:
        raise ManifestError(source, [f"the {_format(path)} is nested too deeply"]) from None
    return parse_manifest(data, source)


def _format(path: Path) -> str:
    return "JSON" if path.suffix == ".json" else "TOML"


# -- the source of an entrypoint --


class _Unpinnable(Exception):
    """Something odd on disk (a .py that is a FIFO, say) that we decline to digest."""


# A place to search for a name: (the top-level package directory it lies in, or None at the top
# of the search path; the directory itself).
_Place = tuple[str | None, str]


def code_digest(entrypoint: str, search_path: Sequence[str]) -> CodeDigest | None:
    """Digest the source of `entrypoint`'s module, found in `search_path` (like `sys.path`;
    entries that are not directories, such as zip files, are skipped) as Python would find it.

    A top-level plain module is digested alone. A module in a package, or a package, is digested
    with every ``*.py`` file under its top-level package directory (the portion it was found in,
    for a namespace package), since its siblings are code it may import too; ``__pycache__``,
    dot-directories, dot-files (editor lock files) and symlinked directories are left out. The
    files are read in the order of their paths relative to the package's parent, until 1,000
    have been read or the next one would take the total past 16 MiB: a package that large is
    rare, and `files` then says how many went in (a change beyond them goes unseen).

    Returns None if the module is not found, is a compiled extension or bytecode only, is a
    namespace package (no source of its own), or cannot be read. Nothing is imported.
    """
    module = entrypoint.partition(":")[0]
    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        return None
    try:
        found = _find_module(parts, search_path)
        if found is None:
            return None
        root, file = found
        if root is None:
            files = {os.path.basename(file): file}
        else:
            parent = os.path.dirname(root)
            files = _package_files(root, parent)
            # The module itself may lie under a symlinked directory, which the walk skips.
            files.setdefault(_relative(file, parent), file)
        return _digest(module, files)
    except (OSError, _Unpinnable):
        return None


def _find_module(parts: list[str], search_path: Sequence[str]) -> tuple[str | None, str] | None:
    """(the top-level package directory or None, the module's source file), as PathFinder
    would find them: a regular package's `__path__` is its directory; a namespace package's is
    all its portions, in search-path order."""
    places: list[_Place] = [(None, entry or ".") for entry in search_path]
    for index, name in enumerate(parts):
        found = _find_in(name, places)
        if found is None:
            return None
        file, root, places = found
        if index == len(parts) - 1:
            # A namespace package has no source, so there is nothing to pin.
            return None if file is None else (root, file)
        if not places:
            return None  # a plain module has no submodules
    return None


def _find_in(name: str, places: list[_Place]) -> tuple[str | None, str | None, list[_Place]] | None:
    """FileFinder over each place in turn: (source file or None for a namespace package, the
    top-level package directory it lies in, the places to search for its submodules), or None
    if not found or found without source."""
    portions: list[_Place] = []
    for root, directory in places:
        try:
            names = set(os.listdir(directory))
        except (OSError, ValueError):
            continue  # not a directory, or unreadable: the import system skips it too
        path = os.path.join(directory, name)
        if name in names and os.path.isdir(path):
            for suffix in _SUFFIXES:
                init = os.path.join(path, "__init__" + suffix)
                if os.path.isfile(init):
                    top = root or path
                    return (init, top, [(top, path)]) if suffix == ".py" else None
            # A namespace portion counts only if no entry has a regular package or module.
            portions.append((root or path, path))
        for suffix in _SUFFIXES:
            if name + suffix in names and os.path.isfile(path + suffix):
                return (path + suffix, root, []) if suffix == ".py" else None
    return (None, None, portions) if portions else None


def _raise(error: OSError) -> NoReturn:
    # os.walk skips unreadable directories silently; a digest missing files would lie.
    raise error


def _package_files(root: str, parent: str) -> dict[str, str]:
    files: dict[str, str] = {}
    for directory, dirnames, filenames in os.walk(root, onerror=_raise, followlinks=False):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
        for filename in filenames:
            if filename.endswith(".py") and not filename.startswith("."):
                path = os.path.join(directory, filename)
                files[_relative(path, parent)] = path
    return files


def _relative(path: str, parent: str) -> str:
    return os.path.relpath(path, parent).replace(os.sep, "/")


def _digest(module: str, files: dict[str, str]) -> CodeDigest:
    sha = hashlib.sha256()
    count = total = 0
    for relative in sorted(files):
        if count == _MAX_FILES:
            break
        content = _read(files[relative], _MAX_BYTES - total)
        if content is None:
            break
        # Path, NUL, then a length prefix: a rename, or bytes moved between files, changes it.
        sha.update(relative.encode("utf-8", "surrogateescape") + b"\0")
        sha.update(len(content).to_bytes(8, "big") + content)
        count += 1
        total += len(content)
    return CodeDigest(module=module, digest=sha.hexdigest(), files=count)


def _read(path: str, limit: int) -> bytes | None:
    """The file's bytes, or None if it holds more than `limit`. Opened without blocking and then
    checked, so that a FIFO named ``x.py`` cannot hang the controller."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _Unpinnable(path)
        content = file.read(limit + 1)
    return None if len(content) > limit else content
