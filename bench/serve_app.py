"""The Ray Serve application of the race's declarative variant: the race's class, as a
deployment. Kept apart from noop_replica.py so that the other contenders never import Serve."""

from noop_replica import DrainingNoop
from ray import serve

app = serve.deployment(name="Noop")(DrainingNoop).bind()
