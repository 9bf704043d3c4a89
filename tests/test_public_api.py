from __future__ import annotations

import controller
import controller.testing

EXPECTED = {
    "BackendConfig",
    "AutoscalingConfig",
    "AutoscalerStatus",
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
    "ReplicaInfo",
    "RouteConflictError",
    "LoadReport",
    "BackendLoad",
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
