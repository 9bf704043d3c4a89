"""The web console's server side, in process (the pages themselves are driven in a real browser
in ``test_console_browser.py``): the login and its cookie, CSRF on every change made with the
cookie, one-time links, the static files, the long poll the pages follow, the chart's history,
and scale, which the console and ``controller scale`` share."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

import controller
from controller._api.app import Api
from controller._api.console import Console
from controller._api.console_auth import LINK_S, SESSION_S, Sessions
from controller._api.openapi import OPENAPI
from controller._api.timeline import RESOLUTION_S, WINDOW_S, Timelines
from controller._backend.turns import TURN_EVERY
from controller._model.views.status import BackendNumbers
from controller.testing import FakeRuntime

from ..asgi import call
from ..conftest import config, opened, settle

TOKEN = "s" * 40
RC = controller.ReplicaConfig("app.replica:Echo")
Headers = tuple[tuple[bytes, bytes], ...]


class Clock:
    """The wall clock the sessions read, moved by hand."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Browser:
    """The app in process, called as a browser on one of the console's pages would: a cookie
    jar, and the session's key the page keeps (sent with every call, as the pages do)."""

    def __init__(self, ctl: controller.Controller, store: controller.MemoryStore, clock: Clock):
        self.ctl = ctl
        self.store = store
        self.clock = clock
        self.sessions = Sessions(TOKEN, clock=clock)
        self.app = Api(
            ctl,
            token=TOKEN,
            epoch="e",
            render_metrics=lambda: b"",
            request_shutdown=lambda: None,
            console=Console(TOKEN, self.sessions),
        )
        self.cookie: str | None = None
        self.key: str | None = None

    async def __call__(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        *,
        headers: Headers = (),
        content_type: bytes | None = b"application/json",
        query: bytes = b"",
        token: str | None = None,
        key: str | None = "mine",
    ) -> tuple[int, dict[str, str], bytes]:
        """`key`: the session's own ("mine"), another, or None to send none."""
        sent = list(headers)
        if self.cookie is not None:
            sent.append((b"cookie", f"other=1; {self.cookie}".encode()))
        sending = self.key if key == "mine" else key
        if sending is not None:
            sent.append((b"x-console-key", sending.encode()))
        status, answered, data = await call(
            self.app,
            method,
            path,
            body,
            query=query,
            headers=tuple(sent),
            content_type=content_type,
            token=token,
        )
        return status, answered, data

    async def log_in(self, token: str = TOKEN) -> tuple[int, dict[str, str], Any]:
        """What the login page's script does with the token typed in."""
        status, headers, answer = await self(
            "POST", "/login", json.dumps({"token": token}).encode(), key=None
        )
        if status == 200:
            self.cookie = headers["set-cookie"].split(";")[0]
            self.key = json.loads(answer)["key"]
        return status, headers, json.loads(answer)

    async def change(
        self, method: str, path: str, data: Any = None, *, key: str | None = "mine", **kw: Any
    ) -> tuple[int, Any]:
        """A change from the page's script: JSON, and the session's key unless told."""
        body = b"" if data is None else json.dumps(data).encode()
        status, _, answer = await self(method, path, body, key=key, **kw)
        return status, json.loads(answer) if answer else None


@asynccontextmanager
async def console(**backends: controller.BackendConfig) -> AsyncIterator[Browser]:
    store = controller.MemoryStore()
    async with opened(FakeRuntime(auto_ready=True), store) as ctl:
        for name, cfg in backends.items():
            assert (
                await (await ctl.deploy(name, cfg, RC)).wait() is controller.GoalOutcome.COMPLETED
            )
        yield Browser(ctl, store, Clock())


def error_type(body: bytes) -> str:
    kind: str = json.loads(body)["error"]["type"]
    return kind


# -- logging in --


async def test_pages_need_a_login_which_sets_a_strict_httponly_cookie_and_gives_a_key() -> None:
    async with console(a=config(num_replicas=1)) as browser:
        for path, where in [
            ("/", "/login?next=/"),
            ("/backends/a", "/login?next=/backends/a"),
            ("/backends/a/logs/a%23x", "/login?next=/backends/a/logs/a%2523x"),
        ]:
            status, headers, _ = await browser("GET", path)
            assert (status, headers["location"]) == (303, where)
        status, headers, page = await browser("GET", "/login")
        assert status == 200
        assert b'id="token"' in page
        assert "script-src 'self'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY"

        status, headers, answer = await browser.log_in("x" * 40)
        assert status == 401
        assert "set-cookie" not in headers
        assert answer["error"]["message"] == "that is not the daemon's token"

        status, headers, answer = await browser.log_in()
        assert status == 200
        assert answer == {"key": browser.key, "expires_in_s": SESSION_S}
        cookie = headers["set-cookie"]
        name, _, value = cookie.split(";")[0].partition("=")
        assert name == "controller_session"  # no port in an in-process scope
        assert {"HttpOnly", "SameSite=Strict", "Path=/", f"Max-Age={SESSION_S}"} <= {
            part.strip() for part in cookie.split(";")
        }
        assert browser.key is not None
        assert TOKEN not in value
        assert browser.key not in value
        # The page itself holds no secret: the cookie alone gets the shell and nothing else.
        for path in ["/", "/backends/a", "/backends/a/logs/a%23x"]:
            status, _, page = await browser("GET", path, key=None)
            assert status == 200
            assert TOKEN.encode() not in page
            assert browser.key.encode() not in page


async def test_the_cookie_alone_reads_nothing_and_changes_nothing() -> None:
    """A browser sends a host's cookies to every port of it: what another server on this host
    (or a replica behind the ingress) would get is the cookie, never the key."""
    async with console(a=config(num_replicas=1)) as browser:
        await browser.log_in()
        for path in ["/api/v1/backends", "/api/v1/backends/a", "/api/v1/changes", "/metrics"]:
            status, _, answer = await browser("GET", path, key=None)
            assert status == 401, path
            assert error_type(answer) == "Unauthorized"
            status, _, _ = await browser("GET", path)
            assert status == 200, path
        status, _ = await browser.change(
            "POST", "/api/v1/backends/a/scale", {"replicas": 2}, key=None
        )
        assert status == 403
        assert browser.ctl.status("a").desired_replicas == 1


async def test_a_login_from_another_site_or_malformed_is_refused() -> None:
    async with console() as browser:
        body = json.dumps({"token": TOKEN}).encode()
        cross = ((b"origin", b"http://evil.example"), (b"host", b"127.0.0.1:7070"))
        for headers, kind, content, expected in [
            (cross, b"application/json", body, 403),
            (((b"sec-fetch-site", b"cross-site"),), b"application/json", body, 403),
            ((), b"application/x-www-form-urlencoded", f"token={TOKEN}".encode(), 415),
            ((), None, body, 415),
            ((), b"application/json", b"{", 400),
            ((), b"application/json", b"x" * (2 << 20), 413),
            ((), b"application/json", b'{"token": 5}', 401),
            ((), b"application/json", b"[]", 401),
        ]:
            status, answered, _ = await browser(
                "POST", "/login", content, headers=headers, content_type=kind, key=None
            )
            assert status == expected, (headers, kind, content[:20])
            assert "set-cookie" not in answered
        status, answered, _ = await browser("DELETE", "/login")
        assert status == 405
        assert answered["allow"] == "GET, HEAD, POST"


# -- the session on the API, and CSRF --


async def test_changes_with_the_cookie_need_the_key_of_that_session_and_this_origin() -> None:
    async with console(a=config(num_replicas=1)) as browser:
        await browser.log_in()
        status, _, answer = await browser("GET", "/api/v1/backends")
        assert status == 200
        assert json.loads(answer)["backends"][0]["name"] == "a"

        other = Sessions(TOKEN, clock=browser.clock)
        _, someone_elses = other.new_session()
        same_site = ((b"origin", b"http://127.0.0.1:7070"), (b"host", b"127.0.0.1:7070"))
        for key, headers in [
            (None, ()),  # what a forged form or fetch would send: the cookie alone
            ("", ()),
            ("0" * 32, ()),
            (someone_elses.key, ()),
            ("mine", ((b"origin", b"http://evil.example"), (b"host", b"127.0.0.1:7070"))),
            ("mine", ((b"sec-fetch-site", b"same-site"),)),
        ]:
            for method, path, data in [
                ("POST", "/api/v1/backends/a/scale", {"replicas": 3}),
                ("DELETE", "/api/v1/backends/a", None),
                ("POST", "/api/v1/backends/a/undo", {}),
                (
                    "PUT",
                    "/api/v1/backends/a",
                    {"entrypoint": "app.replica:Echo", "num_replicas": 9},
                ),
                ("POST", "/api/v1/shutdown", None),
            ]:
                status, answer = await browser.change(method, path, data, key=key, headers=headers)
                # Another site's page is told so; a page of ours without the key, that.
                kind = "CrossOrigin" if headers else "CSRFRejected"
                assert (status, answer["error"]["type"]) == (403, kind), (key, path)
        assert browser.ctl.status("a").desired_replicas == 1
        assert not browser.ctl.status("a").deleting

        status, answer = await browser.change(
            "POST", "/api/v1/backends/a/scale", {"replicas": 3}, headers=same_site
        )
        assert status == 200
        assert answer["name"] == "a"
        assert browser.ctl.status("a").desired_replicas == 3


async def test_forged_expired_and_logged_out_sessions_are_refused() -> None:
    async with console(a=config(num_replicas=1)) as browser:
        await browser.log_in()
        assert browser.cookie is not None
        good = browser.cookie
        name, _, value = good.partition("=")
        expires, nonce, mac = value.split(".")
        forged = [
            f"{name}={expires}.{nonce}.{'0' * len(mac)}",
            f"{name}={int(expires) + 10**6}.{nonce}.{mac}",  # a longer life, same signature
            f"{name}={expires}.{nonce}",
            f"{name}=",
            f"{name}={Sessions('another token').new_session()[0]}",  # signed with another key
            f"{name}={'9' * 400}.{nonce}.{mac}",
        ]
        for cookie in forged:
            browser.cookie = cookie
            status, _, _ = await browser("GET", "/api/v1/backends")
            assert status == 401, cookie
            status, headers, _ = await browser("GET", "/")
            assert status == 303, cookie

        browser.cookie = good
        status, _ = await browser.change("POST", "/logout", key=None)
        assert status == 403  # a forged logout is refused too
        status, headers, _ = await browser("POST", "/logout")
        assert status == 204
        assert "Max-Age=0" in headers["set-cookie"]
        status, _, _ = await browser("GET", "/api/v1/backends")
        assert status == 401  # the same cookie, kept by someone: no longer a session

        await browser.log_in()
        browser.clock.now += SESSION_S + 1
        status, _, _ = await browser("GET", "/api/v1/backends")
        assert status == 401


async def test_a_tossed_cookie_does_not_shadow_the_session_and_odd_bytes_are_refused() -> None:
    """Another port of this host may set a cookie of the same name with a longer path, which
    the browser sends first; odd bytes in a cookie or a key are a 401, never a 500."""
    async with console(a=config(num_replicas=1)) as browser:
        await browser.log_in()
        assert browser.cookie is not None
        name, _, good = browser.cookie.partition("=")
        browser.cookie = f"{name}=1.x.y; {name}={good}"
        status, _, _ = await browser("GET", "/api/v1/backends")
        assert status == 200
        for odd in ["\u00b2.a.b", "\u0661\u0662.a.b", "01.a.b", f"{good[:-1]}\u00e9"]:
            browser.cookie = f"{name}={odd}"
            for method, path in [("GET", "/api/v1/backends"), ("GET", "/"), ("POST", "/logout")]:
                status, _, _ = await browser(method, path)
                assert status in (303, 401, 204), (odd, path, status)
        browser.cookie = f"{name}={good}"
        status, _, _ = await browser("GET", "/api/v1/backends", key="\u00e9" * 32)
        assert status == 401
        status, _ = await browser.change(
            "POST", "/api/v1/backends/a/scale", {"replicas": 2}, key="\u00e9"
        )
        assert status == 403


async def test_a_login_link_is_made_with_the_token_and_works_once_within_a_minute() -> None:
    async with console() as browser:
        status, _, answer = await browser("POST", "/api/v1/console/links", token=TOKEN)
        assert status == 201
        made = json.loads(answer)
        assert made["path"] == f"/login#code={made['code']}"
        body = json.dumps({"code": made["code"]}).encode()
        status, headers, answer = await browser("POST", "/login/link", body)
        assert status == 200
        assert "HttpOnly" in headers["set-cookie"]
        browser.cookie = headers["set-cookie"].split(";")[0]
        browser.key = json.loads(answer)["key"]
        status, _, _ = await browser("GET", "/api/v1/backends")
        assert status == 200
        status, headers, answer = await browser("POST", "/login/link", body)
        assert status == 403
        assert error_type(answer) == "LinkSpent"

        # A session makes no links: the token does (a stolen cookie cannot mint more).
        status, _ = await browser.change("POST", "/api/v1/console/links")
        assert status == 403

        browser.cookie = browser.key = None
        status, _, answer = await browser("POST", "/api/v1/console/links", token=TOKEN)
        late = json.dumps({"code": json.loads(answer)["code"]}).encode()
        browser.clock.now += LINK_S + 1
        status, _, _ = await browser("POST", "/login/link", late)
        assert status == 403
        for bad in [b"{}", b'{"code": 5}', b"[]", b'{"code": "' + b"x" * 100 + b'"}']:
            status, headers, _ = await browser("POST", "/login/link", bad)
            assert status == 403
            assert "set-cookie" not in headers
        status, _, _ = await browser("POST", "/api/v1/console/links")
        assert status == 401  # no token, no cookie


# -- the files --


async def test_the_console_files_are_served_with_their_types_and_nothing_else() -> None:
    async with console() as browser:
        await browser.log_in()
        _, _, page = await browser("GET", "/")
        referenced = re.findall(rb'(?:src|href)="(/console/[^"]+)"', page)
        assert referenced, page
        for path in {p.decode() for p in referenced}:
            status, headers, data = await browser("GET", path)
            assert status == 200, path
            assert data, path
            assert headers["x-content-type-options"] == "nosniff"
            kind = headers["content-type"]
            assert kind.startswith(
                {"js": "text/javascript", "css": "text/css", "svg": "image/svg+xml"}[
                    path.rpartition(".")[2]
                ]
            )
            status, _, again = await browser(
                "GET", path, headers=((b"if-none-match", headers["etag"].encode()),)
            )
            assert (status, again) == (304, b"")
        # Every module a script imports is there too.
        for name in re.findall(
            rb'from "\./([a-z0-9_-]+\.js)"', await _asset(browser, "console.js")
        ):
            status, _, _ = await browser("GET", f"/console/{name.decode()}")
            assert status == 200, name
        for path in [
            "/console/../token",
            "/console/%2e%2e/token",
            "/console/nope.js",
            "/console/",
            "/console/INDEX.HTML",
            # The pages only at their own paths, with the headers that forbid framing them.
            "/console/index.html",
            "/console/login.html",
            "/backends/a/b/c/d",
        ]:
            status, _, _ = await browser("GET", path)
            assert status == 404, path
        status, headers, _ = await browser("POST", "/console/console.js")
        assert status == 405


async def _asset(browser: Browser, name: str) -> bytes:
    status, _, data = await browser("GET", f"/console/{name}")
    assert status == 200
    return data


# -- what the pages follow --


async def test_the_long_poll_answers_at_a_change_and_at_its_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # No health checks: their passes would move the cursor every 10 s.
    async with console(a=config(num_replicas=1, health_check_period_s=0)) as browser:
        await browser.log_in()

        async def changes(query: str) -> dict[str, Any]:
            status, _, answer = await browser("GET", "/api/v1/changes", query=query.encode())
            assert status == 200, answer
            found: dict[str, Any] = json.loads(answer)
            return found

        await settle()  # the deploy's last pass is over
        first = await changes("")
        cursor, epoch = first["cursor"], first["epoch"]
        assert first == {"epoch": "e", "cursor": browser.ctl.passes}

        start = trio.current_time()
        assert await changes(f"epoch={epoch}&since={cursor}&timeout_s=25") == first
        assert trio.current_time() - start == pytest.approx(25)

        # Another epoch (a restarted daemon), or a cursor it never gave: answered at once.
        start = trio.current_time()
        assert (await changes(f"epoch=old&since={cursor}&timeout_s=25"))["cursor"] == cursor
        assert (await changes(f"epoch={epoch}&since={cursor + 99}&timeout_s=25"))[
            "cursor"
        ] == cursor
        assert trio.current_time() == start

        woke: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:

            async def poll() -> None:
                woke.update(await changes(f"epoch={epoch}&since={cursor}&timeout_s=25"))
                woke["after"] = trio.current_time() - start

            nursery.start_soon(poll)
            await trio.sleep(3)
            await browser.ctl.scale("a", 2)
        assert woke["cursor"] > cursor
        assert woke["after"] == pytest.approx(3)
        for bad in ["since=-1", "since=x", "timeout_s=61", "timeout_s=nan"]:
            status, _, _ = await browser("GET", "/api/v1/changes", query=bad.encode())
            assert status == 400, bad


def test_the_history_keeps_a_point_per_change_at_most_one_per_resolution_for_an_hour() -> None:
    timelines = Timelines()

    def status(name: str, desired: int) -> BackendNumbers:
        return BackendNumbers(name, desired, 0, 0, 0)

    t = 1_800_000_000.0
    timelines.sample([status("a", 1), status("b", 2)], t)
    timelines.sample([status("a", 1), status("b", 2)], t + 1)  # nothing changed: no point
    assert len(timelines.json("a")["points"]) == 1
    timelines.sample([status("a", 2), status("b", 2)], t + 10)
    timelines.sample([status("a", 3), status("b", 2)], t + 10.5)  # the same 5 s: replaces it
    points = timelines.json("a")["points"]
    assert [p["desired"] for p in points] == [1, 3]
    assert points[0]["time"].endswith("Z")
    # A change every second for two hours keeps at most an hour's worth at that resolution,
    # and the newest point before the window (where the chart starts).
    for i in range(7200):
        timelines.sample([status("a", i % 7), status("b", 2)], t + 20 + i)
    points = timelines.json("a")["points"]
    assert len(points) <= WINDOW_S / RESOLUTION_S + 2
    assert [p["desired"] for p in points][-1] == 7199 % 7
    timelines.sample([status("b", 2)], t + 8000)
    assert timelines.json("a")["points"] == []
    assert len(timelines.json("b")["points"]) == 1
    assert timelines.json("a")["window_s"] == WINDOW_S


async def test_the_history_endpoint_names_the_backend() -> None:
    async with console(a=config(num_replicas=1)) as browser:
        await browser.log_in()
        status, _, answer = await browser("GET", "/api/v1/backends/a/history")
        assert status == 200
        assert json.loads(answer)["name"] == "a"
        status, _, answer = await browser("GET", "/api/v1/backends/zz/history")
        assert status == 404
        assert error_type(answer) == "UnknownBackend"


# -- scale --


async def test_scale_sets_the_count_and_nothing_else() -> None:
    async with console(a=config(num_replicas=1, user_config={"k": 1})) as browser:
        await browser.log_in()
        before = browser.ctl.status("a")
        status, answer = await browser.change("POST", "/api/v1/backends/a/scale", {"replicas": 3})
        assert status == 200
        assert answer["generation"] == before.generation + 1
        after = browser.ctl.status("a")
        assert after.backend_config.num_replicas == 3
        assert after.backend_config.user_config == {"k": 1}
        assert (
            len(browser.ctl.revisions("a"))
            == len(browser.ctl.revisions("a", check_code=False))
            == 1
        )
        # The same count again changes nothing.
        status, again = await browser.change("POST", "/api/v1/backends/a/scale", {"replicas": 3})
        assert again["generation"] == answer["generation"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"replicas": -1}, "replicas"),
        ({"replicas": 1.5}, "replicas"),
        ({"replicas": "3"}, "replicas"),
        ({"replicas": 10**7}, "replicas"),
        ({"replicas": True}, "replicas"),
        ({"min_replicas": 1}, "min_replicas"),
        ({}, "replicas"),
        ({"replicas": 1, "extra": 1}, "extra"),
        ({"replicas": 1, "message": "x" * 2000}, "message"),
        ([], "object"),
    ],
)
async def test_a_bad_scale_names_the_field_and_writes_nothing(body: Any, field: str) -> None:
    async with console(a=config(num_replicas=1)) as browser:
        await browser.log_in()
        written = await browser.store.read_all()
        status, answer = await browser.change("POST", "/api/v1/backends/a/scale", body)
        assert status == 422, answer
        assert field in answer["error"]["message"], answer
        assert browser.ctl.status("a").desired_replicas == 1
        assert await browser.store.read_all() == written


async def test_scale_of_an_autoscaled_backend_sets_its_range() -> None:
    autoscaled = config(
        num_replicas=1,
        autoscaling=controller.AutoscalingConfig(min_replicas=1, max_replicas=4),
    )
    async with console(a=autoscaled) as browser:
        await browser.log_in()
        status, answer = await browser.change("POST", "/api/v1/backends/a/scale", {"replicas": 3})
        assert status == 422
        assert "replicas: the backend is autoscaled" in answer["error"]["message"]
        status, answer = await browser.change(
            "POST", "/api/v1/backends/a/scale", {"min_replicas": 2, "max_replicas": 6}
        )
        assert status == 200, answer
        scaler = browser.ctl.status("a").backend_config.autoscaling
        assert scaler is not None
        assert (scaler.min_replicas, scaler.max_replicas) == (2, 6)
        status, answer = await browser.change(
            "POST", "/api/v1/backends/a/scale", {"min_replicas": 9}
        )
        assert status == 422
        assert "min_replicas" in answer["error"]["message"]
        status, answer = await browser.change("POST", "/api/v1/backends/zz/scale", {"replicas": 1})
        assert status == 404


async def test_a_scale_never_undoes_a_deploy_under_way() -> None:
    """The scale reads the spec under the backend's lock: a deploy that was being written when
    the scale was asked is the spec it scales."""
    store = _HeldStore()
    runtime = FakeRuntime(auto_ready=True)
    async with opened(runtime, store) as ctl:
        await (await ctl.deploy("a", config(num_replicas=1, version="v1"), RC)).wait()
        store.hold = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ctl.deploy, "a", config(num_replicas=1, version="v2"), RC)
            await settle()  # the deploy holds the lock, its write held
            nursery.start_soon(ctl.scale, "a", 4)
            await settle()
            store.hold.set()
        spec = ctl.status("a").backend_config
        assert (spec.version, spec.num_replicas) == ("v2", 4)
        with pytest.raises(controller.UnknownBackendError):
            await ctl.scale("zz", 1)
        await ctl.delete("a")
        with pytest.raises(controller.RolloutError, match="being deleted"):
            await ctl.scale("a", 2)


class _HeldStore:
    """A MemoryStore whose writes wait while `hold` is not set."""

    def __init__(self) -> None:
        self.hold: trio.Event | None = None
        self._store = controller.MemoryStore()

    async def read_all(self) -> dict[str, str]:
        return await self._store.read_all()

    async def write(self, changes: Mapping[str, str | None]) -> None:
        if self.hold is not None:
            await self.hold.wait()
        await self._store.write(changes)


async def test_undo_from_the_console_is_named_so_in_the_history() -> None:
    async with console(a=config(num_replicas=1, version="v1")) as browser:
        await browser.log_in()
        await (await browser.ctl.deploy("a", config(num_replicas=1, version="v2"), RC)).wait()
        status, answer = await browser.change("POST", "/api/v1/backends/a/undo", {})
        assert status == 202, answer
        newest = browser.ctl.revisions("a", check_code=False)[-1]
        assert (newest.cause.via, newest.version) == ("console", "v1")


def test_the_openapi_document_lists_the_console_endpoints() -> None:
    paths = OPENAPI["paths"]
    for path in [
        "/api/v1/changes",
        "/api/v1/backends/{name}/history",
        "/api/v1/backends/{name}/scale",
        "/api/v1/console/links",
    ]:
        assert path in paths, path


async def test_a_sample_of_many_backends_lets_the_loop_run_between_turns() -> None:
    """A sample of 10,000 backends in one go held the daemon's loop 200-300 ms (issue 43)."""
    timelines = Timelines()
    other = trio.Event()
    seen_at_last: list[bool] = []

    def numbers() -> Iterator[BackendNumbers]:
        for i in range(TURN_EVERY * 3):
            yield BackendNumbers(f"b{i}", 1, 0, 0, 0)
        seen_at_last.append(other.is_set())

    async def go_on() -> None:
        other.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(go_on)  # runs only once the sampler lets the loop go on
        await timelines.sample_in_turns(numbers(), 1_800_000_000.0)
    assert seen_at_last == [True]
    assert len(timelines.json("b0")["points"]) == 1
