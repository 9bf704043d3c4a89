"""A replica controller on trio's structured concurrency.

For every backend (a named service) it keeps the desired number of replicas of the desired
version running on a runtime, tells watchers which replicas serve, and writes its intent to a
store before it acts, so that it survives its own crash.
"""

# The names below are imported on first use, not with the package: replica processes (LocalRuntime
# workers, Ray actors) import a corner of it, and a CLI should start fast. This block is the one
# list of the public names: type checkers and readers see them here, and `_lazy` reads it to
# import each on first use.
from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

if TYPE_CHECKING:
    from ._backend.goal import Goal as Goal
    from ._core.applications import Applications as Applications
    from ._core.controller import Controller as Controller
    from ._core.desk import Applied as Applied
    from ._core.open import open_controller as open_controller
    from ._local.runtime import LocalRuntime as LocalRuntime
    from ._model.applications import ApplicationStatus as ApplicationStatus
    from ._model.applications import AppRevision as AppRevision
    from ._model.applications import MemberStatus as MemberStatus
    from ._model.autoscale import ScaleDecision as ScaleDecision
    from ._model.autoscaling import AutoscalingConfig as AutoscalingConfig
    from ._model.canary import CanaryConfig as CanaryConfig
    from ._model.canary import CanaryStep as CanaryStep
    from ._model.canary_steps import CanaryStatus as CanaryStatus
    from ._model.canary_steps import RevisionNumbers as RevisionNumbers
    from ._model.code import CodeDigest as CodeDigest
    from ._model.config import BackendConfig as BackendConfig
    from ._model.errors import CheckpointError as CheckpointError
    from ._model.errors import CodeChangedError as CodeChangedError
    from ._model.errors import ConfigError as ConfigError
    from ._model.errors import ControllerClosedError as ControllerClosedError
    from ._model.errors import ControllerError as ControllerError
    from ._model.errors import FencedError as FencedError
    from ._model.errors import GoalFailed as GoalFailed
    from ._model.errors import InfeasibleError as InfeasibleError
    from ._model.errors import ManifestError as ManifestError
    from ._model.errors import NodesUnsupportedError as NodesUnsupportedError
    from ._model.errors import ReplicaError as ReplicaError
    from ._model.errors import ReplicaGoneError as ReplicaGoneError
    from ._model.errors import RolloutError as RolloutError
    from ._model.errors import RouteConflictError as RouteConflictError
    from ._model.errors import StartupError as StartupError
    from ._model.errors import StoreError as StoreError
    from ._model.errors import UnknownApplicationError as UnknownApplicationError
    from ._model.errors import UnknownBackendError as UnknownBackendError
    from ._model.errors import UnknownNodeError as UnknownNodeError
    from ._model.multiplexing import ReplicaModels as ReplicaModels
    from ._model.nodes import NodeInfo as NodeInfo
    from ._model.nodes import NodeRow as NodeRow
    from ._model.policy import RestartPolicy as RestartPolicy
    from ._model.replica_config import ReplicaConfig as ReplicaConfig
    from ._model.revisions import Cause as Cause
    from ._model.revisions import Revision as Revision
    from ._model.revisions import RevisionContent as RevisionContent
    from ._model.serving import ServingReplica as ServingReplica
    from ._model.serving import ServingReplicas as ServingReplicas
    from ._model.spec import ReplicaSpec as ReplicaSpec
    from ._model.status import AutoscalerStatus as AutoscalerStatus
    from ._model.status import BackendEvent as BackendEvent
    from ._model.status import BackendLoad as BackendLoad
    from ._model.status import BackendReason as BackendReason
    from ._model.status import BackendSnapshot as BackendSnapshot
    from ._model.status import BackendState as BackendState
    from ._model.status import BackendStatus as BackendStatus
    from ._model.status import ControllerStatus as ControllerStatus
    from ._model.status import FailedStart as FailedStart
    from ._model.status import GoalOutcome as GoalOutcome
    from ._model.status import LoadReport as LoadReport
    from ._model.status import ReplicaState as ReplicaState
    from ._model.status import ReplicaStatus as ReplicaStatus
    from ._model.status import RolloutStatus as RolloutStatus
    from ._model.status import TrafficSplit as TrafficSplit
    from ._model.verdict import RequestTally as RequestTally
    from ._ports.runtime import BatchedChecks as BatchedChecks
    from ._ports.runtime import CheckReport as CheckReport
    from ._ports.runtime import NodeRuntime as NodeRuntime
    from ._ports.runtime import ReplicaInfo as ReplicaInfo
    from ._ports.runtime import Runtime as Runtime
    from ._ports.store import Store as Store
    from ._routing.exchange import HandleError as HandleError
    from ._routing.exchange import RemoteError as RemoteError
    from ._routing.handle import Handle as Handle
    from ._routing.handle import HandleAnswer as HandleAnswer
    from ._serving.batching import BatchStats as BatchStats
    from ._serving.batching import batch as batch
    from ._serving.multiplex import model_id as model_id
    from ._serving.multiplex import multiplexed as multiplexed
    from ._serving.on_asyncio import on_asyncio as on_asyncio
    from ._serving.request import Request as Request
    from ._serving.response import Response as Response
    from ._stores.memory import MemoryStore as MemoryStore
    from ._stores.sqlite import SQLiteStore as SQLiteStore

__version__ = "0.1.0"

__getattr__, __dir__ = lazy_exports(__name__, __file__)
