"""code_digest: finds an entrypoint's source the way Python would, without importing it."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterator, Mapping
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from controller import _sources as code
from controller._model.values.code import CodeDigest
from controller._sources import code_digest

# Every module file raises if imported, and each test checks that none got into sys.modules.
BOOM = b'raise SystemExit("imported!")\n'
NAMES = ("pinmod", "pinpkg", "pinns", "pinother")


@pytest.fixture(autouse=True)
def _never_imports() -> Iterator[None]:
    before = {name for name in sys.modules if name.startswith(NAMES)}
    assert not before
    yield
    assert not {name for name in sys.modules if name.startswith(NAMES)}


def build(root: Path, files: Mapping[str, bytes]) -> Path:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return root


def expected(files: Mapping[str, bytes]) -> str:
    """The documented format, computed independently."""
    sha = hashlib.sha256()
    for relative in sorted(files):
        content = files[relative]
        sha.update(relative.encode() + b"\0" + len(content).to_bytes(8, "big") + content)
    return sha.hexdigest()


PACKAGE = {
    "pinpkg/__init__.py": BOOM,
    "pinpkg/sub/__init__.py": BOOM,
    "pinpkg/sub/mod.py": BOOM + b"class Replica: ...\n",
    "pinpkg/other.py": BOOM + b"# not imported by the entrypoint\n",
}


def digest_of(path: Path, entrypoint: str = "pinpkg.sub.mod:Replica") -> str:
    found = code_digest(entrypoint, [str(path)])
    assert found is not None
    return found.digest


def test_top_level_module(tmp_path: Path) -> None:
    build(tmp_path, {"pinmod.py": BOOM, "pinother.py": b"x = 1\n"})
    found = code_digest("pinmod:Replica", [str(tmp_path)])
    assert found == CodeDigest(module="pinmod", digest=expected({"pinmod.py": BOOM}), files=1)
    assert len(found.digest) == 64


def test_package_digests_the_whole_top_level_package(tmp_path: Path) -> None:
    build(tmp_path, PACKAGE)
    build(tmp_path, {"pinpkg/data.txt": b"a", "pinpkg/__pycache__/mod.cpython-311.pyc": b"b"})
    found = code_digest("pinpkg.sub.mod:Replica.Inner", [str(tmp_path)])
    assert found == CodeDigest(module="pinpkg.sub.mod", digest=expected(PACKAGE), files=4)
    # The package itself is an entrypoint module too, with the same files.
    assert code_digest("pinpkg:Replica", [str(tmp_path)]) == CodeDigest(
        module="pinpkg", digest=expected(PACKAGE), files=4
    )


def test_any_source_change_in_the_package_changes_it(tmp_path: Path) -> None:
    build(tmp_path, PACKAGE)
    before = digest_of(tmp_path)
    (tmp_path / "pinpkg/other.py").write_bytes(b"changed\n")
    assert digest_of(tmp_path) != before


@pytest.mark.parametrize(
    "relative",
    [
        "pinpkg/__pycache__/mod.cpython-311.pyc",
        "pinpkg/sub/__pycache__/x.py",
        "pinpkg/data.txt",
        "pinpkg/.hidden/x.py",
        "pinpkg/.#mod.py",
    ],
)
def test_what_is_not_source_does_not_change_it(tmp_path: Path, relative: str) -> None:
    build(tmp_path, PACKAGE)
    before = digest_of(tmp_path)
    build(tmp_path, {relative: b"anything"})
    assert digest_of(tmp_path) == before


def test_the_same_tree_elsewhere_gives_the_same_digest(tmp_path: Path) -> None:
    one = build(tmp_path / "one", PACKAGE)
    two = build(tmp_path / "deeper" / "two", PACKAGE)
    assert digest_of(one) == digest_of(two)


def test_a_rename_changes_it(tmp_path: Path) -> None:
    build(tmp_path, PACKAGE)
    before = digest_of(tmp_path)
    (tmp_path / "pinpkg/other.py").rename(tmp_path / "pinpkg/renamed.py")
    assert digest_of(tmp_path) != before


def test_content_boundaries_are_unambiguous(tmp_path: Path) -> None:
    one = build(tmp_path / "one", {"pinpkg/__init__.py": b"ab", "pinpkg/b.py": b"c"})
    two = build(tmp_path / "two", {"pinpkg/__init__.py": b"a", "pinpkg/b.py": b"bc"})
    assert digest_of(one, "pinpkg:X") != digest_of(two, "pinpkg:X")


def test_namespace_package(tmp_path: Path) -> None:
    files = {"pinns/sub/mod.py": BOOM, "pinns/sub/helper.py": BOOM, "pinns/top.py": BOOM}
    build(tmp_path, files)
    assert code_digest("pinns.sub.mod:X", [str(tmp_path)]) == CodeDigest(
        module="pinns.sub.mod", digest=expected(files), files=3
    )
    # A namespace package has no source of its own.
    assert code_digest("pinns:X", [str(tmp_path)]) is None
    assert code_digest("pinns.sub:X", [str(tmp_path)]) is None


def test_namespace_portions_are_searched_in_order(tmp_path: Path) -> None:
    build(tmp_path / "a", {"pinns/one.py": BOOM})
    build(tmp_path / "b", {"pinns/two.py": BOOM})
    path = [str(tmp_path / "a"), str(tmp_path / "b")]
    # Only the portion holding the module is digested: the others are other distributions.
    assert code_digest("pinns.two:X", path) == CodeDigest(
        module="pinns.two", digest=expected({"pinns/two.py": BOOM}), files=1
    )


def test_a_package_beats_a_module_in_the_same_directory(tmp_path: Path) -> None:
    build(tmp_path, {**PACKAGE, "pinpkg.py": BOOM})
    assert digest_of(tmp_path, "pinpkg:X") == expected(PACKAGE)


def test_a_module_beats_a_namespace_directory_in_the_same_directory(tmp_path: Path) -> None:
    build(tmp_path, {"pinmod.py": BOOM, "pinmod/x.py": BOOM})
    assert digest_of(tmp_path, "pinmod:X") == expected({"pinmod.py": BOOM})


def test_an_earlier_directory_beats_a_later_one(tmp_path: Path) -> None:
    build(tmp_path / "a", {"pinmod.py": b"first\n"})
    build(tmp_path / "b", {"pinmod.py": b"second\n", "pinpkg/__init__.py": BOOM})
    path = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert code_digest("pinmod:X", path) == CodeDigest(
        module="pinmod", digest=expected({"pinmod.py": b"first\n"}), files=1
    )
    # Not in the first, so the second.
    assert digest_of(tmp_path / "b", "pinpkg:X") == expected({"pinpkg/__init__.py": BOOM})
    assert code_digest("pinpkg:X", path) == code_digest("pinpkg:X", [str(tmp_path / "b")])


def test_a_regular_module_anywhere_beats_an_earlier_namespace_directory(tmp_path: Path) -> None:
    build(tmp_path / "a", {"pinmod/x.py": BOOM})
    build(tmp_path / "b", {"pinmod.py": BOOM})
    path = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert code_digest("pinmod:X", path) == CodeDigest(
        module="pinmod", digest=expected({"pinmod.py": BOOM}), files=1
    )


@pytest.mark.parametrize(
    "entrypoint",
    [
        "pinmissing:X",
        "pinpkg.missing.mod:Replica",  # a missing middle part
        "pinpkg.sub.missing:Replica",
        "pinpkg.other.below:X",  # a plain module has no submodules
        "pinpkg..sub:X",
        ":X",
        "pinpkg/sub:X",
        "../pinpkg:X",
    ],
)
def test_not_found(tmp_path: Path, entrypoint: str) -> None:
    build(tmp_path, PACKAGE)
    assert code_digest(entrypoint, [str(tmp_path)]) is None


def test_compiled_only_is_not_pinned(tmp_path: Path) -> None:
    suffix = EXTENSION_SUFFIXES[0]
    build(tmp_path, {f"pinmod{suffix}": b"", "pinmod.py": BOOM, "pinother.pyc": b""})
    build(tmp_path, {f"pinpkg/__init__{suffix}": b"", "pinpkg/__init__.py": BOOM})
    for entrypoint in ("pinmod:X", "pinother:X", "pinpkg:X"):
        assert code_digest(entrypoint, [str(tmp_path)]) is None


def test_search_path_entries_that_are_not_directories_are_skipped(tmp_path: Path) -> None:
    build(tmp_path, {"lib.zip": b"PK"})
    build(tmp_path / "src", {"pinmod.py": BOOM})
    path = [str(tmp_path / "lib.zip"), str(tmp_path / "missing"), "a\0b", str(tmp_path / "src")]
    assert code_digest("pinmod:X", path) is not None


def test_the_empty_entry_is_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build(tmp_path, PACKAGE)
    monkeypatch.chdir(tmp_path)
    assert digest_of(Path(""), "pinpkg.sub.mod:X") == expected(PACKAGE)
    assert code_digest("pinpkg.sub.mod:X", [""]) == code_digest("pinpkg.sub.mod:X", [str(tmp_path)])


def test_a_symlinked_directory_loop_does_not_hang(tmp_path: Path) -> None:
    build(tmp_path, PACKAGE)
    (tmp_path / "pinpkg/sub/loop").symlink_to(tmp_path / "pinpkg", target_is_directory=True)
    assert digest_of(tmp_path) == expected(PACKAGE)


def test_symlinked_files_are_read_and_the_module_itself_is_always_in(tmp_path: Path) -> None:
    build(tmp_path / "elsewhere", {"real.py": b"real\n", "sub/mod.py": BOOM})
    build(tmp_path / "path", {"pinpkg/__init__.py": BOOM})
    (tmp_path / "path/pinpkg/linked.py").symlink_to(tmp_path / "elsewhere/real.py")
    (tmp_path / "path/pinpkg/sub").symlink_to(tmp_path / "elsewhere/sub")
    assert digest_of(tmp_path / "path", "pinpkg.sub.mod:X") == expected(
        {"pinpkg/__init__.py": BOOM, "pinpkg/linked.py": b"real\n", "pinpkg/sub/mod.py": BOOM}
    )


def test_unreadable_or_odd_files_give_none(tmp_path: Path) -> None:
    build(tmp_path, PACKAGE)
    (tmp_path / "pinpkg/broken.py").symlink_to(tmp_path / "nowhere.py")
    assert code_digest("pinpkg:X", [str(tmp_path)]) is None
    (tmp_path / "pinpkg/broken.py").unlink()
    os.mkfifo(tmp_path / "pinpkg/fifo.py")
    assert code_digest("pinpkg:X", [str(tmp_path)]) is None


def test_the_caps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build(tmp_path, PACKAGE)
    in_order = sorted(PACKAGE)
    monkeypatch.setattr(code, "_MAX_FILES", 2)
    found = code_digest("pinpkg:X", [str(tmp_path)])
    assert found is not None
    assert found.files == 2
    assert found.digest == expected({name: PACKAGE[name] for name in in_order[:2]})
    monkeypatch.setattr(code, "_MAX_FILES", 5_000)
    # Room for the first file and not the second.
    monkeypatch.setattr(code, "_MAX_BYTES", len(PACKAGE[in_order[0]]) + 1)
    found = code_digest("pinpkg:X", [str(tmp_path)])
    assert found is not None
    assert found.files == 1
    assert found.digest == expected({in_order[0]: PACKAGE[in_order[0]]})
