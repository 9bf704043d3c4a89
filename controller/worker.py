"""The replica worker of LocalRuntime, and what a replica can learn about where it runs.

``python -m controller.worker SPEC_FILE`` is how LocalRuntime starts a worker; users do not run it
by hand. Inside a replica, ``controller.worker.context()`` gives its tag, backend, version and the
port the runtime reserved for it.
"""

from ._worker import ReplicaContext as ReplicaContext
from ._worker import context as context
from ._worker import main as _main

if __name__ == "__main__":
    _main()
