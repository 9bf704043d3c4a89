"""The ingress benchmark's yardsticks: HAProxy and nginx from Debian as plain reverse proxies
(keep-alive to the same replicas, least-connections, no logging), the previous commit's ingress
from a git worktree, and ``wrk`` as a load generator everyone knows.

Each proxy gets one core's worth of workers (HAProxy ``nbthread 1``, nginx ``worker_processes
1``), so that its req/s is per core, as our one-process figure is. ``nox -s bench`` installs
them (``apt-get install haproxy nginx-light wrk``); a missing one is skipped, and said so."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _binary(name: str) -> str | None:
    """Debian puts servers in /usr/sbin, which a user's PATH may lack."""
    found = shutil.which(name) or f"/usr/sbin/{name}"
    return found if Path(found).exists() else None


def _wait_listening(port: int, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    import socket

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited at start: {log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen within 15 s: {log.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def haproxy(port: int, replicas: Sequence[str]) -> Iterator[list[int] | None]:
    """HAProxy on `port` in front of `replicas` (``host:port``); yields its pids, or None if
    it is not installed."""
    binary = shutil.which("haproxy") or (
        "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None
    )
    if binary is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="ibh", dir="/tmp") as tmp:
        config = Path(tmp) / "haproxy.cfg"
        servers = "\n".join(f"    server r{i} {a}" for i, a in enumerate(replicas))
        config.write_text(
            f"""global
    nbthread 1
    maxconn 5000
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    option http-keep-alive
    http-reuse always
frontend bench
    bind 127.0.0.1:{port}
    default_backend replicas
backend replicas
    balance leastconn
{servers}
"""
        )
        log = Path(tmp) / "haproxy.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([binary, "-f", str(config), "-db"], stdout=out, stderr=out)
        try:
            _wait_listening(port, proc, "haproxy", log)
            yield [proc.pid]
        finally:
            _stop(proc)


@contextmanager
def nginx(port: int, replicas: Sequence[str]) -> Iterator[list[int] | None]:
    """nginx (one worker process) on `port` in front of `replicas`; yields the master's and
    the worker's pids, or None if it is not installed."""
    binary = shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )
    if binary is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="ibn", dir="/tmp") as tmp:
        servers = "\n".join(f"        server {a};" for a in replicas)
        config = Path(tmp) / "nginx.conf"
        config.write_text(
            f"""worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 5000; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream replicas {{
        least_conn;
{servers}
        keepalive 64;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://replicas;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""
        )
        log = Path(tmp) / "stderr.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([binary, "-p", tmp, "-c", str(config)], stdout=out, stderr=out)
        try:
            _wait_listening(port, proc, "nginx", log)
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            yield [proc.pid, *map(int, children)]
        finally:
            _stop(proc)


@contextmanager
def baseline_ingress(ref: str, url: str, token: str, port: int) -> Iterator[list[int]]:
    """`controller ingress --workers 1` as the commit `ref` has it (a git worktree), following
    the same daemon: yields its pid."""
    with tempfile.TemporaryDirectory(prefix="ibb", dir="/tmp") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), ref],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        log = Path(tmp) / "ingress.log"
        try:
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "controller",
                        *("--url", url, f"--token={token}"),
                        *("ingress", "--listen", f"127.0.0.1:{port}"),
                    ],
                    cwd=tree,
                    env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                    stdout=out,
                    stderr=out,
                )
            try:
                _wait_listening(port, proc, f"the ingress of {ref}", log)
                yield [proc.pid]
            finally:
                _stop(proc)
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True
            )


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


def wrk(url: str, *, conns: int, threads: int, seconds: float) -> dict[str, Any]:
    """One ``wrk`` run (HTTP/1.1 keep-alive, closed loop): req/s, latency percentiles and
    errors as wrk reports them."""
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{conns}", f"-d{seconds:g}s", "--latency", url],
        capture_output=True,
        text=True,
        timeout=seconds + 30,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    percentiles = {
        q: _ms(value, unit)
        for q, value, unit in re.findall(r"^\s+(50|90|99)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    }
    return {
        "rps": rps,
        "requests": total,
        "non_2xx": int(errors.group(1)) if errors else 0,
        "socket_errors": socket_errors.group(1).strip() if socket_errors else "",
        "p50_ms": percentiles.get("50"),
        "p90_ms": percentiles.get("90"),
        "p99_ms": percentiles.get("99"),
        "conns": conns,
        "threads": threads,
        "seconds": seconds,
    }


def _ms(value: str, unit: str) -> float:
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
