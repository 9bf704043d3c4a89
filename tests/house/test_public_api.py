from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

import pytest

import controller
import controller.aio
import controller.ingress
import controller.ray
import controller.testing
from controller._lazy import exports_of

LAZY_PACKAGES = [controller, controller.ray, controller.aio, controller.ingress]

#: Names that were public once and are the package's own business now: the collector's tuning
#: (``controller run`` calls it), the JSON alias, the load reports' lifetime and the death
#: listener's alias (a runtime's ``serve`` takes any callable of (tag, reason)).
INTERNAL = {"tune_gc", "JSON", "LOAD_TTL_S", "DeathListener", "SCHEMA_VERSION"}


def test_the_core_names_are_public() -> None:
    # A handful a user of the README meets first; the full list is the package's own.
    for name in ["open_controller", "Controller", "BackendConfig", "LocalRuntime", "batch"]:
        assert name in controller.__all__, name
    assert hasattr(controller.testing, "FakeRuntime")


@pytest.mark.parametrize("package", LAZY_PACKAGES, ids=lambda p: p.__name__)
def test_a_package_lists_its_public_names_once(package: types.ModuleType) -> None:
    # The one list is the TYPE_CHECKING block (what mypy reads); `__all__` and the imports on
    # first use come from it. A second list, a literal `__all__` or a table of homes, would
    # drift from it.
    assert package.__file__ is not None
    tree = ast.parse(Path(package.__file__).read_text())
    assigned = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    assert assigned <= {"__version__"}, assigned
    eager = [node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.level]
    assert eager == ["_lazy"], "a public name imported with the package"
    listed = exports_of(package.__file__)
    assert listed, "nothing listed"
    assert package.__all__ == sorted(listed)
    assert set(listed) <= set(dir(package))


@pytest.mark.parametrize("package", LAZY_PACKAGES, ids=lambda p: p.__name__)
def test_every_public_name_is_the_object_of_its_private_module(package: types.ModuleType) -> None:
    for name, where in exports_of(str(package.__file__)).items():
        home = importlib.import_module(where, package.__name__)
        private = [part for part in home.__name__.split(".") if part.startswith("_")]
        assert private, (name, home.__name__)  # one public surface, over private modules
        assert getattr(package, name) is getattr(home, name), name


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        controller.Nope  # noqa: B018


def test_errors_share_one_base() -> None:
    for name in controller.__all__:
        obj = getattr(controller, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, controller.ControllerError), name


def test_internals_are_not_public() -> None:
    for name in INTERNAL:
        assert name not in controller.__all__, name
        assert not hasattr(controller, name), name
    # A constant is a module's business: none is public.
    assert [name for name in controller.__all__ if name.isupper()] == []


def test_replica_states_are_the_contract() -> None:
    assert [s.name for s in controller.ReplicaState] == [
        "STARTING",
        "RUNNING",
        "UPDATING",
        "RECOVERING",
        "STOPPING",
    ]
