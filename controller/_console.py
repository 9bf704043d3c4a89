"""The web console's pages, served by the daemon beside its API: the login, the shell every page
is drawn in, and the static files of ``controller/console`` (shipped in the package, no build
step). The pages read and act through the API itself, with the session cookie and a CSRF token
(``_console_auth``)."""

from __future__ import annotations

import hashlib
import hmac
import importlib.resources
import logging
import re
from typing import final
from urllib.parse import parse_qs, quote

from ._console_auth import CSRF_HEADER, SESSION_S, Session, Sessions, cookie_name
from ._http import HTTPError, Receive, Scope, Send, dump, parse_json, path_of, read_body

logger = logging.getLogger("controller.api")

#: A login form's body, at most: a token and a path.
MAX_FORM_BYTES = 8192
_ASSET_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}\.(?:js|css|html|svg)")
_CONTENT_TYPES = {
    "js": "text/javascript; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "html": "text/html; charset=utf-8",
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
    return {f.name: f.read_bytes() for f in folder.iterdir() if _ASSET_NAME.fullmatch(f.name)}


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


def _safe_next(value: str | None) -> str:
    """Where a login goes on to: a path of this daemon only (``//evil`` is another host)."""
    if (
        value is None
        or not value.startswith("/")
        or value.startswith(("//", "/\\"))
        or len(value) > 2000
        or not value.isprintable()
    ):
        return "/"
    return value


@final
class Console:
    """Serves the console's paths (`owns`) for the daemon's ASGI app, and tells it which
    requests carry a live session (`session_of`)."""

    def __init__(self, token: str, sessions: Sessions | None = None):
        self._token = token.encode()
        self.sessions = sessions if sessions is not None else Sessions(token)
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
        for part in raw.decode("latin-1").split(";"):
            name, _, value = part.strip().partition("=")
            if name == wanted:
                return self.sessions.check(value)
        return None

    def csrf_ok(self, scope: Scope, session: Session) -> bool:
        sent = _header(scope, CSRF_HEADER)
        return same_origin(scope) and self.sessions.csrf_ok(
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
        headers = [
            *headers,
            (b"content-length", b"%d" % len(body)),
            (b"x-content-type-options", b"nosniff"),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send(
            {"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body}
        )

    async def _route(
        self, scope: Scope, receive: Receive
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        path, method = path_of(scope), scope["method"]
        if path.startswith("/console/") or path == "/favicon.ico":
            _methods(method, ("GET", "HEAD"), path)
            return self._asset("favicon.svg" if path == "/favicon.ico" else path[9:], scope)
        if path == "/login":
            _methods(method, ("GET", "HEAD", "POST"), path)
            if method == "POST":
                return await self._log_in(scope, receive)
            return self._login_page(200, "")
        if path == "/login/link":
            _methods(method, ("POST",), path)
            return await self._log_in_by_link(scope, receive)
        if path == "/logout":
            _methods(method, ("POST",), path)
            return self._log_out(scope)
        _methods(method, ("GET", "HEAD"), path)
        if _PAGE.fullmatch(path) is None:
            raise HTTPError(404, "NotFound", f"no such page: {path}")
        session = self.session_of(scope)
        if session is None:
            query = scope.get("query_string", b"").decode("latin-1")
            where = path + (f"?{query}" if query else "")
            return 303, [(b"location", b"/login?next=" + quote(where, safe="/").encode())], b""
        shell = self._assets.get("index.html")
        if shell is None:
            raise HTTPError(503, "ConsoleMissing", "the console's files are not installed")
        page = shell.replace(b"{{csrf}}", session.csrf.encode())
        return 200, [(b"content-type", b"text/html; charset=utf-8"), *_PAGE_HEADERS], page

    def _asset(self, name: str, scope: Scope) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
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

    def _login_page(self, status: int, error: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        page = self._assets.get("login.html")
        if page is None:
            raise HTTPError(503, "ConsoleMissing", "the console's files are not installed")
        # The error is one of our own sentences, but escaped all the same: it lands in markup.
        text = error.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        page = page.replace(b"{{error}}", text.encode())
        return status, [(b"content-type", b"text/html; charset=utf-8"), *_PAGE_HEADERS], page

    async def _log_in(
        self, scope: Scope, receive: Receive
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        if not same_origin(scope):
            raise HTTPError(403, "CrossOrigin", "a login must come from this daemon's own page")
        form = await _read_form(scope, receive)
        token = form.get("token", [""])[-1].strip().encode()
        if not token or not hmac.compare_digest(token, self._token):
            logger.warning("console: a login with a wrong token")
            return self._login_page(401, "That is not the daemon's token.")
        return self._start_session(scope, _safe_next(form.get("next", [None])[-1]))

    async def _log_in_by_link(
        self, scope: Scope, receive: Receive
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        if not same_origin(scope):
            raise HTTPError(403, "CrossOrigin", "a login must come from this daemon's own page")
        data = parse_json(await read_body(scope, receive))
        code = data.get("code") if isinstance(data, dict) else None
        if not isinstance(code, str) or not self.sessions.take_link_code(code):
            raise HTTPError(403, "LinkSpent", "this login link is used or expired")
        _, headers, _ = self._start_session(scope, "/")
        return 204, [h for h in headers if h[0] != b"location"], b""

    def _start_session(
        self, scope: Scope, then: str
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        value, _ = self.sessions.new_session()
        cookie = (
            f"{cookie_name(_port(scope))}={value}; Path=/; Max-Age={SESSION_S}; "
            "HttpOnly; SameSite=Strict"
        )
        logger.info("console: logged in")
        return 303, [(b"set-cookie", cookie.encode()), (b"location", then.encode())], b""

    def _log_out(self, scope: Scope) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        session = self.session_of(scope)
        if session is not None:
            if not self.csrf_ok(scope, session):
                raise HTTPError(403, "CSRFRejected", "the X-CSRF-Token header is missing or wrong")
            self.sessions.revoke(session)
        gone = f"{cookie_name(_port(scope))}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict"
        return 204, [(b"set-cookie", gone.encode())], b""


def _port(scope: Scope) -> int | None:
    server = scope.get("server")
    return None if not server or server[1] is None else int(server[1])


def _methods(method: str, allowed: tuple[str, ...], path: str) -> None:
    if method not in allowed:
        raise HTTPError(
            405,
            "MethodNotAllowed",
            f"{method} is not allowed on {path}; allowed: {', '.join(allowed)}",
            allow=allowed,
        )


async def _read_form(scope: Scope, receive: Receive) -> dict[str, list[str]]:
    kind = (_header(scope, b"content-type") or b"").split(b";")[0].strip().lower()
    if kind != b"application/x-www-form-urlencoded":
        raise HTTPError(415, "UnsupportedMediaType", "the login form is sent form-encoded")
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HTTPError(400, "Disconnected", "the client went away")
        body += message.get("body", b"")
        if len(body) > MAX_FORM_BYTES:
            raise HTTPError(413, "TooLarge", f"a login form is at most {MAX_FORM_BYTES} bytes")
        if not message.get("more_body", False):
            break
    try:
        return parse_qs(body.decode(), keep_blank_values=True, max_num_fields=10)
    except (UnicodeDecodeError, ValueError):
        raise HTTPError(400, "BadForm", "the login form could not be read") from None
