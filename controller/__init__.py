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
    from ._model.config.applications import ApplicationStatus as ApplicationStatus
    from ._model.config.applications import AppRevision as AppRevision
    from ._model.config.applications import MemberStatus as MemberStatus
    from ._model.config.autoscaling import AutoscalingConfig as AutoscalingConfig
    from ._model.config.canary import CanaryConfig as CanaryConfig
    from ._model.config.canary import CanaryStep as CanaryStep
    from ._model.config.cause import Cause as Cause
    from ._model.config.config import BackendConfig as BackendConfig
    from ._model.config.nodes import NodeInfo as NodeInfo
    from ._model.config.nodes import NodeRow as NodeRow
    from ._model.config.replica_config import ReplicaConfig as ReplicaConfig
    from ._model.decisions.autoscale import ScaleDecision as ScaleDecision
    from ._model.decisions.canary_steps import CanaryStatus as CanaryStatus
    from ._model.decisions.canary_steps import RevisionNumbers as RevisionNumbers
    from ._model.decisions.policy import RestartPolicy as RestartPolicy
    from ._model.decisions.spec import ReplicaSpec as ReplicaSpec
    from ._model.decisions.verdict import RequestTally as RequestTally
    from ._model.records.multiplexing import ReplicaModels as ReplicaModels
    from ._model.records.replica_state import ReplicaState as ReplicaState
    from ._model.records.revisions import Revision as Revision
    from ._model.records.revisions import RevisionContent as RevisionContent
    from ._model.values.code import CodeDigest as CodeDigest
    from ._model.values.errors import CheckpointError as CheckpointError
    from ._model.values.errors import CodeChangedError as CodeChangedError
    from ._model.values.errors import ConfigError as ConfigError
    from ._model.values.errors import ControllerClosedError as ControllerClosedError
    from ._model.values.errors import ControllerError as ControllerError
    from ._model.values.errors import FencedError as FencedError
    from ._model.values.errors import GoalFailed as GoalFailed
    from ._model.values.errors import InfeasibleError as InfeasibleError
    from ._model.values.errors import ManifestError as ManifestError
    from ._model.values.errors import NodesUnsupportedError as NodesUnsupportedError
    from ._model.values.errors import ReplicaError as ReplicaError
    from ._model.values.errors import ReplicaGoneError as ReplicaGoneError
    from ._model.values.errors import RolloutError as RolloutError
    from ._model.values.errors import RouteConflictError as RouteConflictError
    from ._model.values.errors import StartupError as StartupError
    from ._model.values.errors import StoreError as StoreError
    from ._model.values.errors import UnknownApplicationError as UnknownApplicationError
    from ._model.values.errors import UnknownBackendError as UnknownBackendError
    from ._model.values.errors import UnknownNodeError as UnknownNodeError
    from ._model.views.serving import ServingReplica as ServingReplica
    from ._model.views.serving import ServingReplicas as ServingReplicas
    from ._model.views.status import AutoscalerStatus as AutoscalerStatus
    from ._model.views.status import BackendEvent as BackendEvent
    from ._model.views.status import BackendLoad as BackendLoad
    from ._model.views.status import BackendReason as BackendReason
    from ._model.views.status import BackendSnapshot as BackendSnapshot
    from ._model.views.status import BackendState as BackendState
    from ._model.views.status import BackendStatus as BackendStatus
    from ._model.views.status import ControllerStatus as ControllerStatus
    from ._model.views.status import FailedStart as FailedStart
    from ._model.views.status import GoalOutcome as GoalOutcome
    from ._model.views.status import LoadReport as LoadReport
    from ._model.views.status import ReplicaStatus as ReplicaStatus
    from ._model.views.status import RolloutStatus as RolloutStatus
    from ._model.views.status import TrafficSplit as TrafficSplit
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
