"""Tools for testing code that uses the controller, like ``trio.testing`` is for trio code."""

from ._conformance import CONFORMANCE_CHECKS as CONFORMANCE_CHECKS
from ._conformance import FENCING_CHECKS as FENCING_CHECKS
from ._conformance import Subject as Subject
from ._fake_replica import FakeReplica as FakeReplica
from ._fake_replica import FakeState as FakeState
from ._fake_runtime import FakeRuntime as FakeRuntime
from ._faults import ControllerCrash as ControllerCrash
from ._faults import FaultInjector as FaultInjector
from ._trio_replica import TrioReplica as TrioReplica
