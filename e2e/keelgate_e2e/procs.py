"""Start, health-check and stop the local cluster's processes, leaving none behind.

Why it exists: `make up` starts long-lived programs that must outlive it, and `make down` (a
different process) must stop every one of them, including the pod processes the node agent started
and children a program forked. Every process started here runs in its own session and carries the
environment variable MARKER naming its run directory; `sweep` finds leftovers by that marker.

It must never signal a process that does not carry the marker of the run being stopped, and never
bind or connect anywhere but 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Environment variable carried by every process of a run; its value is the run directory.
MARKER = "KEELGATE_E2E_RUN"

LOOPBACK = "127.0.0.1"
#: Proxies must never see loopback traffic.
NO_PROXY = "127.0.0.1,localhost"


class StartError(RuntimeError):
    """A component did not become healthy; the message ends with the tail of its log."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def log_tail(path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a log file, for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def marked_env(run_dir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus the run marker and loopback proxy exclusions."""
    env = dict(os.environ)
    env[MARKER] = str(run_dir)
    env["NO_PROXY"] = env["no_proxy"] = NO_PROXY
    if extra:
        env.update(extra)
    return env


@dataclass
class Proc:
    """A started component: its name, pid, log, and (when started by us) the Popen handle."""

    name: str
    pid: int
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        """True while the process exists and is not a zombie."""
        if self.popen is not None:
            return self.popen.poll() is None
        return pid_alive(self.pid)


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    run_dir: Path,
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    user: str | None = None,
) -> Proc:
    """Start `argv` in its own session, output appended to `log`, carrying the run marker."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=marked_env(run_dir, env),
            start_new_session=True,
            user=user,
        )
    return Proc(name, popen.pid, log, popen)


def wait_until(
    proc: Proc, check: Callable[[], bool], timeout: float, what: str = "healthy"
) -> float:
    """Poll `check` until it is true; return seconds waited. Raise StartError if `proc` dies."""
    started = time.monotonic()
    while True:
        if not proc.alive():
            raise StartError(
                f"{proc.name} exited while starting; log {proc.log}:\n" + log_tail(proc.log)
            )
        with contextlib.suppress(Exception):
            if check():
                return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise StartError(
                f"{proc.name} not {what} after {timeout:.0f}s; log {proc.log}:\n"
                + log_tail(proc.log)
            )
        time.sleep(0.1)


def pid_alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie (zombies are dead, just not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # Field 3, after the parenthesised command name (which may itself contain spaces).
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


def carries_marker(pid: int, run_dir: Path) -> bool:
    """True if process `pid` has MARKER=`run_dir` in its environment."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{MARKER}={run_dir}".encode() in environ.split(b"\0")


def pids_with_env(name: str, value: str) -> list[int]:
    """Every live process (other than this one) with `name`=`value` in its environment."""
    me = os.getpid()
    wanted = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if wanted in environ.split(b"\0") and pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def marked_pids(run_dir: Path) -> list[int]:
    """Every live process (other than this one) carrying the marker of `run_dir`."""
    return pids_with_env(MARKER, str(run_dir))


def _signal(pid: int, sig: signal.Signals, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def stop(
    proc: Proc,
    run_dir: Path,
    sig: signal.Signals = signal.SIGTERM,
    grace: float = 10.0,
    group: bool = True,
) -> None:
    """Send `sig` to `proc` (its whole group if `group`), wait `grace` s, then SIGKILL the group."""
    if proc.popen is None and not carries_marker(proc.pid, run_dir):
        return  # gone, or the pid now belongs to someone else: never signal it
    _signal(proc.pid, sig, group=group)
    deadline = time.monotonic() + grace
    while proc.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.alive():
        _signal(proc.pid, signal.SIGKILL, group=True)
        while proc.alive() and time.monotonic() < deadline + 5:
            time.sleep(0.05)
    if proc.popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=1)


def sweep(run_dir: Path, timeout: float = 5.0) -> list[int]:
    """SIGKILL every process still carrying the marker of `run_dir`; return the pids killed."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout
    while True:
        pids = marked_pids(run_dir)
        if not pids or time.monotonic() > deadline:
            return killed
        for pid in pids:
            _signal(pid, signal.SIGKILL, group=False)
            if pid not in killed:
                killed.append(pid)
        time.sleep(0.1)


def stop_all(procs: Iterable[Proc], run_dir: Path, grace: float = 10.0) -> list[int]:
    """Stop `procs` in the order given, then sweep stragglers; return pids the sweep killed."""
    for proc in procs:
        if proc.name == "postgres":  # SIGINT to the postmaster alone is its "fast" shutdown
            stop(proc, run_dir, sig=signal.SIGINT, grace=grace, group=False)
        else:
            stop(proc, run_dir, grace=grace)
    return sweep(run_dir)
