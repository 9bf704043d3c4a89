"""How the CLI talks to the daemon: its HTTP client, and where it finds the daemon and token."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

from .._daemon.statedir import TOKEN_ENV, StateDir
from .._files import UnsafeFileError, read_regular
from .._model.values.errors import StartupError
from .._model.views.leader import leader_of


class CLIError(Exception):
    """Something the user should read; the command exits with `code`."""

    def __init__(self, message: str, code: int = 1):
        self.code = code
        super().__init__(message)


class Unreachable(CLIError):
    """The daemon did not answer at all (not running, or gone mid-command)."""


# -- talking to the daemon --


class Client:
    def __init__(self, url: str, token: str | None):
        if not url.startswith(("http://", "https://")):
            raise CLIError(f"error: --url {url!r} is not a URL; the daemon's is http://HOST:PORT")
        self.url = url.rstrip("/")
        self.origin = self.url
        """The daemon the command was pointed at (``url`` may move to the leader)."""
        self.token = token

    def call(
        self, method: str, path: str, body: Any = None, *, timeout: float = 30.0
    ) -> tuple[int, Any]:
        status, payload = self._call(self.url, method, path, body, timeout)
        leader = leader_of(status, payload)
        if leader is None:
            return status, payload
        # A standby: the same request goes to the leader it names, and so does the rest of the
        # command (an `apply --wait` follows its change where it is made, not in a standby's
        # copy). The leader's answer is final, whatever it is; but a leader that does not
        # answer (paused past its lease, or gone) is asked no more: the daemon this command
        # was pointed at is asked again once, and sends it to whoever leads by then. (Sent
        # twice, a change is still made once: a stale leader's writes are refused, and the
        # same spec deployed again changes nothing.)
        self.url = leader
        try:
            return self._call(leader, method, path, body, min(timeout, _LEADER_TIMEOUT_S))
        except Unreachable:
            time.sleep(_TAKEOVER_POLL_S)
            status, payload = self._call(self.origin, method, path, body, timeout)
            leader = leader_of(status, payload)
            if leader is None:
                self.url = self.origin
                return status, payload
            self.url = leader
            return self._call(leader, method, path, body, timeout)

    def _call(self, url: str, method: str, path: str, body: Any, timeout: float) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.token is not None:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
                try:
                    return response.status, json.loads(raw or b"null")
                except ValueError:
                    raise CLIError(
                        f"error: {self.url} answered with something other than JSON; is it a "
                        "controller daemon?"
                    ) from None
        except urllib.error.HTTPError as exc:
            try:
                payload = json.loads(exc.read() or b"null")
            except (ValueError, http.client.HTTPException):
                payload = None
            return exc.code, payload
        # An answer cut short (IncompleteRead and the like) is a daemon gone mid-answer, as a
        # refused connection is one gone before: killed, or stopping.
        except (
            urllib.error.URLError,
            ConnectionError,
            TimeoutError,
            http.client.HTTPException,
        ) as exc:
            reason = getattr(exc, "reason", exc)
            raise Unreachable(
                f"error: cannot reach the controller at {url} ({reason}); is `controller run` "
                "running, and is --url or --state-dir right?"
            ) from None

    def ok(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        status, payload = self.call(method, path, body, **kwargs)
        if status >= 400:
            # 2: the request was refused as it stands and nothing was applied.
            code = 2 if status in (400, 409, 413, 422) else 1
            raise CLIError(describe_error(status, payload), code)
        return payload


def leader_answer(client: Client, path: str, deadline: float) -> Any:
    """`path` (a GET) as the leader answers it, for commands that wait on what the leader does:
    a standby's answer (its copy of the store) is not taken, and a leader that is gone is
    waited out until another leads (a takeover), or until `deadline` (``time.monotonic``)."""
    while True:
        try:
            status, payload = client.call("GET", path, timeout=_LEADER_TIMEOUT_S)
        except Unreachable:
            if time.monotonic() >= deadline:
                raise
            # The leader the command followed is gone: back to the daemon it was pointed at,
            # which answers (or sends on to) whoever leads now.
            client.url = client.origin
            time.sleep(_TAKEOVER_POLL_S)
            continue
        leadership = payload.get("leadership") if isinstance(payload, dict) else None
        if status == 200 and (leadership is None or leadership.get("role") == "leader"):
            return payload
        if status not in (200, 503):
            raise CLIError(describe_error(status, payload), 2 if status == 422 else 1)
        if time.monotonic() >= deadline:
            raise CLIError("error: no daemon leads (a takeover has not ended in time)")
        address = leadership.get("address") if isinstance(leadership, dict) else None
        if isinstance(address, str) and address.startswith("http://") and address != client.url:
            client.url = address.rstrip("/")
            continue
        time.sleep(_TAKEOVER_POLL_S)


#: How often a waiting command asks again while a takeover is under way.
_TAKEOVER_POLL_S = 0.25
#: How long a leader found through a standby has to answer: a read or a change takes it
#: milliseconds, and one paused past its lease (then superseded) must not hold the command.
_LEADER_TIMEOUT_S = 10.0


def describe_error(status: int, payload: Any) -> str:
    error = payload.get("error") if isinstance(payload, dict) else None
    message = (error.get("message") if isinstance(error, dict) else None) or f"HTTP {status}"
    if status == 401:
        message += " (the CLI reads the token from --token, $CONTROLLER_TOKEN or the state dir)"
    return f"error: {message}"


def make_client(args: argparse.Namespace) -> Client:
    state = StateDir(args.state_dir)
    url = args.url
    token = (args.token or os.environ.get(TOKEN_ENV) or "").strip() or None
    if url is None or token is None:
        # Its files say where to send the token, so they are trusted only in a dir that no one
        # else can write: else anyone could point the CLI, and the token, at a server of theirs.
        try:
            state.check_private(create=False)
        except StartupError as exc:
            raise CLIError(f"error: {exc}") from None
    if url is None:
        found = state.read_address().get("url")
        if not isinstance(found, str) or not state.running():
            why = "no daemon.json" if not isinstance(found, str) else "its daemon.json is stale"
            left = ""
            if any(state.ingress.glob("*.json")):
                # Its replicas and ingress processes outlive a stopped daemon, by design.
                left = (
                    "; what the last one started may still be serving: `controller run` adopts "
                    "it, and `controller shutdown` then stops it all"
                )
            raise CLIError(
                f"error: no controller daemon is running for the state dir {state} ({why}); "
                "start one with `controller run`, or pass --url (or the --state-dir it runs "
                f"with){left}"
            )
        url = found
    if token is None:
        try:
            token = read_regular(state.token, limit=4096).decode(errors="replace")
            token = token.strip()
        except UnsafeFileError as exc:
            raise CLIError(f"error: the token {exc}") from None
        except OSError:
            token = None  # the daemon will say 401, and the message says where tokens come from
    return Client(url, token)
