"""Replicas on a Ray cluster, and the controller's intent in the cluster's key-value store.

``pip install "controller[ray]"`` brings Ray; this subpackage is the only place that imports it.
Connect first (``ray.init(...)``), then::

    async with open_controller(runtime=RayRuntime(), store=RayKVStore()) as ctl:
        ...
"""

from ._kv_store import RayKVStore as RayKVStore
from ._runtime import RayRuntime as RayRuntime

__all__ = ["RayKVStore", "RayRuntime"]
