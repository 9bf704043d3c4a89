"""A replica controller on trio's structured concurrency.

For every backend (a named service) it keeps the desired number of replicas of the desired
version running on a runtime, tells watchers which replicas serve, and writes its intent to a
store before it acts, so that it survives its own crash.
"""

# The names below are imported on first use, not with the package: replica processes (LocalRuntime
# workers, Ray actors) import a corner of it, and a CLI should start fast. Type checkers and
# readers see them all here.
from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

if TYPE_CHECKING:
    from ._autoscale import ScaleDecision as ScaleDecision
    from ._autoscaling_config import AutoscalingConfig as AutoscalingConfig
    from ._checkpoint import SCHEMA_VERSION as SCHEMA_VERSION
    from ._code import CodeDigest as CodeDigest
    from ._config import BackendConfig as BackendConfig
    from ._config import ReplicaConfig as ReplicaConfig
    from ._controller import Applied as Applied
    from ._controller import Controller as Controller
    from ._errors import CheckpointError as CheckpointError
    from ._errors import CodeChangedError as CodeChangedError
    from ._errors import ConfigError as ConfigError
    from ._errors import ControllerClosedError as ControllerClosedError
    from ._errors import ControllerError as ControllerError
    from ._errors import FencedError as FencedError
    from ._errors import GoalFailed as GoalFailed
    from ._errors import InfeasibleError as InfeasibleError
    from ._errors import ManifestError as ManifestError
    from ._errors import ReplicaError as ReplicaError
    from ._errors import ReplicaGoneError as ReplicaGoneError
    from ._errors import RolloutError as RolloutError
    from ._errors import RouteConflictError as RouteConflictError
    from ._errors import StartupError as StartupError
    from ._errors import StoreError as StoreError
    from ._errors import UnknownBackendError as UnknownBackendError
    from ._gc import tune_gc as tune_gc
    from ._goal import Goal as Goal
    from ._json import JSON as JSON
    from ._local_runtime import LocalRuntime as LocalRuntime
    from ._memory_store import MemoryStore as MemoryStore
    from ._open import open_controller as open_controller
    from ._policy import RestartPolicy as RestartPolicy
    from ._revisions import Cause as Cause
    from ._revisions import Revision as Revision
    from ._revisions import RevisionContent as RevisionContent
    from ._runtime import DeathListener as DeathListener
    from ._runtime import ReplicaInfo as ReplicaInfo
    from ._runtime import ReplicaSpec as ReplicaSpec
    from ._runtime import Runtime as Runtime
    from ._sqlite_store import SQLiteStore as SQLiteStore
    from ._state import LOAD_TTL_S as LOAD_TTL_S
    from ._state import AutoscalerStatus as AutoscalerStatus
    from ._state import BackendEvent as BackendEvent
    from ._state import BackendLoad as BackendLoad
    from ._state import BackendReason as BackendReason
    from ._state import BackendSnapshot as BackendSnapshot
    from ._state import BackendState as BackendState
    from ._state import BackendStatus as BackendStatus
    from ._state import ControllerStatus as ControllerStatus
    from ._state import GoalOutcome as GoalOutcome
    from ._state import LoadReport as LoadReport
    from ._state import ReplicaState as ReplicaState
    from ._state import ReplicaStatus as ReplicaStatus
    from ._state import RolloutStatus as RolloutStatus
    from ._state import ServingReplica as ServingReplica
    from ._store import Store as Store

_HOME: dict[str, str] = {
    "SCHEMA_VERSION": "._checkpoint",
    "BackendConfig": "._config",
    "AutoscalingConfig": "._autoscaling_config",
    "ScaleDecision": "._autoscale",
    "ReplicaConfig": "._config",
    "Applied": "._controller",
    "Controller": "._controller",
    "open_controller": "._open",
    "CodeDigest": "._code",
    "CheckpointError": "._errors",
    "CodeChangedError": "._errors",
    "RolloutError": "._errors",
    "ConfigError": "._errors",
    "ControllerClosedError": "._errors",
    "ControllerError": "._errors",
    "FencedError": "._errors",
    "GoalFailed": "._errors",
    "InfeasibleError": "._errors",
    "ManifestError": "._errors",
    "ReplicaError": "._errors",
    "RouteConflictError": "._errors",
    "ReplicaGoneError": "._errors",
    "StartupError": "._errors",
    "StoreError": "._errors",
    "UnknownBackendError": "._errors",
    "Goal": "._goal",
    "tune_gc": "._gc",
    "JSON": "._json",
    "LocalRuntime": "._local_runtime",
    "MemoryStore": "._memory_store",
    "RestartPolicy": "._policy",
    "Cause": "._revisions",
    "Revision": "._revisions",
    "RevisionContent": "._revisions",
    "DeathListener": "._runtime",
    "ReplicaInfo": "._runtime",
    "ReplicaSpec": "._runtime",
    "Runtime": "._runtime",
    "SQLiteStore": "._sqlite_store",
    "LOAD_TTL_S": "._state",
    "BackendEvent": "._state",
    "BackendLoad": "._state",
    "AutoscalerStatus": "._state",
    "BackendReason": "._state",
    "BackendSnapshot": "._state",
    "BackendState": "._state",
    "BackendStatus": "._state",
    "ControllerStatus": "._state",
    "GoalOutcome": "._state",
    "LoadReport": "._state",
    "ReplicaState": "._state",
    "ReplicaStatus": "._state",
    "ServingReplica": "._state",
    "RolloutStatus": "._state",
    "Store": "._store",
}

__all__ = sorted(_HOME)
__version__ = "0.1.0"

__getattr__, __dir__ = lazy_exports(__name__, _HOME)
