"""The ingress benchmark: the same trivial HTTP replica reached directly, through this project's
ingress (one process, then one per core) and through Ray Serve's proxy; then a skewed workload
(one replica of four ten times slower) at a fixed offered load.

Real processes, real clock. One load generator for every contender (below, ``_load``): plain
non-blocking sockets on epoll, HTTP/1.1 keep-alive, in processes of its own; closed loop (each
connection sends its next request as soon as the answer is in) for throughput, open loop (a
request every 1/rate s, latency counted from when it was due) for the skewed workload.

    python bench/ingress_bench.py [--seconds S] [--conns N] [--gen-procs P] [--profile]

Prints Markdown tables; writes ``bench/ingress_results.json``. Ray Serve is a benchmark-only
dependency (``nox -s bench`` installs it); run with ``RAY_AUTH_MODE=disabled``.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import platform
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import c_proxies
import reaper

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# -- the load generator (run in processes of its own: ``ingress_bench.py _load ...``) ---------


def _request(host: str, port: int, path: str) -> bytes:
    return (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: ingress-bench\r\n\r\n".encode()
    )


def _response_size(buffer: bytes) -> int:
    """The length of the first whole response in `buffer`, or -1 if it is not all in yet."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return -1
    head = buffer[:end].lower()
    at = head.find(b"\r\ncontent-length:")
    if at >= 0:
        total = end + 4 + int(head[at + 17 :].split(b"\r\n", 1)[0])
        return total if len(buffer) >= total else -1
    if b"\r\ntransfer-encoding: chunked" in head:
        last = buffer.find(b"\r\n0\r\n\r\n", end)  # the last chunk (no trailers are sent)
        return -1 if last < 0 else last + 7
    raise ValueError(f"a response with neither length nor chunks: {head[:200]!r}")


def _connect(host: str, port: int, ep: select.epoll) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    ep.register(sock.fileno(), select.EPOLLIN)
    return sock


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def generate(
    host: str,
    port: int,
    path: str,
    conns: int,
    start: float,
    warmup_s: float,
    seconds: float,
    rate: float,
) -> dict[str, Any]:
    """Load `host`:`port` from `start` (a ``time.monotonic()`` instant) for `warmup_s` +
    `seconds`; count only what falls in the last `seconds`. `rate` 0: closed loop over `conns`
    connections; otherwise open loop at `rate` requests a second, on up to `conns`
    connections (a request due when all are busy waits, and its wait counts)."""
    request = _request(host, port, path)
    ep = select.epoll()
    socks: dict[int, socket.socket] = {}
    buffers: dict[int, bytes] = {}
    due: dict[int, float] = {}  # when the request in flight on each connection was due
    for _ in range(conns):
        sock = _connect(host, port, ep)
        socks[sock.fileno()] = sock
        buffers[sock.fileno()] = b""
    window_start, window_end = start + warmup_s, start + warmup_s + seconds
    latencies: list[float] = []
    errors = slow = late_sends = 0
    idle = list(socks)
    backlog: collections.deque[float] = collections.deque()
    interval = 1 / rate if rate else 0.0
    next_due = start
    drain_until = window_end + 10.0  # open loop: answers still awaited, at most this long
    cpu0 = cpu1 = 0.0

    while time.monotonic() < start:
        time.sleep(min(0.01, max(0.0, start - time.monotonic())))

    def send(fd: int, when: float) -> None:
        due[fd] = when
        sent = socks[fd].send(request)
        assert sent == len(request), "a short send of a tiny request"

    if not rate:
        now = time.monotonic()
        for fd in list(idle):
            send(fd, now)
        idle.clear()
    measuring = False
    while True:
        now = time.monotonic()
        if not measuring and now >= window_start:
            measuring, cpu0 = True, _cpu_s()
        if rate:
            while next_due <= now and next_due < window_end:
                backlog.append(next_due)
                next_due += interval
            while backlog and idle:
                when = backlog.popleft()
                if now - when > 0.002:
                    late_sends += when >= window_start
                send(idle.pop(), when)
            if next_due >= window_end and not backlog and len(idle) == len(socks):
                break
            if now >= drain_until:
                errors += len(socks) - len(idle) + len(backlog)
                break
            timeout = max(0.0, next_due - now) if next_due < window_end else 0.05
        else:
            if now >= window_end:
                break
            timeout = min(0.05, window_end - now)
        for fd, _ in ep.poll(timeout):
            data = socks[fd].recv(65536)
            if not data:  # the server closed it: open another in its place
                ep.unregister(fd)
                socks.pop(fd).close()
                buffers.pop(fd)
                when = due.pop(fd, 0.0)
                errors += window_start <= when < window_end
                sock = _connect(host, port, ep)
                socks[sock.fileno()] = sock
                buffers[sock.fileno()] = b""
                if rate:
                    idle.append(sock.fileno())
                else:
                    send(sock.fileno(), time.monotonic())
                continue
            buffer = buffers[fd] + data
            size = _response_size(buffer)
            if size < 0:
                buffers[fd] = buffer
                continue
            response, buffers[fd] = buffer[:size], buffer[size:]
            done = time.monotonic()
            when = due[fd]
            counted = (
                (window_start <= when < window_end) if rate else (window_start <= done < window_end)
            )
            if counted:
                if response[9:12] != b"200":
                    errors += 1
                else:
                    latencies.append(done - when)
                    slow += b'"slow": true' in response
            if rate:
                idle.append(fd)
            elif done < window_end:
                send(fd, done)
    cpu1 = _cpu_s()
    for sock in socks.values():
        sock.close()
    ep.close()
    return {
        "latencies": latencies,
        "errors": errors,
        "slow": slow,
        "late_sends": late_sends,
        "cpu_s": cpu1 - cpu0,
    }


def _load_main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="ingress_bench.py _load")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--conns", type=int, required=True)
    parser.add_argument("--start", type=float, required=True)
    parser.add_argument("--warmup", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--rate", type=float, default=0.0)
    parser.add_argument("--out", type=Path, required=True)
    a = parser.parse_args(argv)
    result = generate(a.host, a.port, a.path, a.conns, a.start, a.warmup, a.seconds, a.rate)
    a.out.write_text(json.dumps(result))


# -- measuring -----------------------------------------------------------------------------


def pct(ordered: Sequence[float], q: float) -> float:
    """The `q` quantile of sorted samples, nearest rank."""
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def _ticks(pid: int) -> int:
    """CPU used by a process so far (all its threads), in clock ticks; 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def _busy_ticks() -> int:
    """CPU used by everything on the machine so far, in clock ticks (all cores)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    values = [int(v) for v in fields]
    return sum(values) - values[3] - values[4]  # less idle and iowait


def children_of(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def load(
    target: tuple[str, int, str],
    *,
    conns: int,
    procs: int,
    warmup_s: float,
    seconds: float,
    rate: float = 0.0,
    groups: dict[str, list[int]] | None = None,
    during: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run the generator in `procs` processes against `target` (host, port, path) and merge
    their figures. `groups`: processes whose CPU over the measured window is reported."""
    host, port, path = target
    tick = os.sysconf("SC_CLK_TCK")
    start = time.monotonic() + 0.6  # time for the generators to start and connect
    with tempfile.TemporaryDirectory(prefix="ibl", dir="/tmp") as tmp:
        outs = [Path(tmp) / f"{i}.json" for i in range(procs)]
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "_load",
                    f"--host={host}",
                    f"--port={port}",
                    f"--path={path}",
                    f"--conns={max(1, conns // procs)}",
                    f"--start={start}",
                    f"--warmup={warmup_s}",
                    f"--seconds={seconds}",
                    f"--rate={rate / procs}",
                    f"--out={out}",
                ]
            )
            for i, out in enumerate(outs)
        ]
        try:
            time.sleep(max(0.0, start + warmup_s - time.monotonic()))
            before = {name: sum(_ticks(p) for p in pids) for name, pids in (groups or {}).items()}
            busy0, t0 = _busy_ticks(), time.monotonic()
            if during is not None:
                during()
            time.sleep(max(0.0, start + warmup_s + seconds - time.monotonic()))
            after = {name: sum(_ticks(p) for p in pids) for name, pids in (groups or {}).items()}
            busy1, t1 = _busy_ticks(), time.monotonic()
            for child in children:
                child.wait(timeout=30)
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
                    child.wait()
        if any(child.returncode for child in children):
            raise RuntimeError(f"a load generator failed against {host}:{port}{path}")
        parts = [json.loads(out.read_text()) for out in outs]
    latencies = sorted(x for part in parts for x in part["latencies"])
    window = t1 - t0
    cpu = {name: (after[name] - before[name]) / tick / window for name in before}
    cpu["generator"] = sum(part["cpu_s"] for part in parts) / seconds
    cpu["machine"] = (busy1 - busy0) / tick / window
    cpu["other"] = cpu["machine"] - sum(v for k, v in cpu.items() if k != "machine")
    return {
        "requests": len(latencies),
        "rps": len(latencies) / seconds,
        "errors": sum(part["errors"] for part in parts),
        "slow_share": sum(part["slow"] for part in parts) / max(1, len(latencies)),
        "late_sends": sum(part["late_sends"] for part in parts),
        "p50_ms": pct(latencies, 0.50) * 1000 if latencies else math.nan,
        "p90_ms": pct(latencies, 0.90) * 1000 if latencies else math.nan,
        "p99_ms": pct(latencies, 0.99) * 1000 if latencies else math.nan,
        "max_ms": latencies[-1] * 1000 if latencies else math.nan,
        "cores_used": cpu,
        "conns": conns,
        "gen_procs": procs,
        "seconds": seconds,
        "offered_rps": rate or None,
    }


def get(url: str, token: str | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_answers(url: str, *, want: int = 200, timeout_s: float = 30.0, times: int = 20) -> None:
    """Wait until `url` answers `want` `times` times in a row (bounded)."""
    deadline = time.monotonic() + timeout_s
    streak = 0
    while streak < times:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer {want} within {timeout_s:g} s")
        try:
            status, _ = get(url, timeout=2)
        except OSError:
            status = 0
        streak = streak + 1 if status == want else 0
        if status != want:
            time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL if it is still there after `timeout_s`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kill_leftovers(pids: Sequence[int]) -> None:
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# -- the contenders ------------------------------------------------------------------------

BACKENDS = """
[backends.bench]
entrypoint = "ingress_replica:Trivial"
route_prefix = "/bench"
num_replicas = 2
version = "v1"

[backends.fast4]
entrypoint = "ingress_replica:Trivial"
route_prefix = "/fast"
num_replicas = 4
version = "v1"
init_kwargs = {{ work_ms = {fast_ms} }}

[backends.fast3]
entrypoint = "ingress_replica:Trivial"
route_prefix = "/fast3"
num_replicas = 3
version = "v1"
init_kwargs = {{ work_ms = {fast_ms} }}

[backends.skew4]
entrypoint = "ingress_replica:Trivial"
route_prefix = "/skew"
num_replicas = 4
version = "v1"
init_kwargs = {{ work_ms = {fast_ms}, slow_ms = {slow_ms}, slow_claim = "{claim}" }}
"""
FAST_MS, SLOW_MS = 2.0, 20.0


class Daemon:
    """A controller daemon with its own state dir, its own ingress, and our backends."""

    def __init__(
        self,
        state_dir: Path,
        ingress_port: int,
        pythonpath: Path = HERE,
        extra: Sequence[str] = (),
    ) -> None:
        """`extra`: more options of ``controller run`` (``--ingress-workers 1``)."""
        self.dir = state_dir
        self.ingress_port = ingress_port
        self.log = (state_dir / "daemon.log").open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "controller",
                "--state-dir",
                str(state_dir),
                "run",
                "--listen",
                "127.0.0.1:0",
                "--ingress-listen",
                f"127.0.0.1:{ingress_port}",
                "--pythonpath",
                str(pythonpath),
                *extra,
            ],
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 30
            info = state_dir / "daemon.json"
            while not info.exists():
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"the daemon did not start: see {state_dir / 'daemon.log'}")
                time.sleep(0.05)
            time.sleep(0.05)  # written atomically, but read once whole
            self.url = str(json.loads(info.read_text())["url"])
            self.token = (state_dir / "token").read_text().strip()
            wait_answers(f"{self.url}/healthz", times=1)
        except BaseException:
            self.shutdown()  # what it started so far (its ingress outlives a SIGTERM)
            raise

    def cli(self, *args: str, timeout_s: float = 120.0) -> None:
        subprocess.run(
            [sys.executable, "-m", "controller", "--state-dir", str(self.dir), *args],
            cwd=ROOT,
            check=True,
            timeout=timeout_s,
            stdout=subprocess.DEVNULL,
        )

    def replicas(self) -> dict[str, list[tuple[str, int]]]:
        """Per backend: each serving replica's (address, pid)."""
        status, body = get(f"{self.url}/api/v1/backends", self.token)
        assert status == 200, body
        return {
            b["name"]: [(r["address"], r["pid"]) for r in b["replicas"] if r["address"]]
            for b in json.loads(body)["backends"]
        }

    def ingress_pids(self) -> list[int]:
        """Its ingress processes (one per core by default)."""
        status, body = get(f"{self.url}/api/v1/ingress", self.token)
        assert status == 200, body
        return [int(p["pid"]) for p in json.loads(body)["processes"] if p["pid"]]

    def shutdown(self) -> None:
        try:
            self.cli("shutdown", timeout_s=90)
            self.proc.wait(30)
        except (subprocess.SubprocessError, OSError) as exc:
            print(f"daemon shutdown failed ({exc}); killing it", file=sys.stderr)
        finally:
            stop(self.proc)
            self.log.close()


@contextmanager
def daemon_with(backends: str, prefix: str) -> Iterator[Daemon]:
    """Our daemon (one ingress process) with `backends` (a manifest's text) applied, in a state
    dir of its own; stopped with ``controller shutdown`` (its ingress outlives a SIGTERM), its
    state dir removed."""
    state_dir = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # mode 0700
    try:
        (state_dir / "backends.toml").write_text(backends)
        ours = Daemon(state_dir, free_port(), extra=("--ingress-workers", "1"))
        try:
            ours.cli("apply", "-f", str(state_dir / "backends.toml"), "--wait")
            yield ours
        finally:
            ours.shutdown()
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


class StandaloneIngress:
    """``controller ingress --workers N``, following the daemon."""

    def __init__(self, daemon: Daemon, port: int, workers: int) -> None:
        self.port = port
        self.log_path = daemon.dir / f"ingress-{port}.log"
        self.log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "controller",
                "--url",
                daemon.url,
                # One argument: a token may begin with "-", which argparse takes for an option.
                f"--token={daemon.token}",
                "ingress",
                "--listen",
                f"127.0.0.1:{port}",
                "--workers",
                str(workers),
            ],
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while self.log_path.read_text().count("serving on") < workers:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(
                    f"`controller ingress` did not start: {self.log_path.read_text()[-3000:]}"
                )
            time.sleep(0.05)
        self.pids = [self.proc.pid, *children_of(self.proc.pid)]

    def close(self) -> None:
        stop(self.proc)
        self.log.close()
        kill_leftovers([p for p in self.pids[1:] if _ticks(p)])


class ServeTrivial:
    """The Ray Serve deployment: the same small JSON answer, at once (Serve encodes it)."""

    def __init__(self) -> None:
        self.body = {"replica": f"serve-{os.getpid()}", "ok": True}

    async def __call__(self, request: Any) -> dict[str, Any]:
        return self.body


@contextmanager
def ray_cluster(tmp: Path) -> Iterator[None]:
    """A local Ray cluster, as the race on Ray starts it."""
    import logging

    import ray

    os.environ["RAY_TMPDIR"] = str(tmp)  # short: Ray's Unix socket paths
    ray.init(num_cpus=4, include_dashboard=False, logging_level=logging.WARNING)
    try:
        yield
    finally:
        ray.shutdown()


@contextmanager
def serve_app(
    port: int,
    *,
    access_log: bool,
    target: Any = ServeTrivial,
    name: str = "Trivial",
    route_prefix: str = "/bench",
    num_replicas: int = 2,
) -> Iterator[None]:
    """Serve's proxy on `port` and a deployment of `target` (by default the trivial class, two
    replicas) at `route_prefix`. Serve logs every request by default; `access_log` False turns
    that off (proxy and replicas), as the controller's ingress has it by default."""
    from ray import serve

    logging_config = {"enable_access_log": access_log}
    serve.start(
        http_options={"host": "127.0.0.1", "port": port},
        logging_config=None if access_log else logging_config,
    )
    try:
        deployment = serve.deployment(
            name=name,
            num_replicas=num_replicas,
            max_ongoing_requests=100,  # as the controller's default (Serve's own is 5)
            ray_actor_options={"num_cpus": 0.25},
        )(target)
        serve.run(
            deployment.bind(),
            name="bench",
            route_prefix=route_prefix,
            logging_config=None if access_log else logging_config,
        )
        yield
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]


def ray_pids(prefix: str) -> list[int]:
    """Processes whose title starts with `prefix` (Ray names its workers ``ray::Actor``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().split(b"\0", 1)[0]
        except OSError:
            continue
        if title.startswith(prefix.encode()):
            pids.append(int(entry.name))
    return pids


# -- the run -------------------------------------------------------------------------------


def profile_ingress(pid: int, target: tuple[str, int, str], args: argparse.Namespace) -> Any:
    """py-spy over the ingress process during a closed-loop run: its costliest frames."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    with tempfile.TemporaryDirectory(prefix="ibp", dir="/tmp") as tmp:
        out = Path(tmp) / "profile.txt"
        spy: list[subprocess.Popen[bytes]] = []

        def start_spy() -> None:
            spy.append(
                subprocess.Popen(
                    [
                        py_spy,
                        "record",
                        "--pid",
                        str(pid),
                        "--duration",
                        str(int(args.seconds)),
                        "--rate",
                        "500",
                        "--threads",
                        "--format",
                        "raw",
                        "--output",
                        str(out),
                        "--nonblocking",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

        figures = load(
            target,
            conns=args.conns,
            procs=args.gen_procs,
            warmup_s=args.warmup,
            seconds=args.seconds,
            during=start_spy,
        )
        for proc in spy:
            try:
                proc.wait(args.seconds + 20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if not out.exists():
            return {"error": "py-spy wrote nothing (is ptrace allowed?)"}
        own: collections.Counter[str] = collections.Counter()
        inclusive: collections.Counter[str] = collections.Counter()
        threads: collections.Counter[str] = collections.Counter()
        areas: collections.Counter[str] = collections.Counter()
        total = 0
        for line in out.read_text().splitlines():
            stack, _, count_text = line.rpartition(" ")
            count = int(count_text)
            raw = [f for f in stack.split(";") if f]
            thread, *frames = [_short(f) for f in raw]
            total += count
            threads[thread] += count
            if frames:
                own[frames[-1]] += count
                areas[_area(raw[-1])] += count
            for frame in set(frames):
                inclusive[frame] += count
    return {
        "rps_while_profiled": figures["rps"],
        "samples": total,
        "threads": [(t, c / total) for t, c in threads.most_common()],
        "own_by_area": [(a, c / total) for a, c in areas.most_common()],
        "own": [(f, c / total) for f, c in own.most_common(25)],
        "inclusive": [(f, c / total) for f, c in inclusive.most_common(60)],
    }


def _area(frame: str) -> str:
    """Where a frame's own time goes: the socket calls (the kernel's send and receive, which
    trio's wrapper makes), h11, trio, the ingress's own code, or the rest."""
    name, _, where = frame.partition(" (")
    if name.endswith(("._nonblocking_helper", "_make_simple_sock_method_wrapper.<locals>.wrapper")):
        return "socket calls (send/recv, in the kernel)"
    where = "/" + where  # py-spy gives site-packages files from the package down
    for marker, area in (
        ("/h11/", "h11 (HTTP parsing and framing)"),
        ("/trio/", "trio (scheduling, cancel scopes, I/O waits)"),
        ("/outcome/", "trio (scheduling, cancel scopes, I/O waits)"),
        ("/controller/ingress/", "the ingress's own code"),
        ("/prometheus_client/", "metrics (prometheus_client)"),
    ):
        if marker in where:
            return area
    return "other (stdlib: contextlib, attrs, ...)"


def _short(frame: str) -> str:
    # py-spy raw frames: "function (path/to/file.py:line)"; keep the file's tail, drop the line.
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    parts = where.split("/")
    return f"{name} ({'/'.join(parts[-2:])})"


def wrk_load(
    target: tuple[str, int, str], groups: dict[str, list[int]], args: argparse.Namespace
) -> dict[str, Any]:
    """``wrk`` against `target` (2 threads, `args.conns` connections), with the CPU of each
    group over its run."""
    host, port, path = target
    tick = os.sysconf("SC_CLK_TCK")
    url = f"http://{host}:{port}{path}"
    c_proxies.wrk(url, conns=args.conns, threads=2, seconds=args.warmup)  # warm-up
    before = {name: sum(_ticks(p) for p in pids) for name, pids in groups.items()}
    busy0, t0 = _busy_ticks(), time.monotonic()
    figures = c_proxies.wrk(url, conns=args.conns, threads=2, seconds=args.seconds)
    window = time.monotonic() - t0
    after = {name: sum(_ticks(p) for p in pids) for name, pids in groups.items()}
    cpu = {name: (after[name] - before[name]) / tick / window for name in groups}
    cpu["machine"] = (_busy_ticks() - busy0) / tick / window
    figures["cores_used"] = cpu
    return figures


def measure(
    name: str,
    target: tuple[str, int, str],
    groups: dict[str, list[int]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    print(f"{name}: one connection ...", file=sys.stderr)
    unloaded = load(target, conns=1, procs=1, warmup_s=0.5, seconds=args.idle_seconds)
    print(f"{name}: {args.conns} connections ...", file=sys.stderr)
    loaded = load(
        target,
        conns=args.conns,
        procs=args.gen_procs,
        warmup_s=args.warmup,
        seconds=args.seconds,
        groups=groups,
    )
    print(
        f"  {loaded['rps']:.0f} req/s, p50 {loaded['p50_ms']:.2f} ms; unloaded p50 "
        f"{unloaded['p50_ms']:.3f} ms; cores {_cores(loaded)}",
        file=sys.stderr,
    )
    figures: dict[str, Any] = {"unloaded": unloaded, "loaded": loaded}
    if c_proxies.have_wrk() and not args.no_wrk:
        print(f"{name}: wrk, {args.conns} connections ...", file=sys.stderr)
        figures["wrk"] = wrk_load(target, groups, args)
        w = figures["wrk"]
        print(
            f"  wrk: {w['rps']:.0f} req/s, p50 {w['p50_ms']} ms; cores {_cores(w)}",
            file=sys.stderr,
        )
    return figures


def _cores(figures: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in figures["cores_used"].items())


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"contenders": {}}
    state_dir = Path(tempfile.mkdtemp(prefix="ib", dir="/tmp"))  # mode 0700
    (state_dir / "backends.toml").write_text(
        BACKENDS.format(fast_ms=FAST_MS, slow_ms=SLOW_MS, claim=state_dir / "slow.claim")
    )
    daemon_port, w1_port, w2_port = free_port(), free_port(), free_port()
    daemon = Daemon(state_dir, daemon_port)
    standalone: list[StandaloneIngress] = []
    try:
        daemon.cli("apply", "-f", str(state_dir / "backends.toml"), "--wait")
        replicas = daemon.replicas()
        bench_pids = [pid for _, pid in replicas["bench"]]
        standalone.append(StandaloneIngress(daemon, w1_port, 1))
        standalone.append(StandaloneIngress(daemon, w2_port, 2))
        w1, w2 = standalone
        for port in (daemon_port, w1_port, w2_port):
            wait_answers(f"http://127.0.0.1:{port}/bench")
        direct_host, _, direct_port = replicas["bench"][0][0].rpartition(":")
        plans: list[tuple[str, tuple[str, int, str], dict[str, list[int]]]] = [
            (
                "direct",
                (direct_host, int(direct_port), "/bench"),
                {"proxy": [], "replicas": [replicas["bench"][0][1]]},
            ),
            (
                "ingress_daemon",
                ("127.0.0.1", daemon_port, "/bench"),
                {
                    "proxy": daemon.ingress_pids(),
                    "replicas": bench_pids,
                    "daemon": [daemon.proc.pid],
                },
            ),
            (
                "ingress_1",
                ("127.0.0.1", w1_port, "/bench"),
                {"proxy": w1.pids, "replicas": bench_pids, "daemon": [daemon.proc.pid]},
            ),
            (
                "ingress_2",
                ("127.0.0.1", w2_port, "/bench"),
                {"proxy": w2.pids, "replicas": bench_pids, "daemon": [daemon.proc.pid]},
            ),
        ]
        for name, target, groups in plans:
            results["contenders"][name] = measure(name, target, groups, args)
        addresses = [address for address, _ in replicas["bench"]]
        yardsticks = [
            ("haproxy", c_proxies.haproxy),
            ("nginx", c_proxies.nginx),
        ]
        for name, start in yardsticks:
            port = free_port()
            with start(port, addresses) as pids:
                if pids is None:
                    print(f"{name}: not installed; skipped", file=sys.stderr)
                    continue
                wait_answers(f"http://127.0.0.1:{port}/bench")
                groups = {"proxy": pids, "replicas": bench_pids, "daemon": [daemon.proc.pid]}
                results["contenders"][name] = measure(
                    name, ("127.0.0.1", port, "/bench"), groups, args
                )
        if args.baseline_ref:
            port = free_port()
            with c_proxies.baseline_ingress(
                args.baseline_ref, daemon.url, daemon.token, port
            ) as pids:
                wait_answers(f"http://127.0.0.1:{port}/bench")
                groups = {"proxy": pids, "replicas": bench_pids, "daemon": [daemon.proc.pid]}
                results["contenders"]["before_1"] = measure(
                    "before_1", ("127.0.0.1", port, "/bench"), groups, args
                )
                results["baseline_ref"] = args.baseline_ref

        # The skewed workload, through the daemon's ingress: open loop at a fixed rate, the
        # two cases taking turns (so that a burst of load from elsewhere hits both alike).
        rate = args.skew_load * 4 * 1000 / FAST_MS
        results["skew"] = {"offered_rps": rate, "fast_ms": FAST_MS, "slow_ms": SLOW_MS}
        # fast3, the three fast replicas alone, is the floor: what a router that never used
        # the slow replica would give (the three carry the load the four shared).
        cases = (("fast4", "/fast"), ("skew4", "/skew"), ("fast3", "/fast3"))
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in cases}
        for _, prefix in cases:
            wait_answers(f"http://127.0.0.1:{daemon_port}{prefix}", times=4)
        for r in range(args.skew_rounds):
            for name, prefix in cases:
                print(f"{name}: open loop at {rate:.0f} req/s, round {r + 1}", file=sys.stderr)
                figures = load(
                    ("127.0.0.1", daemon_port, prefix),
                    conns=args.open_conns,
                    procs=1,
                    warmup_s=args.warmup,
                    seconds=args.skew_seconds,
                    rate=rate,
                    groups={
                        "proxy": [daemon.proc.pid],
                        "replicas": [pid for _, pid in replicas[name]],
                    },
                )
                print(
                    f"  p50 {figures['p50_ms']:.2f} ms, p99 {figures['p99_ms']:.2f} ms, to the "
                    f"slow replica {figures['slow_share']:.1%}; cores {_cores(figures)}",
                    file=sys.stderr,
                )
                rounds[name].append(figures)
        for name, runs in rounds.items():
            results["skew"][name] = {
                **{
                    key: statistics.median(run[key] for run in runs)
                    for key in ("rps", "p50_ms", "p90_ms", "p99_ms", "slow_share")
                },
                "max_ms": max(run["max_ms"] for run in runs),
                "errors": sum(run["errors"] for run in runs),
                "p99_ms_rounds": [run["p99_ms"] for run in runs],
                "rounds": runs,
            }

        if args.profile:
            print("profiling the 1-process ingress (py-spy) ...", file=sys.stderr)
            results["profile"] = profile_ingress(w1.pids[0], ("127.0.0.1", w1_port, "/bench"), args)
    finally:
        for ingress in standalone:
            ingress.close()
        daemon.shutdown()
        shutil.rmtree(state_dir, ignore_errors=True)

    if not args.no_serve:
        with tempfile.TemporaryDirectory(prefix="ibr", dir="/tmp") as tmp, ray_cluster(Path(tmp)):
            for name, access_log in (("serve", True), ("serve_quiet", False)):
                port = free_port()
                with serve_app(port, access_log=access_log):
                    print(f"{name}: Ray Serve started", file=sys.stderr)
                    wait_answers(f"http://127.0.0.1:{port}/bench", timeout_s=60)
                    groups = {
                        "proxy": ray_pids("ray::ProxyActor"),
                        "replicas": ray_pids("ray::ServeReplica"),
                    }
                    results["contenders"][name] = measure(
                        name, ("127.0.0.1", port, "/bench"), groups, args
                    )
    return results


# -- the report ----------------------------------------------------------------------------

LABELS = {
    "direct": "direct to one replica (no proxy)",
    "ingress_daemon": "our ingress, the daemon's (`controller run`: one process per core)",
    "ingress_1": "our ingress, `controller ingress --workers 1`, 2 replicas",
    "ingress_2": "our ingress, `controller ingress --workers 2`, 2 replicas",
    "before_1": "the ingress before this change, `controller ingress --workers 1`",
    "haproxy": "HAProxy 2.6 (Debian), `nbthread 1`, keep-alive to the replicas",
    "nginx": "nginx 1.22 (Debian), `worker_processes 1`, keep-alive to the replicas",
    "serve": "Ray Serve's proxy, 2 replicas (Serve's defaults: access log on)",
    "serve_quiet": "Ray Serve's proxy, 2 replicas, access log off",
}


def _per_request_us(figures: dict[str, Any]) -> float:
    return float(figures["cores_used"]["proxy"] / figures["rps"] * 1e6)


def _per_core(figures: dict[str, Any]) -> float:
    return float(figures["rps"] / max(figures["cores_used"]["proxy"], 1e-9))


def _best_run(contender: dict[str, Any]) -> dict[str, Any]:
    """wrk's figures where wrk ran, else our generator's."""
    return dict(contender.get("wrk") or contender["loaded"])


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    c = results["contenders"]
    out: list[dict[str, Any]] = []
    one = _best_run(c["ingress_1"])
    gen = "wrk" if "wrk" in c["ingress_1"] else "our generator"
    us = _per_request_us(one)
    out.append(
        {
            "target": f"ingress CPU per proxied small GET <= 120 us (one process, {gen})",
            "value": f"{us:.0f} us",
            "met": us <= 120,
        }
    )
    if "before_1" in c:
        before = _best_run(c["before_1"])
        for label, ours, theirs in (
            ("req/s", one["rps"], before["rps"]),
            ("req/s per core", _per_core(one), _per_core(before)),
        ):
            ratio = ours / theirs
            out.append(
                {
                    "target": f"4x the {label} of one ingress process before this change "
                    f"({results.get('baseline_ref', '')[:7]}, {gen}, side by side)",
                    "value": f"{ratio:.2f}x ({ours:,.0f} / {theirs:,.0f})",
                    "met": ratio >= 4,
                }
            )
    direct = c["direct"]["unloaded"]["p50_ms"]
    for name in ("ingress_1", "ingress_daemon"):
        added = c[name]["unloaded"]["p50_ms"] - direct
        out.append(
            {
                "target": f"added p50 over direct <= 0.2 ms, one connection ({name})",
                "value": f"{added:.3f} ms",
                "met": added <= 0.2,
            }
        )
    for name in ("haproxy", "nginx"):
        if name in c:
            share = _per_core(one) / _per_core(_best_run(c[name]))
            out.append(
                {
                    "target": f"(no target) our req/s per core as a share of {name}'s",
                    "value": f"{share:.1%}",
                    "met": True,
                }
            )
    serves = [n for n in ("serve", "serve_quiet") if n in c]
    if serves:
        # Against Serve's better figure of the two (with and without its access log).
        serve = max(serves, key=lambda n: float(c[n]["loaded"]["rps"]))
        for name in ("ingress_daemon", "ingress_1"):
            ratio = c[name]["loaded"]["rps"] / c[serve]["loaded"]["rps"]
            out.append(
                {
                    "target": f"throughput >= 2x Ray Serve's proxy ({name} / {serve})",
                    "value": f"{ratio:.2f}x",
                    "met": ratio >= 2,
                }
            )
    skew = results["skew"]
    ratio = skew["skew4"]["p99_ms"] / skew["fast4"]["p99_ms"]
    floor = skew["fast3"]["p99_ms"] / skew["fast4"]["p99_ms"]
    out.append(
        {
            "target": "skewed p99 <= 1.5x the all-fast p99",
            "value": f"{ratio:.2f}x (the floor, three fast replicas alone: {floor:.2f}x)",
            "met": ratio <= 1.5,
        }
    )
    return out


def print_tables(results: dict[str, Any]) -> None:
    conns = results["config"]["conns"]
    print(
        f"| contender | req/s ({conns} conns) | p50 / p99 under load | p50 / p99, one connection "
        "| cores used: proxy / replicas / generator / other / all "
        "| CPU per request: proxy / replicas |"
    )
    print("|---|---|---|---|---|---|")
    for name, figures in results["contenders"].items():
        lo, un = figures["loaded"], figures["unloaded"]
        cores = lo["cores_used"]
        other = cores["machine"] - cores["proxy"] - cores["replicas"] - cores["generator"]
        print(
            f"| {LABELS[name]} | {lo['rps']:,.0f} | {lo['p50_ms']:.2f} / {lo['p99_ms']:.2f} ms | "
            f"{un['p50_ms']:.3f} / {un['p99_ms']:.3f} ms | {cores['proxy']:.2f} / "
            f"{cores['replicas']:.2f} / {cores['generator']:.2f} / {other:.2f} / "
            f"{cores['machine']:.2f} | {cores['proxy'] / lo['rps'] * 1e6:.0f} / "
            f"{cores['replicas'] / lo['rps'] * 1e6:.0f} us |"
        )
    if any("wrk" in f for f in results["contenders"].values()):
        print()
        print(
            f"| contender, under wrk (2 threads, {conns} conns) | req/s | p50 / p99 | "
            "cores: proxy / all | CPU per request: proxy | req/s per proxy core |"
        )
        print("|---|---|---|---|---|---|")
        for name, figures in results["contenders"].items():
            w = figures.get("wrk")
            if not w:
                continue
            cores = w["cores_used"]
            proxy = cores.get("proxy", 0.0)
            per_core = f"{w['rps'] / proxy:,.0f}" if proxy > 0.01 else "-"
            per_request = f"{proxy / w['rps'] * 1e6:.0f} us" if proxy > 0.01 else "-"
            print(
                f"| {LABELS[name]} | {w['rps']:,.0f} | {w['p50_ms']:.2f} / {w['p99_ms']:.2f} ms "
                f"| {proxy:.2f} / {cores['machine']:.2f} | {per_request} | {per_core} |"
            )
    skew = results["skew"]
    print()
    print(
        f"| open loop at {skew['offered_rps']:,.0f} req/s (median of rounds) "
        "| achieved req/s | p50 | p99 | p99 of each round | max | to the slow replica | errors |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, label in (
        ("fast4", f"all fast ({FAST_MS:g} ms each, one at a time)"),
        ("skew4", f"one slow ({SLOW_MS:g} ms), three fast"),
        ("fast3", "the three fast alone (the floor: the slow one never used)"),
    ):
        f = skew[name]
        print(
            f"| {label} | {f['rps']:,.0f} | {f['p50_ms']:.2f} ms | {f['p99_ms']:.2f} ms | "
            f"{' / '.join(f'{x:.1f}' for x in f['p99_ms_rounds'])} ms | {f['max_ms']:.1f} ms | "
            f"{f['slow_share']:.1%} | {f['errors']} |"
        )
    print()
    print("| target | figure | met |")
    print("|---|---|---|")
    for t in results["targets"]:
        print(f"| {t['target']} | {t['value']} | {'yes' if t['met'] else 'no'} |")
    profile = results.get("profile")
    if profile and "own" in profile:
        print()
        print(f"py-spy, 1-process ingress ({profile['samples']} samples): own time")
        for area, share in profile["own_by_area"]:
            print(f"  {share:6.1%}  {area}")


def _provenance() -> dict[str, str]:
    """What was measured (the commit, and whether the ingress's code differed from it) and
    the scheduling group the run was in (``/proc/self/autogroup``: its nice value)."""
    out: dict[str, str] = {}
    with suppress(OSError, subprocess.SubprocessError):
        out["commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "controller"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        out["controller_changed_since_commit"] = "yes" if changed.strip() else "no"
    with suppress(OSError):
        out["autogroup"] = Path("/proc/self/autogroup").read_text().strip()
    return out


def main() -> None:
    reaper.leave_nothing()
    if len(sys.argv) > 1 and sys.argv[1] == "_load":
        _load_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description="ingress vs direct vs Ray Serve's proxy")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured, closed loop")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--idle-seconds", type=float, default=3.0, help="one connection")
    parser.add_argument("--conns", type=int, default=32, help="closed-loop connections")
    parser.add_argument("--gen-procs", type=int, default=2, help="load generator processes")
    parser.add_argument("--skew-load", type=float, default=0.6, help="of 4 fast replicas")
    parser.add_argument("--skew-seconds", type=float, default=5.0, help="each round")
    parser.add_argument("--skew-rounds", type=int, default=3)
    parser.add_argument("--open-conns", type=int, default=128, help="open-loop connections")
    parser.add_argument("--no-serve", action="store_true", help="skip Ray Serve")
    parser.add_argument("--no-wrk", action="store_true", help="skip the wrk runs")
    parser.add_argument(
        "--baseline-ref",
        default="",
        help="also measure `controller ingress` as this git commit has it (a worktree)",
    )
    parser.add_argument("--profile", action="store_true", help="py-spy the 1-process ingress")
    parser.add_argument("--out", type=Path, default=HERE / "ingress_results.json")
    args = parser.parse_args()
    started = time.monotonic()
    before = _provenance()
    results = run(args)
    results["targets"] = targets(results)
    results["config"] = {
        k: v for k, v in vars(args).items() if k not in ("out", "profile", "no_serve")
    }
    results["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "wall_s": round(time.monotonic() - started, 1),
    }
    with suppress(ImportError):
        import ray

        results["machine"]["ray"] = ray.__version__
    results["machine"].update(_provenance())
    results["machine"]["code_changed_during_run"] = (
        "yes" if before != _provenance() else "no"  # the ingress under test moved mid-run
    )
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print_tables(results)


if __name__ == "__main__":
    main()
