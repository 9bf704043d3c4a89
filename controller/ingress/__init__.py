"""The ingress: an HTTP front door that routes each request to a replica of the backend whose
``route_prefix`` the path falls under, by power of two choices over the requests it has in
flight to each, with a bounded queue per backend, and reports its load to the controller.

It follows a watch source: ``ControllerSource(ctl)`` for the controller in the same process,
``HTTPSource(url, token)`` for a daemon's API (so it runs in processes of its own; several may
share one port with ``reuse_port``)::

    ingress = Ingress(ControllerSource(ctl))
    await nursery.start(ingress.run)
    listener = await open_listener("127.0.0.1", 8000)
    await nursery.start(ingress.serve, [listener])

``ingress.routes()`` is the routing it uses, a ``RouteInfo`` per backend: its route, its
limits, the replicas that serve (tag and address, and each one's version) and, during a canary
release, the ``Split`` of its requests (the canary's version and weight, the sticky and
forcing headers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .._http.server import listener_port as listener_port
    from .._http.server import open_listener as open_listener
    from .._routing.choice import RouteTable as RouteTable
    from .._routing.choice import choose as choose
    from .._routing.sources import ControllerSource as ControllerSource
    from .._routing.sources import HTTPSource as HTTPSource
    from .._routing.sources import SourceError as SourceError
    from .._routing.sources import WatchSource as WatchSource
    from .._routing.split import Split as Split
    from .._routing.table import RouteInfo as RouteInfo
    from ._config import IngressConfig as IngressConfig
    from ._ingress import Ingress as Ingress

__getattr__, __dir__ = lazy_exports(__name__, __file__)
