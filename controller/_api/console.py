"""The web console's pages, served by the daemon beside its API: the login, the shell every page
is drawn in, and the static files of ``controller/console`` (shipped in the package, no build
step). The pages read and act through the API itself, with the session cookie and a CSRF token
(``console_auth``)."""

from __future__ import annotations

import hashlib
import hmac
import importlib.resources
import logging
import re
from typing import final
from urllib.parse import quote

from .console_auth import KEY_HEADER, SESSION_S, Session, Sessions, cookie_name
from .http import (
    HTTPError,
    Receive,
    Scope,
    Send,
    check_method,
    dump,
    parse_json,
    path_of,
    read_body,
)
from .throttle import Throttle

logger = logging.getLogger("controller.api")

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]
#: Served under /console/ as they are. Not the pages (.html): those are served at their own
#: paths only, with the headers that forbid framing them (a page framed by another port of
#: this host would have the session, since ports do not make sites).
_ASSET_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}\.(?:js|css|svg)")
_PAGE_NAME = re.compile(r"[a-z]+\.html")
_CONTENT_TYPES = {
    "js": "text/javascript; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "svg": "image/svg+xml",
}
#: Nothing but the console's own files runs or loads: a backend's name or a log line that looks
#: like markup stays text even if a page slipped (the pages set text, never markup).
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
_PAGE_HEADERS = [
    (b"content-security-policy", _CSP.encode()),
    (b"x-frame-options", b"DENY"),
    # Not no-referrer: under it a browser sends `Origin: null` with a form, which the login's
    # same-origin check must then refuse.
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]
#: The console's page paths: the overview, a backend, a replica's log.
_PAGE = re.compile(r"/|/backends/[^/]+|/backends/[^/]+/logs/[^/]+")
_OWNED = re.compile(r"/|/login|/login/link|/logout|/favicon\.ico|/console/.*|/backends/.*")


def _load_assets() -> dict[str, bytes]:
    folder = importlib.resources.files("controller") / "console"
    if not folder.is_dir():
        return {}
    return {
        f.name: f.read_bytes()
        for f in folder.iterdir()
        if _ASSET_NAME.fullmatch(f.name) or _PAGE_NAME.fullmatch(f.name)
    }


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def same_origin(scope: Scope) -> bool:
    """A browser's request that comes from a page of this daemon (or that no page sent: typed
    in, or a program's). The cookie's SameSite=Strict is the first guard against a request
    forged by another site; this, and the CSRF token, are two more."""
    site = _header(scope, b"sec-fetch-site")
    if site is not None and site not in (b"same-origin", b"none"):
        return False
    origin = _header(scope, b"origin")
    if origin is None:
        return True
    host = _header(scope, b"host") or b""
    return origin in (b"http://" + host, b"https://" + host)


@final
class Console:
    """Serves the console's paths (`owns`) for the daemon's ASGI app, and tells it which
    requests carry a live session (`session_of`)."""

    def __init__(
        self, token: str, sessions: Sessions | None = None, throttle: Throttle | None = None
    ):
        self._token = token.encode()
        self.sessions = sessions if sessions is not None else Sessions(token)
        self.throttle = throttle if throttle is not None else Throttle()
        """Shared with the API's bearer tokens: one count per client address."""
        self._assets = _load_assets()
        self._etags = {
            name: b'"%s"' % hashlib.sha256(data).hexdigest()[:16].encode()
            for name, data in self._assets.items()
        }

    @staticmethod
    def owns(path: str) -> bool:
        return _OWNED.fullmatch(path) is not None

    def session_of(self, scope: Scope) -> Session | None:
        raw = _header(scope, b"cookie")
        if raw is None:
            return None
        wanted = cookie_name(_port(scope))
        # Every cookie of that name is tried: another port of this host may set one with a
        # longer path, which the browser then sends first (to shadow the real one).
        for part in raw.decode("latin-1").split(";"):
            name, _, value = part.strip().partition("=")
            if name == wanted:
                session = self.sessions.check(value)
                if session is not None:
                    return session
        return None

    def key_ok(self, scope: Scope, session: Session) -> bool:
        """The request carries the session's key (which only the console's pages hold, in
        their origin's storage) and comes from this origin."""
        sent = _header(scope, KEY_HEADER)
        return same_origin(scope) and self.sessions.key_ok(
            session, None if sent is None else sent.decode("latin-1")
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            status, headers, body = await self._route(scope, receive)
        except HTTPError as exc:
            status, body = exc.status, dump(exc.body)
            headers = [(b"content-type", b"application/json")]
            if exc.allow:
                headers.append((b"allow", ", ".join(exc.allow).encode()))
            if exc.retry_after is not None:
                headers.append((b"retry-after", b"%d" % exc.retry_after))
        headers = [
            *headers,
            (b"content-length", b"%d" % len(body)),
            (b"x-content-type-options", b"nosniff"),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send(
            {"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body}
        )

    async def _route(self, scope: Scope, receive: Receive) -> Answer:
        path, method = path_of(scope), scope["method"]
        if path.startswith("/console/") or path == "/favicon.ico":
            check_method(method, ("GET", "HEAD"), path)
            return self._asset("favicon.svg" if path == "/favicon.ico" else path[9:], scope)
        if path == "/login":
            check_method(method, ("GET", "HEAD", "POST"), path)
            if method == "POST":
                return await self._log_in(scope, receive)
            return self._page("login.html")
        if path == "/login/link":
            check_method(method, ("POST",), path)
            return await self._log_in_by_link(scope, receive)
        if path == "/logout":
            check_method(method, ("POST",), path)
            return self._log_out(scope)
        check_method(method, ("GET", "HEAD"), path)
        if _PAGE.fullmatch(path) is None:
            raise HTTPError(404, "NotFound", f"no such page: {path}")
        if self.session_of(scope) is None:
            query = scope.get("query_string", b"").decode("latin-1")
            where = path + (f"?{query}" if query else "")
            return 303, [(b"location", b"/login?next=" + quote(where, safe="/").encode())], b""
        # The shell holds no data and no secret: the cookie alone (which a browser sends to
        # every port of this host, not only to this daemon's) loads nothing more than this.
        return self._page("index.html")

    def _page(self, name: str) -> Answer:
        page = self._assets.get(name)
        if page is None:
            raise HTTPError(503, "ConsoleMissing", "the console's files are not installed")
        return 200, [(b"content-type", b"text/html; charset=utf-8"), *_PAGE_HEADERS], page

    def _asset(self, name: str, scope: Scope) -> Answer:
        data = self._assets.get(name) if _ASSET_NAME.fullmatch(name) else None
        if data is None:
            raise HTTPError(404, "NotFound", f"no such file: /console/{name}")
        etag = self._etags[name]
        headers = [
            (b"content-type", _CONTENT_TYPES[name.rpartition(".")[2]].encode()),
            # Checked on every load (a new version of the package shows at once), sent again
            # only when it changed.
            (b"cache-control", b"no-cache"),
            (b"etag", etag),
        ]
        if _header(scope, b"if-none-match") == etag:
            return 304, headers, b""
        return 200, headers, data

    async def _log_in(self, scope: Scope, receive: Receive) -> Answer:
        """``{"token": ...}`` from the login page's script."""
        if not same_origin(scope):
            raise HTTPError(403, "CrossOrigin", "a login must come from this daemon's own page")
        data = parse_json(await read_body(scope, receive))
        token = data.get("token") if isinstance(data, dict) else None
        if not isinstance(token, str) or not hmac.compare_digest(
            token.strip().encode(), self._token
        ):
            await self.throttle.failed(scope, "the console's login with a wrong token")
            raise HTTPError(401, "Unauthorized", "that is not the daemon's token")
        return self._start_session(scope)

    async def _log_in_by_link(self, scope: Scope, receive: Receive) -> Answer:
        """``{"code": ...}``: a one-time link's code, from the login page's script."""
        if not same_origin(scope):
            raise HTTPError(403, "CrossOrigin", "a login must come from this daemon's own page")
        data = parse_json(await read_body(scope, receive))
        code = data.get("code") if isinstance(data, dict) else None
        if not isinstance(code, str) or not self.sessions.take_link_code(code):
            await self.throttle.failed(scope, "a login link used, expired or never made")
            raise HTTPError(403, "LinkSpent", "this login link is used or expired")
        return self._start_session(scope)

    def _start_session(self, scope: Scope) -> Answer:
        """The cookie, and in the body the session's key, which the page keeps in its own
        origin's storage (this scheme, host and port only) and sends with every call."""
        value, session = self.sessions.new_session()
        cookie = (
            f"{cookie_name(_port(scope))}={value}; Path=/; Max-Age={SESSION_S}; "
            "HttpOnly; SameSite=Strict"
        )
        logger.info("console: logged in")
        headers = [(b"set-cookie", cookie.encode()), (b"content-type", b"application/json")]
        return 200, headers, dump({"key": session.key, "expires_in_s": SESSION_S})

    def _log_out(self, scope: Scope) -> Answer:
        session = self.session_of(scope)
        if session is not None:
            if not self.key_ok(scope, session):
                raise HTTPError(403, "CSRFRejected", "the X-Console-Key header is missing or wrong")
            self.sessions.revoke(session)
        gone = f"{cookie_name(_port(scope))}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict"
        return 204, [(b"set-cookie", gone.encode())], b""


def _port(scope: Scope) -> int | None:
    server = scope.get("server")
    return None if not server or server[1] is None else int(server[1])
