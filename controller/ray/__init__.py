"""Replicas on a Ray cluster, and the controller's intent in the cluster's key-value store.

``pip install "controller[ray]"`` brings Ray; this subpackage is the only place that imports it.
Connect first (``ray.init(...)``), then::

    async with open_controller(runtime=RayRuntime(), store=RayKVStore()) as ctl:
        ...
"""

# Imported on first use: each replica's actor process imports this package to reach its host
# class, and needs none of the controller side.
from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._connect import connect as connect
    from ._kv_store import RayKVStore as RayKVStore
    from ._runtime import RayRuntime as RayRuntime

__getattr__, __dir__ = lazy_exports(__name__, __file__)
