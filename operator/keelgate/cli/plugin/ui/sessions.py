"""Who may use the decision inbox: one-time sign-in addresses, and sessions bound to the page.

Why it exists: the inbox listens on 127.0.0.1, where every port is one site to a browser:
cookies are not kept apart by port and SameSite does not separate them, so any listener on a
loopback port that the browser visits (another local user's, say) receives the inbox's cookie.
A cookie alone must therefore never be enough to read a page or make a decision.

A session is three secrets, made at sign-in:

- the **cookie** (``HttpOnly``, ``SameSite=Strict``), which the browser sends by itself;
- the **page key**, which the page keeps where only its own origin (scheme, host and port) can
  read it, the browser's ``localStorage`` for the inbox's address, and the inbox's script sends
  in a header (``X-Keelgate-Key``); without JavaScript it rides in the page's own address
  (``/k/KEY/...``), which no other port ever sees (the inbox sends no Referer elsewhere);
- the **form token**, in every decision form, which only a page read with the key holds.

Reading a page needs the cookie and the key; a decision needs the cookie and the form token. A
sign-in address works once (``kubectl keelgate ui`` then prints the next). A session ends after
``idle`` seconds without a page read or a decision by the person (the live updates an open page
fetches by itself do not count) and ``lifetime`` seconds after sign-in, whichever comes first.

It must never accept a cookie without the key (or the form token), a sign-in token twice, or a
session past either limit; and never keep more than ``MAX_SESSIONS`` sessions.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

#: Defaults of ``--session-idle`` and ``--session-lifetime``.
DEFAULT_IDLE = 3600.0
DEFAULT_LIFETIME = 12 * 3600.0
#: Sessions kept at once (each sign-in of a new browser makes one); the oldest goes first.
MAX_SESSIONS = 16


@dataclass(frozen=True)
class Session:
    cookie: str
    key: str  # the page key: the header X-Keelgate-Key, or /k/KEY/ in the address
    form: str  # the form token in every decision form
    started: float
    seen: float  # the last page read or decision

    def ends_at(self, idle: float, lifetime: float) -> float:
        return min(self.seen + idle, self.started + lifetime)


class Sessions:
    """The inbox's sign-in token and live sessions; safe to use from every request thread."""

    def __init__(
        self,
        *,
        idle: float = DEFAULT_IDLE,
        lifetime: float = DEFAULT_LIFETIME,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle, self.lifetime, self.clock = idle, lifetime, clock
        self._lock = threading.Lock()
        self._token = secrets.token_urlsafe(24)
        self._sessions: dict[str, Session] = {}

    @property
    def token(self) -> str:
        """The sign-in token of the address printed last (it works once)."""
        with self._lock:
            return self._token

    def sign_in(self, token: str, cookie: str) -> Session | None:
        """Spend the sign-in token: the session of ``cookie`` if it is a live one (a browser
        that is signed in already keeps its session), else a new one; None for a wrong or
        spent token. A new token is made either way it was spent."""
        with self._lock:
            if not hmac.compare_digest(token.encode(), self._token.encode()):
                return None
            self._token = secrets.token_urlsafe(24)
            now = self.clock()
            found = self._live(cookie, now)
            if found is not None:
                return found
            session = Session(
                cookie=secrets.token_urlsafe(32),
                key=secrets.token_urlsafe(32),
                form=secrets.token_urlsafe(32),
                started=now,
                seen=now,
            )
            if len(self._sessions) >= MAX_SESSIONS:
                oldest = min(self._sessions.values(), key=lambda s: s.started)
                del self._sessions[oldest.cookie]
            self._sessions[session.cookie] = session
            return session

    def find(self, cookie: str) -> Session | None:
        """The live session of ``cookie`` (None: no such session, or it ended)."""
        with self._lock:
            return self._live(cookie, self.clock())

    def ended(self, cookie: str) -> bool:
        """Whether ``cookie`` names no live session (any more)."""
        return self.find(cookie) is None

    def touch(self, session: Session) -> None:
        """The person read a page or decided: the idle time starts again."""
        with self._lock:
            if session.cookie in self._sessions:
                self._sessions[session.cookie] = replace(session, seen=self.clock())

    def _live(self, cookie: str, now: float) -> Session | None:
        # Looked up by a digest comparison with each, not by the dict: the cookie is a secret.
        for known, session in list(self._sessions.items()):
            if hmac.compare_digest(known.encode(), cookie.encode()):
                if now >= session.ends_at(self.idle, self.lifetime):
                    del self._sessions[known]
                    return None
                return session
        return None


def same(given: str, expected: str) -> bool:
    """A secret compared in constant time (either may be empty: then they differ)."""
    return bool(given) and hmac.compare_digest(given.encode(), expected.encode())
