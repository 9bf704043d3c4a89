"""Tasks: tests, quick, lint, typecheck, bench, bench_compare, reliability and quickstart
(``nox -s NAME``)."""

from __future__ import annotations

import os
import shutil

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = False

#: The tests run in 4 processes (pytest-xdist): most of a test's time is a daemon or a worker
#: starting or draining, not CPU, so 4 keep 2 cores busy. A file's tests stay in one process, for
#: the fixtures a module shares (a Ray cluster, a browser) and the crash points' final count.
#: ``nox -s tests -- -n 0`` runs them all in this one. xdist's reordering is off because
#: tests/conftest.py orders the files itself (xdist's order, but a long one-test file first).
#: 6 processes measured no faster (7:33 and 8:19 against 6:54 to 7:58 for 4): the machine is
#: busy all the while, and a third of its CPU is the kernel's memory monitor (``kdamond``).
PARALLEL = ("-n", "4", "--dist", "loadfile", "--no-loadscope-reorder")

#: Bytecode is written even where the environment says not to: the suite starts a Python process
#: for every CLI call, daemon, ingress process and worker (thousands), and without ``.pyc`` files
#: each compiles the package from source again. Measured on 2 cores: collecting the tests took
#: 6.7 s a process instead of 2.1 s, and the quick lane 64 s instead of 54 s. The files go to
#: ``__pycache__`` beside the sources, as a user's own runs put them (git ignores them).
COMPILED = {"PYTHONDONTWRITEBYTECODE": None}


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite (pass pytest options after ``--``)."""
    # Shown as it goes: Ray is a large download, and the first run spends a minute on it.
    session.install("-e", ".[test,ray]", silent=False)
    session.run("pytest", *PARALLEL, *session.posargs, env=COMPILED)


@nox.session
def quick(session: nox.Session) -> None:
    """The tests that need no daemon, worker, Ray cluster or browser (``-m "not slow"``): under
    a minute, for the edit-test loop. The full suite is ``nox -s tests``."""
    session.install("-e", ".[test,ray]", silent=False)  # the Ray tests' modules import it
    session.run("pytest", *PARALLEL, "-m", "not slow", *session.posargs, env=COMPILED)


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff (rules and formatting) and the import layering contracts."""
    session.install("-e", ".[lint]")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package, the tests, the examples and the benchmark."""
    session.install("-e", ".[typecheck]", "nox")
    session.run("mypy", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """The controller's own costs: bench/bench.py (options after ``--``), a large apply against a
    real daemon, what a health check costs (real workers, the workers' wire, Ray), and a Ray
    cluster of three nodes run as one service (bench/nodes_bench.py), and a bad release as a
    rolling update against a canary (bench/canary_bench.py), and backends as code served by
    the worker against Ray Serve, HAProxy in front of uvicorn and uvicorn alone
    (bench/serve_bench.py), and a handle's hop against a direct call and Serve's
    DeploymentHandle (bench/handle_bench.py), and batching and model multiplexing against
    Serve's @serve.batch and @serve.multiplexed (bench/model_bench.py). Tables on stdout, JSON
    in bench/results.json, bench/apply_results.json, bench/check_results.json,
    bench/nodes_results.json, bench/canary_results.json, bench/serve_results.json,
    bench/handle_results.json and bench/model_results.json.
    The comparisons with other systems are ``nox -s bench_compare``."""
    # Ray Serve: the node ingresses' opponent in bench/nodes_bench.py, and with uvicorn (as
    # `pip install uvicorn[standard]` gives it: uvloop, httptools) and FastAPI the serving
    # wing's in bench/serve_bench.py (benchmark-only); numpy is bench/model_bench.py's toy model.
    session.install("-e", ".[ray]", "ray[serve]>=2.60", "uvicorn[standard]", "fastapi", "numpy")
    # HAProxy in front of uvicorn is one of serve_bench.py's contenders; wrk is its load.
    _debian(session, {"haproxy": "haproxy", "wrk": "wrk"})
    # 150 crashes a size and store, and 30,000 names of churn (its growth over the last 10,000,
    # as with 100,000): the two longest sections of bench.py, cut to keep the session near 13
    # minutes on 2 cores (about 18 at the script's own counts).
    bench_py = ("--samples", "150", "--churn-names", "30000")
    session.run("python", "bench/bench.py", *(session.posargs or bench_py))
    session.run("python", "bench/apply_bench.py")
    session.run("python", "bench/check_bench.py", *("--only", "a", "--only", "b", "--only", "c"))
    session.run("python", "bench/check_bench.py", "--only", "ray", "--out", "bench/check_ray.json")
    # A Ray cluster as one service: a drain and a node lost under load, the node ingresses.
    session.run("python", "bench/nodes_bench.py", env={"RAY_AUTH_MODE": "disabled"})
    # A bad release as a rolling update and as a canary, on the same load (about 80 s).
    session.run("python", "bench/canary_bench.py")
    # Backends as code (a function, a FastAPI app) against Ray Serve, HAProxy + uvicorn and
    # uvicorn, alternating, and a function backend's first answer from zero (about 4 min).
    session.run("python", "bench/serve_bench.py", env={"RAY_AUTH_MODE": "disabled"})
    # A handle's hop against a direct HTTP call and Serve's DeploymentHandle, a handle's
    # throughput per core against the ingress's, a deadline down a chain (about 3 min).
    session.run("python", "bench/handle_bench.py", env={"RAY_AUTH_MODE": "disabled"})
    # @controller.batch and @controller.multiplexed against @serve.batch and @serve.multiplexed:
    # a toy model's throughput batched and not, p99 at a fixed rate, the hit rate and p99 of
    # 100 models in a Zipf mix over 8 replicas holding 4 each (about 5 min).
    session.run("python", "bench/model_bench.py", env={"RAY_AUTH_MODE": "disabled"})


@nox.session
def bench_compare(session: nox.Session) -> None:
    """The comparisons with other systems, on one local Ray cluster: the race against Ray Serve
    and raw Ray (bench/ray_race.py), the ingress against Serve's proxy, HAProxy and nginx, the
    autoscaler against Serve's, and failover. Split from ``bench`` (issue 31) so that each
    session stays near 15 minutes on 2 cores: together they took 23 minutes."""
    # Ray Serve is the race's opponent, installed here only: the package never depends on it.
    session.install("-e", ".[ray]", "ray[serve]>=2.60")
    # The ingress is also measured against C proxies from Debian, with wrk as the load.
    _debian(session, {"haproxy": "haproxy", "nginx": "nginx-light", "wrk": "wrk"})
    # Fewer rounds than each script's own defaults, to keep the session near 15 minutes.
    ray = {"RAY_AUTH_MODE": "disabled"}
    session.run("python", "bench/ray_race.py", "--rounds", "3", env=ray)
    session.run("python", "bench/ingress_bench.py", *_baseline(session), env=ray)
    session.run("python", "bench/autoscale_bench.py", "--serve-trials", "3", env=ray)
    session.run("python", "bench/failover_bench.py", "--trials", "3", env=ray)


@nox.session
def reliability(session: nox.Session) -> None:
    """The reliability suites in full: every crash point, ten times the random histories and
    fuzzed inputs of the test run, kill -9, and a three-minute soak (``RELIABILITY.md``)."""
    session.install("-e", ".[test,ray]")
    session.run(
        "pytest",
        "-q",
        "-s",
        "-p",
        "no:cacheprovider",
        "tests/core/test_crash_points.py",
        "tests/core/test_histories.py",
        "tests/core/test_hostile_input.py",
        "tests/local/test_kill9.py",
        "tests/core/test_fencing.py",
        "tests/daemon/test_standby_daemon.py",
        "tests/ingress/test_ingress_hostile.py",
        "tests/ingress/test_ingress_attack.py",
        "tests/serving/test_cancel_tree.py",
        "tests/on_ray/test_ray_runtime.py::test_a_driver_killed_mid_rollout_is_taken_over",
        env={
            "RELIABILITY_SCALE": "10",
            "CONTROLLER_ATTACK_S": "60",
            "RAY_AUTH_MODE": "disabled",
            **COMPILED,
        },
    )
    session.run("python", "bench/soak.py", "--seconds", "180", *session.posargs)


@nox.session
def quickstart(session: nox.Session) -> None:
    """The tour in one script: examples/quickstart.py (the main job is `controller run`)."""
    session.install("-e", ".")
    session.run("python", "examples/quickstart.py", *session.posargs)


def _debian(session: nox.Session, wanted: dict[str, str]) -> None:
    """Install the Debian packages whose commands (keys) are missing, where apt-get is."""
    missing = [pkg for cmd, pkg in wanted.items() if not _found(cmd)]
    if not missing or shutil.which("apt-get") is None:
        return
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    session.run(*sudo, "apt-get", "install", "-y", "-q", *missing, external=True)


def _found(command: str) -> bool:
    return shutil.which(command) is not None or os.path.exists(f"/usr/sbin/{command}")


def _baseline(session: nox.Session) -> list[str]:
    """The ingress before the newest change to it, measured beside today's (``--baseline-ref``
    from the environment, e.g. ``INGRESS_BASELINE=c9dd566``)."""
    ref = os.environ.get("INGRESS_BASELINE", "")
    return ["--baseline-ref", ref] if ref else []
