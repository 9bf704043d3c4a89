"""Where an ingress learns which replicas serve, and where it reports its load: the controller
in the same process, or a daemon's HTTP API (``/api/v1/watch`` and ``/api/v1/load``)."""

from __future__ import annotations

import json
import math
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, Protocol, final

import attrs
import h11
import trio

from .._model.config.canary import canary_dict
from .._model.config.config import BackendConfig
from .._model.config.policies import affinity, rate_limit, retries
from .._model.values.errors import ControllerClosedError
from .._model.views.leader import leader_of
from .._model.views.load_report import load_body
from .._model.views.status import BackendSnapshot, LoadReport, TrafficSplit
from .models import Held, parse_held
from .split import Split
from .table import RouteInfo


class Controller(Protocol):
    """What a source in process reads of the controller (its public face)."""

    async def listen_for_change(
        self, snapshot_ids: Mapping[str, int] | None = None, *, all_backends: bool = False
    ) -> dict[str, BackendSnapshot]: ...

    def report_load(self, report: LoadReport) -> bool: ...


class SourceError(Exception):
    """The watch source cannot be reached (or answered nonsense); the ingress keeps routing on
    what it last heard, and tries again."""


class WatchSource(Protocol):
    """What an ingress follows."""

    def describe(self) -> str:
        """Where it is, for logs."""
        ...

    async def changes(self) -> tuple[list[RouteInfo], bool]:
        """Wait for the next change: the backends that changed (deleted ones with ``exists``
        False) and whether the list is complete (then whatever it lacks is gone)."""
        ...

    async def report(self, reports: list[LoadReport]) -> None:
        """Tell the controller this ingress's load (``SourceError`` if it cannot be told)."""
        ...


def route_info(snapshot: BackendSnapshot) -> RouteInfo:
    config = snapshot.backend_config or BackendConfig()
    return RouteInfo(
        name=snapshot.name,
        snapshot_id=snapshot.snapshot_id,
        exists=snapshot.exists,
        deleting=snapshot.deleting,
        route_prefix=config.route_prefix,
        max_ongoing_requests=config.max_ongoing_requests,
        max_queued_requests=config.max_queued_requests,
        request_timeout_s=config.request_timeout_s,
        retries=config.retries,
        affinity=config.affinity,
        rate_limit=config.rate_limit,
        replicas=tuple((r.tag, r.address) for r in snapshot.replicas if r.address),
        scales_from_zero=config.autoscaling is not None and config.autoscaling.min_replicas == 0,
        split=_split(
            snapshot.traffic, None if config.canary is None else canary_dict(config.canary)
        ),
        versions=tuple((r.tag, r.version) for r in snapshot.replicas if r.address),
        version=snapshot.version,
        held=tuple(snapshot.held.items()),
    )


def _split(traffic: TrafficSplit | None, canary: Mapping[str, Any] | None) -> Split | None:
    """A snapshot's split, with the canary block's header names (as the daemon checked them:
    only these three are read, so a block of a newer daemon's is no error here)."""
    if traffic is None:
        return None

    def name(field: str, lower: bool) -> bytes | None:
        value = (canary or {}).get(field)
        if not isinstance(value, str):
            return None
        return (value.lower() if lower else value).encode("ascii", "replace")

    return Split(
        traffic.canary_version,
        traffic.stable_version,
        traffic.weight,
        sticky_header=name("sticky_header", True),
        sticky_cookie=name("sticky_cookie", False),
        force_header=name("force_header", True),
    )


@final
@attrs.define(eq=False)
class ControllerSource:
    """The controller in this process: snapshots as they are published, load as events."""

    controller: Controller
    _known: dict[str, int] = attrs.field(factory=dict, init=False)
    _asked: bool = attrs.field(default=False, init=False)

    def describe(self) -> str:
        return "the controller in this process"

    async def changes(self) -> tuple[list[RouteInfo], bool]:
        # The first answer comes at once, even with no backend at all: an ingress starts with
        # what there is.
        first, self._asked = not self._asked, True
        snapshots = {}
        with trio.CancelScope(deadline=-math.inf if first else math.inf):
            try:
                snapshots = await self.controller.listen_for_change(self._known, all_backends=True)
            except ControllerClosedError as exc:
                raise SourceError(str(exc)) from None
        for name, snapshot in snapshots.items():
            # Tombstones too: a name left out would read as new (id 0) on every call.
            self._known[name] = snapshot.snapshot_id
        return [route_info(s) for s in snapshots.values()], first

    async def report(self, reports: list[LoadReport]) -> None:
        try:
            for report in reports:
                self.controller.report_load(report)
        except ControllerClosedError as exc:
            raise SourceError(str(exc)) from None


#: How long a load report may take: a stalled daemon must not hold back the next report (a
#: standby sends its ingress's load on to the leader, which may be one paused past its lease).
REPORT_TIMEOUT_S = 2.0

#: How long one long poll of a daemon's watch may wait for a change.
WATCH_POLL_S = 30.0


@final
@attrs.define(eq=False)
class HTTPSource:
    """A daemon's API, by URL (``http://127.0.0.1:7070``) and token.

    `also` names other daemons of the same store (standbys): when the one followed cannot be
    reached, the next is tried, in turn. Any of them answers the watch (a standby from the
    store), and a standby sends load reports on to the leader (307), which this follows.

    `locate`, if given, says where the daemon is now and its token (read again from its state
    dir): asked whenever the daemon cannot be reached or refuses the token, so that an ingress
    follows a daemon restarted on another port, or with another token."""

    url: str
    token: str
    also: tuple[str, ...] = ()
    locate: Callable[[], tuple[str, str] | None] | None = None
    _epoch: str = attrs.field(default="", init=False)
    _cursor: int = attrs.field(default=0, init=False)
    _at: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        for url in (self.url, *self.also):
            parts = urllib.parse.urlsplit(url)
            if parts.scheme != "http" or not parts.hostname:
                raise ValueError(f"the daemon's URL must look like http://HOST:PORT (got {url!r})")

    @property
    def following(self) -> str:
        """The daemon followed now."""
        urls = (self.url, *self.also)
        return urls[self._at % len(urls)]

    def describe(self) -> str:
        if not self.also:
            return f"the daemon at {self.url}"
        return f"the daemon at {self.following} (or {', '.join(self._others())})"

    def _others(self) -> list[str]:
        return [u for u in (self.url, *self.also) if u != self.following]

    def _relocate(self) -> bool:
        """Ask `locate` where the daemon is now; whether that changed anything."""
        if self.locate is None:
            return False
        found = self.locate()
        if found is None or found == (self.url, self.token):
            return False
        if found[0] != self.url:
            self._epoch, self._cursor = "", 0  # another daemon's watch: count afresh
        self.url, self.token = found
        return True

    def _next_daemon(self) -> None:
        # Another daemon counts its watch afresh (its own epoch): the next answer is complete.
        self._at += 1

    async def changes(self) -> tuple[list[RouteInfo], bool]:
        # The first answer comes at once, even with no backend at all: an ingress starts with
        # what there is (a long poll would hold its start until the first change).
        wait = WATCH_POLL_S if self._epoch else 0
        query = urllib.parse.urlencode(
            {"since": self._cursor, "epoch": self._epoch, "timeout_s": wait}
        )
        with trio.move_on_after(WATCH_POLL_S + 15) as waited:
            try:
                status, data = await self._call("GET", f"/api/v1/watch?{query}")
            except SourceError:
                if self.also:
                    self._next_daemon()
                if self._relocate():
                    return await self.changes()  # it moved: follow it now, not after a wait
                raise
        if waited.cancelled_caught:
            raise SourceError("the watch did not answer in time")
        if status != 200 or not isinstance(data, dict):
            if status == 401 and self._relocate():
                return await self.changes()  # a new token: the same
            raise SourceError(f"the watch answered {status}: {_error_of(data)}")
        try:
            infos = [_info_from_json(s) for s in data["snapshots"]]
            epoch, cursor, complete = (
                str(data["epoch"]),
                int(data["cursor"]),
                bool(data["complete"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SourceError(
                f"the watch answered something else than snapshots: {exc!r}"
            ) from None
        self._epoch, self._cursor = epoch, cursor
        return infos, complete

    async def report(self, reports: list[LoadReport]) -> None:
        source = reports[0].source if reports else ""
        body = load_body(source, reports)
        status, data = 0, None
        with trio.move_on_after(REPORT_TIMEOUT_S) as waited:
            status, data = await self._call("POST", "/api/v1/load", body)
            leader = leader_of(status, data)
            if leader is not None:
                status, data = await self._call("POST", "/api/v1/load", body, url=leader)
        if waited.cancelled_caught:
            # A daemon that takes the connection and never answers: a stalled one.
            raise SourceError(f"the load report was not answered within {REPORT_TIMEOUT_S:g}s")
        if status != 200:
            raise SourceError(f"the load report was refused ({status}): {_error_of(data)}")

    async def _call(
        self, method: str, target: str, body: object = None, *, url: str | None = None
    ) -> tuple[int, Any]:
        url = url or self.following
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname or "", parts.port or 80
        payload = b"" if body is None else json.dumps(body).encode()
        headers = [
            ("Host", parts.netloc),
            ("Authorization", f"Bearer {self.token}"),
            ("Connection", "close"),
            ("Content-Length", str(len(payload))),
        ]
        if body is not None:
            headers.append(("Content-Type", "application/json"))
        conn = h11.Connection(h11.CLIENT)
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise SourceError(f"cannot connect to {url}: {exc}") from None
        async with stream:
            try:
                data = conn.send(h11.Request(method=method, target=target, headers=headers))
                data += conn.send(h11.Data(data=payload)) if payload else b""
                data += conn.send(h11.EndOfMessage()) or b""
                await stream.send_all(data)
                return await _read_json(stream, conn)
            except (OSError, trio.BrokenResourceError, h11.ProtocolError):
                raise SourceError(f"{url} closed the connection before answering") from None


#: The largest watch answer read (a daemon with many thousands of backends stays well below).
_MAX_ANSWER = 256 * 1024 * 1024


async def read_answer(
    stream: trio.SocketStream, conn: h11.Connection, limit: int = _MAX_ANSWER
) -> tuple[int, bytes]:
    """The status and body of the answer `conn` (a client's) reads from `stream`. Raises
    `SourceError` if the body is over `limit` bytes, or the connection closes first."""
    status = 0
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > limit:
                raise SourceError("the answer is too large")
        elif isinstance(event, h11.EndOfMessage):
            return status, bytes(body)
        else:
            raise SourceError("the connection closed before the answer was complete")


async def _read_json(stream: trio.SocketStream, conn: h11.Connection) -> tuple[int, Any]:
    status, body = await read_answer(stream, conn)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None


def _error_of(data: Any) -> str:
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return str(data["error"].get("message", data["error"]))
    return repr(data)[:200]


def _info_from_json(data: Mapping[str, Any]) -> RouteInfo:
    config = data.get("config") or {}
    given = data.get("traffic")
    traffic = None
    if given is not None:
        traffic = TrafficSplit(
            str(given["canary_version"]), str(given["stable_version"]), float(given["weight"])
        )
    canary = config.get("canary")
    return RouteInfo(
        name=str(data["name"]),
        snapshot_id=int(data["snapshot_id"]),
        exists=bool(data["exists"]),
        deleting=bool(data.get("deleting", False)),
        route_prefix=config.get("route_prefix"),
        max_ongoing_requests=int(config.get("max_ongoing_requests", 100)),
        max_queued_requests=int(config.get("max_queued_requests", 1000)),
        request_timeout_s=float(config.get("request_timeout_s", 60.0)),
        retries=retries(config.get("retries")),
        affinity=affinity(config.get("affinity")),
        rate_limit=rate_limit(config.get("rate_limit")),
        replicas=tuple(
            (str(r["tag"]), str(r["address"])) for r in data["replicas"] if r.get("address")
        ),
        scales_from_zero=(config.get("autoscaling") or {}).get("min_replicas") == 0,
        split=_split(traffic, canary),
        versions=tuple(
            (str(r["tag"]), str(r["version"])) for r in data["replicas"] if r.get("address")
        ),
        version=str(data.get("version", "")),
        held=_held_from_json(data.get("held")),
    )


def _held_from_json(data: Any) -> tuple[tuple[str, Held], ...]:
    """A snapshot's ``held``: each multiplexed replica's models, as its answers say them (one
    that cannot be read is left out: its answers will say)."""
    if not isinstance(data, Mapping):
        return ()
    out = []
    for tag, said in data.items():
        held = parse_held(said.encode("ascii", "replace")) if isinstance(said, str) else None
        if held is not None:
            out.append((str(tag), held))
    return tuple(out)
