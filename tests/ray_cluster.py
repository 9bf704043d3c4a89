"""A local Ray cluster for a test module: its files in a short temporary RAY_TMPDIR, no token file
in the user's home, and the driver connected; everything undone at the end."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import ray
from ray.cluster_utils import Cluster


@contextlib.contextmanager
def local_cluster(
    head: Mapping[str, Any], more_nodes: Sequence[Mapping[str, Any]] = ()
) -> Iterator[Cluster]:
    """A head node with `head`'s options, and one more node for each of `more_nodes`."""
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths
    saved = {key: os.environ.get(key) for key in ("RAY_TMPDIR", "RAY_AUTH_MODE")}
    os.environ["RAY_TMPDIR"] = tmp
    os.environ["RAY_AUTH_MODE"] = "disabled"  # no token file in the user's home
    ray_cluster = Cluster(initialize_head=True, head_node_args={"include_dashboard": False, **head})
    try:
        for node in more_nodes:
            ray_cluster.add_node(**node)
        if more_nodes:
            ray_cluster.wait_for_nodes()
        ray.init(address=ray_cluster.address, logging_level=logging.WARNING)
        yield ray_cluster
    finally:
        processes = [
            info.process
            for node in ray_cluster.list_all_nodes()  # type: ignore[no-untyped-call]
            for infos in node.all_processes.values()
            for info in infos
            if info.process is not None
        ]
        ray.shutdown()
        ray_cluster.shutdown()  # type: ignore[no-untyped-call]
        # Ray waits a while for each of its processes, then leaves those still running: on a
        # busy machine, some. They are reaped here, not by whichever later test happens to
        # collect their Popen objects (a ResourceWarning then fails that test).
        for process in processes:
            if process.poll() is None:
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(tmp, ignore_errors=True)
