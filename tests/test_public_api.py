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

EXPECTED = {
    "BackendConfig",
    "AutoscalingConfig",
    "AutoscalerStatus",
    "CanaryConfig",
    "CanaryStep",
    "CanaryStatus",
    "RevisionNumbers",
    "TrafficSplit",
    "RequestTally",
    "ScaleDecision",
    "ReplicaConfig",
    "open_controller",
    "Controller",
    "ReplicaState",
    "MemoryStore",
    "SQLiteStore",
    "Goal",
    "GoalOutcome",
    "BackendSnapshot",
    "BackendStatus",
    "ControllerStatus",
    "ReplicaStatus",
    "ServingReplica",
    "Runtime",
    "Store",
    "ReplicaSpec",
    "ControllerError",
    "ConfigError",
    "GoalFailed",
    "InfeasibleError",
    "ManifestError",
    "UnknownBackendError",
    "CheckpointError",
    "ReplicaError",
    "ReplicaGoneError",
    "StoreError",
    "ControllerClosedError",
    "StartupError",
    "Applied",
    "batch",
    "BatchStats",
    "multiplexed",
    "model_id",
    "ReplicaModels",
    "Applications",
    "ApplicationStatus",
    "AppRevision",
    "MemberStatus",
    "UnknownApplicationError",
    "ReplicaInfo",
    "RouteConflictError",
    "LoadReport",
    "BackendLoad",
    "Request",
    "Response",
    "on_asyncio",
    "Handle",
    "HandleAnswer",
    "HandleError",
    "RemoteError",
}


def test_public_names_are_exported() -> None:
    missing = {name for name in EXPECTED if not hasattr(controller, name)}
    assert missing == set()
    assert hasattr(controller.testing, "FakeRuntime")


def test_public_names_come_from_private_modules() -> None:
    # One public surface: everything it exports lives in a private module of the package.
    for name in EXPECTED:
        module = getattr(getattr(controller, name), "__module__", "")
        assert module.startswith("controller._"), (name, module)


def test_replica_states_are_the_contract() -> None:
    assert [s.name for s in controller.ReplicaState] == [
        "STARTING",
        "RUNNING",
        "UPDATING",
        "RECOVERING",
        "STOPPING",
    ]


def test_errors_share_one_base() -> None:
    for name in EXPECTED:
        obj = getattr(controller, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, controller.ControllerError), name


def static_exports(package: types.ModuleType) -> dict[str, str]:
    """What `package`'s ``__init__`` re-exports as a type checker reads it (``from M import N
    as N``, at its top or under ``if TYPE_CHECKING:``): each name and its relative module."""
    assert package.__file__ is not None
    tree = ast.parse(Path(package.__file__).read_text())
    found: dict[str, str] = {}
    blocks = [tree.body] + [
        node.body
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    ]
    for block in blocks:
        for node in block:
            if isinstance(node, ast.ImportFrom) and node.level:
                for alias in node.names:
                    if alias.asname == alias.name:  # PEP 484's explicit re-export
                        found[alias.name] = "." * node.level + (node.module or "")
    return found


@pytest.mark.parametrize(
    "package", [controller, controller.ray, controller.aio], ids=lambda p: p.__name__
)
def test_a_lazy_package_exports_at_run_time_what_it_exports_statically(
    package: types.ModuleType,
) -> None:
    # Listed twice in one file (for type checkers, and for the imports on first use): the two
    # lists must be one.
    static = static_exports(package)
    assert static == package._HOME
    assert package.__all__ == sorted(static)
    assert set(static) <= set(dir(package))


def test_every_public_name_is_the_object_of_its_module() -> None:
    for name, where in static_exports(controller).items():
        home = importlib.import_module(where, "controller")
        assert getattr(controller, name) is getattr(home, name), name
    assert set(controller.__all__) >= EXPECTED


def test_the_ingress_exports_what_it_imports() -> None:
    static = static_exports(controller.ingress)
    assert sorted(controller.ingress.__all__) == sorted(static)
    for name in static:
        assert hasattr(controller.ingress, name), name


def test_internals_are_not_public() -> None:
    assert "SCHEMA_VERSION" not in controller.__all__
    assert not hasattr(controller, "SCHEMA_VERSION")
