"""A replica controller on trio's structured concurrency.

For every backend (a named service) it keeps the desired number of replicas of the desired
version running on a runtime, tells watchers which replicas serve, and writes its intent to a
store before it acts, so that it survives its own crash.
"""

from ._checkpoint import SCHEMA_VERSION as SCHEMA_VERSION
from ._config import BackendConfig as BackendConfig
from ._config import ReplicaConfig as ReplicaConfig
from ._controller import Controller as Controller
from ._controller import open_controller as open_controller
from ._errors import CheckpointError as CheckpointError
from ._errors import ConfigError as ConfigError
from ._errors import ControllerClosedError as ControllerClosedError
from ._errors import ControllerError as ControllerError
from ._errors import GoalFailed as GoalFailed
from ._errors import InfeasibleError as InfeasibleError
from ._errors import ReplicaError as ReplicaError
from ._errors import ReplicaGoneError as ReplicaGoneError
from ._errors import StoreError as StoreError
from ._errors import UnknownBackendError as UnknownBackendError
from ._goal import Goal as Goal
from ._json import JSON as JSON
from ._local_runtime import LocalRuntime as LocalRuntime
from ._memory_store import MemoryStore as MemoryStore
from ._policy import RestartPolicy as RestartPolicy
from ._runtime import DeathListener as DeathListener
from ._runtime import ReplicaSpec as ReplicaSpec
from ._runtime import Runtime as Runtime
from ._sqlite_store import SQLiteStore as SQLiteStore
from ._state import BackendEvent as BackendEvent
from ._state import BackendReason as BackendReason
from ._state import BackendSnapshot as BackendSnapshot
from ._state import BackendState as BackendState
from ._state import BackendStatus as BackendStatus
from ._state import ControllerStatus as ControllerStatus
from ._state import GoalOutcome as GoalOutcome
from ._state import ReplicaState as ReplicaState
from ._state import ReplicaStatus as ReplicaStatus
from ._state import ServingReplica as ServingReplica
from ._store import Store as Store

__version__ = "0.1.0"
