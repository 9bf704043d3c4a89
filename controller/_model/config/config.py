"""What a user asks for: a backend's config and how to build its replicas (validated).

Fields that form a part of their own are checked in that part's module (autoscaling, health,
resources, rollout, traffic); the rest, and the names a user writes, here."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from ..values.errors import ConfigError
from ..values.fields import from_mapping, schema
from ..values.json_values import JSON, JSON_RULE, check_json
from ..values.names import NAME as _NAME
from ..values.names import NAME_PATTERN as NAME_PATTERN
from ..values.numbers import MAX_COUNT, MAX_SECONDS, seconds, whole
from . import traffic
from .autoscaling import AutoscalingConfig, autoscaling, autoscaling_schema
from .canary import CanaryConfig, canary, canary_schema
from .health import (
    MIN_HEALTH_CHECK_PERIOD_S,
    failure_threshold,
    health_check_period,
    health_check_timeout,
)
from .nodes import (
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    MAX_LABELS,
    POLICIES,
    max_per_node,
    node_labels,
    placement_policy,
)
from .policies import (
    AffinityPolicy,
    RateLimitPolicy,
    RetryPolicy,
    affinity,
    affinity_schema,
    rate_limit,
    rate_limit_schema,
    retries,
    retries_schema,
)
from .resources import MAX_RESOURCE, resources
from .rollout import (
    LIMIT_SCHEMA,
    MAX_HISTORY,
    ON_FAILURE,
    OnFailure,
    history_limit,
    max_surge,
    max_unavailable,
    min_ready,
    on_failure,
    progress_deadline,
)
from .traffic import MAX_REQUESTS, ROUTE_PATTERN, max_ongoing, max_queued, route_prefix

# Every rule below is written once more as JSON Schema (each field's ``metadata["schema"]``),
# which the API's OpenAPI document is made from; tests/daemon/test_openapi.py checks that the
# two agree.
# So the patterns are ASCII and spelled out: JSON Schema's ``\w`` is not Python's.
VERSION_PATTERN = r"[\x20-\x7e]{1,200}"
_VERSION = re.compile(VERSION_PATTERN)

#: The most replicas one backend may ask for, whatever the runtime: a count past it is a typo,
#: refused before any runtime is asked (a runtime's own limit is usually far lower: a 409 then).
MAX_REPLICAS = MAX_COUNT

_SECONDS_SCHEMA: dict[str, Any] = {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_SECONDS}


def check_backend_name(name: object) -> str:
    """Backend names become store keys and replica tag prefixes, so they are kept plain."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            "name",
            "a backend name is 1-63 characters of letters, digits, '_', '.' or '-', "
            "starting with a letter or digit",
            name,
        )
    return name


def _replica_count(value: object) -> int:
    count = whole(value)
    if count is None or not 0 <= count <= MAX_REPLICAS:
        raise ConfigError(
            "BackendConfig.num_replicas", f"must be a whole number from 0 to {MAX_REPLICAS}", value
        )
    return count


def _graceful_shutdown_timeout(value: object) -> float:
    return seconds("BackendConfig.graceful_shutdown_timeout_s", value, allow_zero=True)


def _start_timeout(value: object) -> float:
    return seconds("BackendConfig.start_timeout_s", value, allow_zero=False)


def _version(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _VERSION.fullmatch(value):
        raise ConfigError(
            "BackendConfig.version", "must be None or 1-200 printable ASCII characters", value
        )
    return value


def _user_config(value: object) -> JSON:
    return check_json("BackendConfig.user_config", value)


@attrs.frozen(kw_only=True)
class BackendConfig:
    """How many replicas of which version a backend runs, and how they are started and stopped.

    Configs compare by value. Later fields (health checks, rollout limits) are added with defaults,
    so code and stored checkpoints written against this version keep working.
    """

    num_replicas: int = attrs.field(
        default=1,
        converter=_replica_count,
        metadata=schema(type="integer", minimum=0, maximum=MAX_REPLICAS),
    )
    """How many replicas should be RUNNING."""

    version: str | None = attrs.field(
        default=None,
        converter=_version,
        metadata=schema(type=["string", "null"], pattern=f"^{VERSION_PATTERN}$"),
    )
    """The code version. Replicas of another version are replaced. None: every deploy that changes
    the spec replaces every replica (the controller cannot tell whether the code changed)."""

    user_config: JSON = attrs.field(
        default=None,
        converter=_user_config,
        metadata=schema(description=JSON_RULE),
    )
    """JSON handed to each replica's ``reconfigure``. A change with the same `version` reconfigures
    replicas in place instead of replacing them."""

    graceful_shutdown_timeout_s: float = attrs.field(
        default=20.0,
        converter=_graceful_shutdown_timeout,
        metadata=schema(type="number", minimum=0, maximum=MAX_SECONDS),
    )
    """How long a stopping replica may drain before it is killed."""

    start_timeout_s: float = attrs.field(
        default=60.0, converter=_start_timeout, metadata=schema(**_SECONDS_SCHEMA)
    )
    """How long a replica may take to become ready before it is stopped and replaced."""

    resources: dict[str, float] = attrs.field(
        factory=dict,
        converter=resources,
        metadata=schema(
            type="object",
            propertyNames={"minLength": 1},
            additionalProperties={"type": "number", "minimum": 0, "maximum": MAX_RESOURCE},
        ),
    )
    """What one replica reserves on the runtime, e.g. ``{"CPU": 1}``. Empty: nothing."""

    placement: str = attrs.field(
        default="spread",
        converter=placement_policy,
        metadata=schema(type="string", enum=list(POLICIES)),
    )
    """On a runtime of several nodes: ``"spread"`` starts each replica on the node with the
    fewest of this backend (so that losing a node loses few), ``"pack"`` on the one with the
    most that has room (so that a scale-down can empty whole nodes). Scale-downs stop replicas
    from the nodes with the most of the backend first (spread) or the fewest (pack). Changing
    it never restarts replicas."""

    max_replicas_per_node: int | None = attrs.field(
        default=None,
        converter=max_per_node,
        metadata=schema(type=["integer", "null"], minimum=1, maximum=MAX_COUNT),
    )
    """The most replicas of this backend one node holds (None: no limit of its own). A count
    that the nodes cannot hold under it is refused, naming the rule."""

    node_labels: dict[str, str] = attrs.field(
        factory=dict,
        converter=node_labels,
        metadata=schema(
            type="object",
            maxProperties=MAX_LABELS,
            propertyNames={"pattern": f"^{LABEL_KEY_PATTERN}$"},
            additionalProperties={"type": "string", "pattern": f"^{LABEL_VALUE_PATTERN}$"},
        ),
    )
    """Labels a node must carry to hold this backend's replicas (Ray's node labels), e.g.
    ``{"zone": "a"}``. Custom resources (``resources``) select nodes too."""

    max_surge: int | float = attrs.field(
        default=0.25, converter=max_surge, metadata=schema(**LIMIT_SCHEMA)
    )
    """During an update, how many replicas may run above `num_replicas`: a count (int) or a
    fraction of `num_replicas` (float, rounded up). Like Kubernetes' maxSurge."""

    max_unavailable: int | float = attrs.field(
        default=0.25, converter=max_unavailable, metadata=schema(**LIMIT_SCHEMA)
    )
    """During an update, how many of `num_replicas` may be unavailable: a count (int) or a
    fraction (float, rounded down). Also bounds how many replicas are reconfigured at once."""

    health_check_period_s: float = attrs.field(
        default=10.0,
        converter=health_check_period,
        # One number type with the gap as a further rule, so that client generators see a
        # plain number; the gap is a choice, not a `not`, which schemathesis cannot draw from
        # below the document's root (a manifest's backends).
        metadata=schema(
            type="number",
            minimum=0,
            maximum=MAX_SECONDS,
            anyOf=[{"const": 0}, {"minimum": MIN_HEALTH_CHECK_PERIOD_S}],
        ),
    )
    """How often each RUNNING replica's ``check_health`` is called (at least every 0.1 s). 0
    turns health checks off."""

    health_check_timeout_s: float = attrs.field(
        default=30.0, converter=health_check_timeout, metadata=schema(**_SECONDS_SCHEMA)
    )
    """How long one health check may take before it counts as failed."""

    health_check_failure_threshold: int = attrs.field(
        default=3,
        converter=failure_threshold,
        metadata=schema(type="integer", minimum=1, maximum=MAX_COUNT),
    )
    """Consecutive failed checks after which a replica is stopped and replaced."""

    route_prefix: str | None = attrs.field(
        default=None,
        converter=route_prefix,
        metadata=schema(type=["string", "null"], pattern=f"^(?:{ROUTE_PATTERN})$"),
    )
    """Where the ingress serves the backend: requests whose path is this prefix or below it
    (``/echo`` takes ``/echo`` and ``/echo/x``, not ``/echoes``); the longest prefix wins.
    None: not routed. Changing it never restarts replicas."""

    max_ongoing_requests: int = attrs.field(
        default=100,
        converter=max_ongoing,
        metadata=schema(type="integer", minimum=1, maximum=MAX_REQUESTS),
    )
    """How many requests one ingress sends one replica at once; more wait in the backend's
    queue. 100 suits an HTTP service that handles requests concurrently; set it to what one
    replica really runs at once (1 for a model that takes one request at a time)."""

    max_queued_requests: int = attrs.field(
        default=1000,
        converter=max_queued,
        metadata=schema(type="integer", minimum=0, maximum=MAX_REQUESTS),
    )
    """How many requests one ingress holds for the backend while every replica is at
    `max_ongoing_requests` (first in, first out); beyond it, 503 with ``Retry-After``. 0: no
    queue. There is no unbounded setting: a queue without a bound turns overload into
    timeouts for everyone."""

    request_timeout_s: float = attrs.field(
        default=60.0, converter=traffic.request_timeout, metadata=schema(**_SECONDS_SCHEMA)
    )
    """How long a request may take, from its arrival at the ingress to the end of its answer:
    past it, 504 (or a cut answer), and the handler of code the worker serves is cancelled
    (see docs/backends-as-code.md). Changing it never restarts replicas."""

    autoscaling: AutoscalingConfig | None = attrs.field(
        default=None, converter=autoscaling, metadata=schema(**autoscaling_schema())
    )
    """Scale on load between bounds (see ``AutoscalingConfig``); `num_replicas` is then only
    the count it starts with. None: exactly `num_replicas`."""

    progress_deadline_s: float = attrs.field(
        default=600.0, converter=progress_deadline, metadata=schema(**_SECONDS_SCHEMA)
    )
    """How long a rollout may go without a new replica becoming ready before it fails
    (``ProgressDeadlineExceeded``), as Kubernetes' progressDeadlineSeconds."""

    on_failure: OnFailure = attrs.field(
        default="halt",
        converter=on_failure,
        metadata=schema(type="string", enum=list(ON_FAILURE)),
    )
    """What a failed rollout does: ``"halt"`` stops it and keeps what serves; ``"rollback"``
    also undoes to the last revision that completed."""

    min_ready_s: float = attrs.field(
        default=0.0,
        converter=min_ready,
        metadata=schema(type="number", minimum=0, maximum=MAX_SECONDS),
    )
    """How long each new replica must stay healthy after it becomes ready before its rollout
    counts as complete: a failed health check or a death within it fails the rollout."""

    revision_history_limit: int = attrs.field(
        default=10,
        converter=history_limit,
        metadata=schema(type="integer", minimum=0, maximum=MAX_HISTORY),
    )
    """How many revisions are kept beyond the current one (those that live replicas run, the
    one a rollout would go back to, and one paused are always kept)."""

    canary: CanaryConfig | None = attrs.field(
        default=None, converter=canary, metadata=schema(**canary_schema())
    )
    """Roll new versions out as canaries (see ``CanaryConfig``): a share of the traffic in
    steps, judged against the stable revision, then promoted or rolled back by itself. None:
    rolling updates."""

    retries: RetryPolicy = attrs.field(
        factory=RetryPolicy, converter=retries, metadata=schema(**retries_schema())
    )
    """Which failed requests a router tries again on another replica, within a budget (see
    ``RetryPolicy``): by default, those that never reached one, at most 3 times."""

    affinity: AffinityPolicy | None = attrs.field(
        default=None, converter=affinity, metadata=schema(**affinity_schema())
    )
    """Keep the requests of one session (a header's or cookie's value) on one replica (see
    ``AffinityPolicy``). None: each request where the load is least."""

    rate_limit: RateLimitPolicy | None = attrs.field(
        default=None, converter=rate_limit, metadata=schema(**rate_limit_schema())
    )
    """Limit each client's (or key's) rate at the ingress (see ``RateLimitPolicy``). None: no
    limit."""

    def __attrs_post_init__(self) -> None:
        if self.max_surge == 0 and self.max_unavailable == 0:
            raise ConfigError(
                "BackendConfig.max_surge",
                "max_surge and max_unavailable may not both be 0: an update could never proceed",
                self.max_surge,
            )

    def initial_replicas(self) -> int:
        """The count the backend starts with: `num_replicas`, within the autoscaling bounds."""
        if self.autoscaling is None:
            return self.num_replicas
        return self.autoscaling.initial(self.num_replicas)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> BackendConfig:
        """Build from a mapping (a config file, a request body); unknown keys are errors."""
        return from_mapping(cls, data)
