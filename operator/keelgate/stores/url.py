"""A store URL, read once: which backend it names, where, and how to show it.

Why it exists: a store URL comes in at an edge (a flag, ``KEELGATE_STORE``, a Secret, a caller
of ``open_stores``) and is used all the way down (the backend chosen, the file opened, the
server connected to, a tenant's database beside it, a role's URL written into a Secret). It is
read here once, into a ``StoreUrl``, and that value is passed on: nobody below reads the text
again, and a PostgreSQL URL is read by libpq (``conninfo_to_dict``) once, here.

A store URL may carry a password, and a mistyped one may carry it anywhere. So no message built
here quotes a URL as given: a URL is shown only rebuilt from parts that hold no password
(``StoreUrl.shown``, ``StoreUrl.target``), and one that cannot be read is described in fixed
words, never echoed. A ``StoreUrl``'s repr holds its scheme, what is shown and its path, never
the text as given or libpq's reading of it. This module must never log, and imports the
PostgreSQL driver only to read a PostgreSQL URL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from keelgate.errors import InputError

DEFAULT_URL = "sqlite:///./.keelgate/keelgate.db"

SCHEMES = ("sqlite", "postgresql", "postgres", "memory", "langgraph+sqlite")
SQLITE_KINDS = ("sqlite", "langgraph+sqlite")
POSTGRES_KINDS = ("postgresql", "postgres")
UNREADABLE = "(a store URL that cannot be read)"
_USE = "use sqlite:///PATH or postgresql://USER@HOST/DB"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}")
# One HOST[:PORT] of a PostgreSQL URL (libpq allows a comma-separated list of them).
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.%]+\]|[^\[\]:/?#@,]*)(:[0-9]*)?")
# URL settings that would put another user or password beside a role's own.
_CREDENTIAL_SETTINGS = frozenset({"user", "password", "passfile"})


@dataclass(frozen=True)
class StoreUrl:
    """A well-formed store URL, read. ``shown`` is the URL without its password or settings;
    ``path`` a SQLite kind's file; ``hosts`` a PostgreSQL URL's ``HOST[:PORT][,...]`` as
    written. ``text`` (the URL as given) and ``settings`` (libpq's reading of a PostgreSQL
    URL; None where the driver is not installed) may hold the password: they are left out of
    the repr."""

    scheme: str
    shown: str
    path: str = ""
    hosts: str = ""
    text: str = field(default="", repr=False)
    settings: tuple[tuple[str, str], ...] | None = field(default=None, repr=False)

    @property
    def sqlite(self) -> bool:
        return self.scheme in SQLITE_KINDS

    @property
    def postgres(self) -> bool:
        return self.scheme in POSTGRES_KINDS

    @property
    def params(self) -> dict[str, Any]:
        """What libpq connects with (a PostgreSQL URL's only), password included."""
        if self.settings is None:
            raise InputError("--store", "not a valid PostgreSQL URL (libpq cannot read it)")
        return dict(self.settings)

    @property
    def password(self) -> str:
        """The password libpq would send ("" for none), to be masked wherever a server's
        message might quote it."""
        return dict(self.settings or ()).get("password", "")

    @property
    def target(self) -> str:
        """Where a PostgreSQL URL points, for messages: user@host:port/db, never the password."""
        params = dict(self.settings or ())
        user = params.get("user", "")
        where = f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}"
        return f"{user + '@' if user else ''}{where}/{params.get('dbname') or user or ''}"

    def password_of(self, role: str) -> str:
        """The password of this URL when it logs in as ``role`` ("" otherwise)."""
        params = dict(self.settings or ())
        return params.get("password", "") if params.get("user") == role else ""

    def on_database(self, database: str) -> StoreUrl:
        """The same server, credentials and settings, on ``database``."""
        authority = self.shown.partition("://")[2].split("/", 1)[0]
        return replace(
            self,
            shown=f"{self.scheme}://{authority}/{quote(database, safe='')}",
            text=self._rewritten(database=database),
            settings=(
                *((k, v) for k, v in self.params.items() if k != "dbname"),
                ("dbname", database),
            ),
        )

    def with_login(self, role: str, password: str, *, host: str = "", database: str = "") -> str:
        """This URL with ``role`` and ``password`` as its user and password (and ``host``,
        ``HOST`` or ``HOST:PORT``, in place of its hosts where given; ``database`` in place
        of its database where given): same settings, no other credential. Text to hand on
        (a Secret's), holding the password."""
        userinfo = f"{quote(role, safe='')}:{quote(password, safe='')}"
        return self._rewritten(
            userinfo=userinfo, host=host, database=database, drop=_CREDENTIAL_SETTINGS
        )

    def _rewritten(
        self,
        *,
        userinfo: str | None = None,
        host: str = "",
        database: str = "",
        drop: frozenset[str] = frozenset(),
    ) -> str:
        parts = urlsplit(self.text)
        login, at, where = parts.netloc.rpartition("@")
        login = login if userinfo is None else userinfo
        dropped = drop | ({"dbname"} if database else set())
        query = [(k, v) for k, v in parse_qsl(parts.query) if k not in dropped]
        path = "/" + quote(database, safe="") if database else parts.path
        netloc = f"{login}@{host or where}" if (login or at) else host or where
        return urlunsplit((parts.scheme, netloc, path, urlencode(query), ""))


def read_store_url(url: str | StoreUrl) -> StoreUrl:
    """Read a store URL (a ``StoreUrl`` is read already), or raise an ``InputError`` for
    ``--store`` that does not quote it. A PostgreSQL URL is also read by libpq, and a setting
    libpq would refuse only on connecting is refused here, before any connection."""
    if isinstance(url, StoreUrl):
        return url
    read = _read_form(url)
    if read.postgres:
        read = replace(read, settings=_libpq_settings(url))
    return read


def redacted(url: str | StoreUrl) -> str:
    """A store URL fit for a message: rebuilt without its password or ``?`` settings, and a URL
    that cannot be read is not shown at all, however it is malformed."""
    if isinstance(url, StoreUrl):
        return url.shown
    try:
        return _read_form(url).shown
    except InputError:
        return UNREADABLE


def _read_form(url: str) -> StoreUrl:
    """The URL's form, as every kind has it (not yet libpq's reading of a PostgreSQL URL)."""
    if not url:
        raise InputError("--store", f"is empty ({_USE})")
    if "=" in url and "://" not in url:
        raise InputError(
            "--store", "a store is a URL such as postgresql://USER@HOST/DB, not key=value pairs"
        )
    if any(c.isspace() or not c.isprintable() for c in url):
        raise InputError("--store", f"a store URL holds no spaces or control characters ({_USE})")
    kind, separator, rest = url.partition("://")
    if not separator or not _SCHEME.fullmatch(kind):
        # The longest first: "postgres" is also the start of "postgresql".
        for known in sorted(SCHEMES, key=len, reverse=True):
            if url.lower().startswith(known):
                raise InputError("--store", f"a {known} store URL starts with {known}://")
        raise InputError("--store", f"not a store URL ({_USE})")
    kind = kind.lower()
    if kind not in SCHEMES:
        raise InputError("--store", f"unknown store kind {kind!r} ({_USE})")
    if kind in SQLITE_KINDS:
        if not rest.startswith("/") or rest == "/":
            raise InputError(
                "--store", f"a SQLite URL is {kind}:///PATH (three slashes, then the path)"
            )
        return StoreUrl(kind, f"{kind}://{rest}", path=rest[1:], text=url)
    if kind == "memory":
        return StoreUrl(kind, "memory://", text=url)
    # PostgreSQL: userinfo@host[:port][,host[:port]...]/db?settings, read as libpq reads it: the
    # hosts end at the first '/' or '?' ('#' is nothing special to libpq), the userinfo at the
    # first '@' before any '/'. A raw '@' in a password moves that end, and libpq reads the rest
    # of the password as a host or a database name, which its messages quote: so the only raw
    # '@' taken before the settings is the one that ends the userinfo.
    cut = min((i for i in (rest.find(c) for c in "/?") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    misread = "@" not in authority and "@" in rest.split("/", 1)[0]  # host?password=a@b
    if authority.count("@") > 1 or "@" in tail.split("?", 1)[0] or misread:
        raise InputError(
            "--store",
            "an '@' in the user or password must be percent-encoded as %40 (and a '/' as %2F)",
        )
    userinfo, at, hosts = authority.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    if not all(_HOST_PORT.fullmatch(host) for host in hosts.split(",")):
        raise InputError(
            "--store",
            "the host of the URL is not HOST[:PORT] (a missing @, ] or port number?)",
        )
    path = tail.split("?", 1)[0].split("#", 1)[0]
    # The query may hold password=...: it is left out of what is shown, as the password is.
    login = f"{user}{':***' if colon else ''}@" if at else ""
    return StoreUrl(kind, f"{kind}://{login}{hosts}{path}", hosts=hosts, text=url)


# Settings whose values libpq (or psycopg, which reads connect_timeout and the host and port
# lists itself) checks only when it connects, so that a slip in one would read as a store that
# cannot be reached (exit 5). ``_check_settings`` refuses them first, as bad input. Its messages
# name the setting and never quote its value: a mistyped URL may have put a password anywhere.
_CHOICES: dict[str, tuple[str, ...]] = {  # exact, as libpq compares them
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": (
        "any",
        "read-write",
        "read-only",
        "primary",
        "standby",
        "prefer-standby",
    ),
    "load_balance_hosts": ("disable", "random"),
    "sslcertmode": ("disable", "allow", "require"),
    "sslnegotiation": ("postgres", "direct"),
}
_TLS_VERSIONS = ("TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3")  # in any case; empty is no bound
_INTEGERS = (  # a C int, in decimal
    "connect_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
)
_INTEGER = re.compile(r"[+-]?0*[0-9]{1,10}")  # bounded: int() reads no more than 4300 digits
_PORT = re.compile(r"0*[0-9]{1,5}")


def _libpq_settings(url: str) -> tuple[tuple[str, str], ...] | None:
    """libpq's reading of a PostgreSQL URL, checked as it would be on connecting; None where
    the driver is not installed (``open_stores`` names the extra to install)."""
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        return None
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error:
        # libpq's own message may quote the part it could not read: it is not repeated.
        raise InputError("--store", "not a valid PostgreSQL URL (libpq cannot read it)") from None
    _check_settings(params)
    return tuple((str(key), str(value)) for key, value in params.items())


def _check_settings(params: dict[str, Any]) -> None:
    """Refuse (``InputError`` for ``--store``) what libpq would refuse on connecting: a port out
    of 1-65535, a list of ports or of hostaddr values that does not match the list of hosts, an
    sslmode (or another setting with a fixed set of values) out of its set, an integer setting
    that is not an integer."""

    def listed(key: str) -> list[str]:
        value = str(params.get(key) or "")
        return value.split(",") if value else []

    hosts, addresses, ports = listed("host"), listed("hostaddr"), listed("port")
    if not all(_PORT.fullmatch(port) and 1 <= int(port) <= 65535 for port in ports if port):
        raise InputError("--store", "port must be a number from 1 to 65535")
    if hosts and addresses and len(hosts) != len(addresses):
        raise InputError(
            "--store", f"{len(hosts)} hosts but {len(addresses)} hostaddr values (one per host)"
        )
    wanted = max(len(hosts), len(addresses))
    if len(ports) > 1 and len(ports) != wanted:
        raise InputError(
            "--store",
            f"{len(ports)} ports for {wanted} hosts (one port for all of them, or one for each)",
        )
    for key, choices in _CHOICES.items():
        if key in params and params[key] not in choices:
            raise InputError("--store", f"{key} must be one of {', '.join(choices)}")
    versions = [version.lower() for version in _TLS_VERSIONS]
    rank: dict[str, int] = {}
    for key in ("ssl_min_protocol_version", "ssl_max_protocol_version"):
        value = str(params.get(key) or "").lower()
        if value and value not in versions:
            raise InputError("--store", f"{key} must be one of {', '.join(_TLS_VERSIONS)}")
        if value:
            rank[key] = versions.index(value)
    if rank.get("ssl_min_protocol_version", 0) > rank.get("ssl_max_protocol_version", 99):
        raise InputError("--store", "ssl_min_protocol_version is above ssl_max_protocol_version")
    for key in _INTEGERS:
        if key in params:
            value = str(params[key] or "")
            if not _INTEGER.fullmatch(value) or not -(2**31) <= int(value) < 2**31:
                raise InputError("--store", f"{key} must be an integer")
