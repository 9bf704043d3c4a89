"""The replica worker of LocalRuntime, and what a replica can learn and use of where it runs.

``python -m controller.worker SPEC_FILE`` is how LocalRuntime starts a worker; users do not run it
by hand. Inside a replica, ``controller.worker.context()`` gives its tag, backend, version and the
host and port the runtime reserved for it; ``controller.worker.handle("name")`` calls another
backend.
"""

from ._ports.context import ReplicaContext as ReplicaContext
from ._ports.context import context as context
from ._serving.handles import handle as handle

if __name__ == "__main__":
    from ._local.worker_process import main

    main()
