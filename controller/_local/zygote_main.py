"""The fork server ("zygote") of LocalRuntime: a process that has imported the worker's machinery
once and forks a worker from itself for each replica, in a millisecond or two, where a fresh
``python -m controller.worker`` spends a hundred and more on starting Python and importing.

LocalRuntime starts it as ``python -P -m controller._local.zygote_main RUNTIME_DIR --control-fd N
--parent PID [--pythonpath DIR]... [--preload MODULE]...``; nobody runs it by hand. It speaks on
its control socket (a SOCK_SEQPACKET socketpair: one JSON object per message, one reply per
request):

- once ready it sends ``{"ok": true, "pid": P}`` (or ``{"ok": false, "error": ...}``, and exits,
  if a preload failed);
- ``{"op": "fork", "spec": ..., "log": ..., "pid_file": ...}``, with the replica's listening
  socket attached (SCM_RIGHTS): it forks a worker and answers ``{"ok": true, "pid": C}``;
- ``{"op": "reap", "pid": C}``: it reaps that exited worker and answers its wait status.

It never runs trio and never starts a thread, so that fork is safe: the child is a copy of a
single-threaded process. It reaps no worker unasked: a dead worker stays a zombie, whose exit
status the runtime reads, until the runtime has read it. It dies with the controller's process
(PR_SET_PDEATHSIG), but its workers do not: Linux clears that setting on fork, and each worker
leads a session of its own, exactly as a spawned one does.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import json
import os
import signal
import socket
import sys
import traceback
from typing import Any, NoReturn

# Imported here, once, so that no worker forked from this process imports them again: that is
# the whole point of the zygote.
import trio  # noqa: F401  # what the worker runs on

from .._ports import context  # noqa: F401  # the worker's own imports
from .._ports.hosting import add_to_path
from . import logs, wire, worker  # noqa: F401
from .worker_process import run

_PR_SET_PDEATHSIG = 1
# Requests are small (three paths); replies smaller.
_MAX_MESSAGE = 64 << 10


def main() -> NoReturn:
    parser = argparse.ArgumentParser(prog="controller._local.zygote_main")
    parser.add_argument("runtime_dir")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--pythonpath", action="append", default=[])
    parser.add_argument("--preload", action="append", default=[])
    args = parser.parse_args()
    _die_with(args.parent)
    control = socket.socket(fileno=args.control_fd)
    error = _prepare(args.pythonpath, args.preload, args.control_fd)
    if error is not None:
        sys.stderr.write(error)
        control.send(json.dumps({"ok": False, "error": error}).encode())
        os._exit(1)
    control.send(json.dumps({"ok": True, "pid": os.getpid()}).encode())
    _serve(control)


def _die_with(parent: int) -> None:
    """SIGKILL when the controller's process dies, however it dies: a zygote left behind would
    hold nothing useful. Then check that the parent is still the one that started us, since it
    may have died before the setting was made (we would be init's child by then)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:
        os._exit(0)


def _prepare(pythonpath: list[str], preload: list[str], control_fd: int) -> str | None:
    """Import what the workers will use; the failure as text, or None."""
    add_to_path(pythonpath)
    for name in preload:
        try:
            importlib.import_module(name)
        except BaseException:
            return f"preloading {name!r} failed:\n{traceback.format_exc()}"
    # A thread (started by a preloaded module) may hold a lock at the instant of a fork, which
    # the child then can never take: refuse, and the runtime spawns its workers instead.
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        return (
            f"after the preloads this process runs {threads} threads; a fork server must stay "
            "single-threaded (preload modules that start no thread on import)\n"
        )
    # Each worker closes every descriptor but its own: one that a preloaded module holds would
    # be closed under its Python object, which might then close the number reused by another.
    held = [fd for fd in _open_fds() if fd > 2 and fd != control_fd]
    if held:
        targets = ", ".join(_target(fd) for fd in held)
        return (
            f"after the preloads this process holds descriptors {held} ({targets}); a fork "
            "server's workers cannot inherit them (preload modules that keep no file or "
            "socket open on import)\n"
        )
    return None


def _open_fds() -> list[int]:
    found = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            os.fstat(int(name))
            found.append(int(name))
    return found


def _target(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


def _serve(control: socket.socket) -> NoReturn:
    while True:
        data, fds, _, _ = socket.recv_fds(control, _MAX_MESSAGE, 1)
        if not data:
            os._exit(0)  # the runtime closed its end: it no longer wants us
        try:
            reply = _answer(control, json.loads(data), fds)
        except Exception as exc:
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        control.send(json.dumps(reply).encode())


def _answer(control: socket.socket, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
    op = request.get("op")
    if op == "fork":
        if len(fds) != 1:
            raise ValueError(f"a fork request carries one descriptor, not {len(fds)}")
        for key in ("spec", "log", "pid_file"):
            if not isinstance(request.get(key), str):
                raise ValueError(f"a fork request needs {key!r} as a string")
        # Flushed first, or the child would write again what the zygote had buffered.
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _become_worker(control, fds[0], request)
        # fds[0] is closed by the caller: the listener is the worker's alone now (held here
        # too, it would accept connections that no one answers, after the worker died).
        return {"ok": True, "pid": pid}
    if op == "reap":
        child = request.get("pid")
        if not isinstance(child, int) or isinstance(child, bool) or child <= 0:
            raise ValueError(f"a reap request needs a pid, not {child!r}")
        try:
            got, status = os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            return {"ok": True, "status": None}
        return {"ok": True, "status": status if got == child else None}
    raise ValueError(f"unknown op {op!r}")


def _become_worker(control: socket.socket, listen_fd: int, request: dict[str, Any]) -> NoReturn:
    """In the child: become the worker of `request`, as ``python -m controller.worker`` would
    be, and exit when it ends. Never returns, never raises: this is the zygote's stack."""
    code = 1
    try:
        # Its own session and process group: it outlives the zygote and the controller, and is
        # stopped as a group.
        os.setsid()
        # Then its pid file, before anything that may fail or take time: a controller restarted
        # from here on finds this process, even if the zygote is killed the next instant.
        _write_pid_file(request["pid_file"])
        _reset_signals()
        # The object lets go of its descriptor without closing it; the descriptor is closed
        # below with the rest (a socket object closing a number reused later would close
        # someone else's descriptor).
        control.detach()
        _redirect(request["log"], listen_fd)
        sys.argv = [worker.__file__, request["spec"]]
        run(request["spec"], listen_fd)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:
        # As Python itself does for an uncaught KeyboardInterrupt: die of SIGINT, so that the
        # exit status tells.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 128 + signal.SIGINT
    except BaseException:
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    with contextlib.suppress(BaseException):
        print(exc.code, file=sys.stderr)
    return 1


def _write_pid_file(path: str) -> None:
    """``<pid> <start time>``, written atomically (a temp file renamed over the name, never
    through a symlink). The start time (in clock ticks after boot, from ``/proc``) tells a
    reused pid from this process. Not synced: the file must outlive the controller, not the
    machine, which would take the worker with it."""
    with open("/proc/self/stat", "rb") as f:
        start = f.read().rpartition(b")")[2].split()[19].decode()
    directory, name = os.path.split(path)
    temp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o600)
    try:
        os.write(fd, f"{os.getpid()} {start}\n".encode())
    finally:
        os.close(fd)
    os.replace(temp, path)


def _reset_signals() -> None:
    """Every handler as a fresh interpreter has it (a preloaded module may have set some), and
    nothing blocked."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):  # the C library's own (32, 33)
            signal.signal(sig, signal.SIG_DFL)
    # What Python sets at start-up.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    signal.set_wakeup_fd(-1)


def _redirect(log_path: str, listen_fd: int) -> None:
    """The three descriptors of a spawned worker, and nothing else but its listener: stdin from
    /dev/null, stdout and stderr to its log (never through a symlink, private)."""
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    # Everything else goes: the control socket and the two just opened (preloads may hold none:
    # see _prepare). Listed, not closed by range: the list is short, and a range has no sure
    # upper end.
    for fd in _open_fds():
        if fd > 2 and fd != listen_fd:
            os.close(fd)


if __name__ == "__main__":
    main()
