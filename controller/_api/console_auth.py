"""Who may use the console: a signed session cookie, the CSRF token tied to it, one-time links.

The API token is the one secret. A person proves they hold it (the login form, or a one-time
link that `controller console` asks for with it) and gets two halves of a session:

- a cookie: HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it);
- the session's key, in the login's answer, which the page keeps in its origin's storage and
  sends in a header with every call (it is also what makes a change CSRF-safe).

Both are needed. A browser sends a host's cookies to every port of it, so the cookie alone
reaches any other server on this host (another user's, or the ingress's replicas); the key is
kept per origin (scheme, host and port), so no other port's page can read it. Both are signed
with a key derived from the token, so they need no table: a session outlives a daemon restart,
every daemon sharing the token accepts it, and a new token ends every session at once.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable
from typing import final

import attrs

#: How long a session lasts from its login (a working day; log in again after).
SESSION_S = 12 * 3600
#: How long a one-time link may wait for its click.
LINK_S = 60.0
#: One-time links waiting at once (more asked for push out the oldest).
MAX_LINKS = 100
#: Logged-out sessions remembered until they would have expired anyway.
MAX_REVOKED = 10_000
KEY_HEADER = b"x-console-key"
_EXPIRES = re.compile(r"[1-9][0-9]{0,11}")


def _same(sent: str, expected: str) -> bool:
    """In constant time, whatever was sent: compare_digest takes non-ASCII text only as bytes."""
    return hmac.compare_digest(sent.encode("utf-8", "surrogateescape"), expected.encode())


def cookie_name(port: int | None) -> str:
    """Browsers send a host's cookies to every port of it: two daemons on one machine, each with
    its own token, must not overwrite each other's sessions."""
    return "controller_session" if port is None else f"controller_session_{port}"


@attrs.frozen
class Session:
    nonce: str
    expires: int
    key: str
    """Sent by the page with every call (``X-Console-Key``)."""


@final
class Sessions:
    """Makes and checks sessions and one-time links for one token. `clock` is the wall clock
    (sessions outlive the process; a test passes its own)."""

    def __init__(self, token: str, *, clock: Callable[[], float] = time.time):
        # Its own key, not the token itself: a cookie's signature says nothing of the token.
        self._key = hmac.new(token.encode(), b"controller console sessions v1", "sha256").digest()
        self._clock = clock
        self._links: dict[str, float] = {}
        self._revoked: dict[str, int] = {}

    # -- sessions --

    def new_session(self) -> tuple[str, Session]:
        """A fresh session and its cookie value."""
        nonce = secrets.token_urlsafe(18)
        expires = int(self._clock()) + SESSION_S
        return f"{expires}.{nonce}.{self._sign('session', expires, nonce)}", self._session(
            nonce, expires
        )

    def check(self, cookie: str) -> Session | None:
        """The session a cookie value holds, if it is one of ours, unexpired, not logged out."""
        parts = cookie.split(".")
        # ASCII digits, written one way only ("0123" is not 123): one session, one value.
        if len(parts) != 3 or not _EXPIRES.fullmatch(parts[0]):
            return None
        expires, nonce, mac = int(parts[0]), parts[1], parts[2]
        if not _same(mac, self._sign("session", expires, nonce)):
            return None
        if expires <= self._clock() or nonce in self._revoked:
            return None
        return self._session(nonce, expires)

    def key_ok(self, session: Session, sent: str | None) -> bool:
        return sent is not None and _same(sent, session.key)

    def revoke(self, session: Session) -> None:
        """Logged out: this cookie is refused from now on (by this process: the cookie is also
        deleted from the browser, and it expires anyway)."""
        now = self._clock()
        self._revoked = {n: e for n, e in self._revoked.items() if e > now}
        if len(self._revoked) >= MAX_REVOKED:
            del self._revoked[min(self._revoked, key=self._revoked.__getitem__)]
        self._revoked[session.nonce] = session.expires

    # -- one-time links --

    def new_link_code(self) -> str:
        """A code for one login within `LINK_S`: it goes in a link's fragment, which the
        browser never sends in a request line or a Referer, and the page removes it at once."""
        now = self._clock()
        self._links = {c: t for c, t in self._links.items() if t > now}
        while len(self._links) >= MAX_LINKS:
            del self._links[next(iter(self._links))]
        code = secrets.token_urlsafe(24)
        self._links[code] = now + LINK_S
        return code

    def take_link_code(self, code: str) -> bool:
        """True once for a live code: it is spent by the first try, right or late."""
        expires = self._links.pop(code, None)
        return expires is not None and expires > self._clock()

    # -- signatures --

    def _session(self, nonce: str, expires: int) -> Session:
        return Session(nonce, expires, self._sign("key", expires, nonce)[:32])

    def _sign(self, purpose: str, expires: int, nonce: str) -> str:
        message = f"{purpose}.{expires}.{nonce}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()
