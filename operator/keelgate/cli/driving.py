"""How ``keelgate run`` and ``keelgate resume`` drive a run in this process, as a person at a
terminal (or a script) meets it: its signals, its progress, and who else drives it.

Why it exists: the loop keeps its promise whatever stops the process, but how a stop *feels*
is the command line's. Ctrl-C (or SIGTERM) while a WRITE is being sent does not cut the call:
the call is let finish and be recorded (it is bounded by its write deadline, and the line on
stderr says how long that is at most), the run stops at its next checkpoint with nothing
unknown, and a second Ctrl-C cuts the call after all (its outcome then unknown, to settle).
Anywhere else Ctrl-C stops at once: nothing there is lost. A long run shows where it is on one
line of stderr, redrawn, only when stderr is a terminal. ``driven_now`` tells a run another
process is driving from one whose process is gone, by the run's lock. This module must never
swallow a second signal, never print progress into a pipe or a file, and never print a tool's
argument.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keelgate.cli.pipes import tool_output_to_stderr
from keelgate.core.protocols import RunLock, Stores
from keelgate.core.spec import LoopSpec
from keelgate.core.types import LoopKind, Outcome, RunPhase
from keelgate.errors import KeelgateError

if TYPE_CHECKING:
    from keelgate.stores.url import StoreUrl

#: How long a command that drives a run waits for the run's lock before saying it is busy: a
#: driver that has just died is seen gone at once (the kernel drops a SQLite flock with the
#: process; a PostgreSQL server ends a dead client's session within milliseconds), and a
#: ``status`` looking holds the lock only for an instant.
CLI_BUSY_WAIT = 0.5
#: A run is shown in progress only once it has been driven this long: a short one says nothing.
PROGRESS_AFTER = 1.0
#: How often the progress line is redrawn.
PROGRESS_EVERY = 0.5


class Interrupted(Exception):
    """Ctrl-C (or SIGTERM) while a run was being driven: the CLI says how to continue that very
    run. ``finished``: the first signal came during a WRITE, whose call was let end and be
    recorded before the run stopped at its checkpoint (nothing is unknown)."""

    def __init__(self, run: str, *, terminated: bool = False, finished: bool = False) -> None:
        super().__init__(run)
        self.run = run
        self.terminated = terminated
        self.finished = finished


class Terminated(KeyboardInterrupt):
    """SIGTERM while a run is driven here: ``timeout``, a service manager, ``kill``."""


class Signals:
    """Ctrl-C and SIGTERM while a run is driven (see the module's docstring). ``asked`` is the
    loop's ``asked_to_stop``: set by a first signal that came while a WRITE was being sent."""

    def __init__(self) -> None:
        self._asked = threading.Event()
        self.terminated = False

    def asked(self) -> bool:
        return self._asked.is_set()

    def handle(self, signum: int, frame: object) -> None:
        from keelgate.core import fence

        terminated = signum == signal.SIGTERM
        deadline = fence.current()  # set while a WRITE or PROPOSE is being sent, in this thread
        if deadline is None or self._asked.is_set():
            raise Terminated if terminated else KeyboardInterrupt
        self._asked.set()
        self.terminated = terminated
        name = "SIGTERM" if terminated else "Ctrl-C"
        line = (
            f"keelgate: {name}: letting the WRITE being sent finish and be recorded (at most "
            f"{deadline.remaining():.0f}s more: its deadline), then the run stops at its "
            f"checkpoint; {name} again cuts it off (its outcome is then unknown, to settle)\n"
        )
        # os.write: the handler may have interrupted a write to stderr (print is not reentrant).
        os.write(2, line.encode())

    @contextmanager
    def installed(self) -> Iterator[None]:
        """The handlers, while a run is driven from the main thread (signal handlers can be set
        there only). A SIGINT the shell handed over ignored (a background job, nohup) stays
        ignored."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous_int = signal.getsignal(signal.SIGINT)
        previous_term = signal.signal(signal.SIGTERM, self.handle)
        if previous_int is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, self.handle)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous_term)
            signal.signal(signal.SIGINT, previous_int)


class Progress:
    """Where a long run is, on one line of stderr redrawn in place: only on a terminal, and only
    once the run has been driven ``PROGRESS_AFTER`` seconds. Fed by every model call (its
    iteration and phase); a thread redraws the line so the time keeps counting during a long
    call, and ``done`` wipes it before anything else is printed."""

    def __init__(self, run: str, *, stream: Any = None) -> None:
        self.run = run
        self.stream = stream if stream is not None else sys.stderr
        self.shown = _is_terminal(self.stream)
        self.started = time.monotonic()
        self.iteration = 0
        self.phase = ""
        self._drawn = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def seen(self, request: Any) -> None:
        """A model call is about to be made for ``request`` (a ``ModelRequest``)."""
        self.iteration, self.phase = request.iteration, request.phase

    def __enter__(self) -> Progress:
        if self.shown:
            self._thread = threading.Thread(target=self._redraw, name="progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        with self._lock:
            if self._drawn:
                self._write("\r\x1b[K")
                self._drawn = False

    def _redraw(self) -> None:
        while not self._stop.wait(PROGRESS_EVERY):
            elapsed = time.monotonic() - self.started
            if elapsed < PROGRESS_AFTER:
                continue
            doing = {"plan": "planning", "verify": "verifying"}.get(self.phase, "starting")
            where = f"iteration {self.iteration}, {doing}" if self.iteration else doing
            text = f"{self.run}: {where} · {elapsed:.0f}s (Ctrl-C stops it; resume continues)"
            with self._lock:
                if self._stop.is_set():
                    return
                self._write("\r\x1b[K" + text[: _columns(self.stream) - 1])
                self._drawn = True

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self.shown = False


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty()) and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False


def _columns(stream: Any) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, AttributeError, ValueError):
        return 80


def drive(
    spec: LoopSpec, *, store: str | StoreUrl, new_tick: bool, pricing: Path | None
) -> Outcome:
    """Start, resume or tick ``spec``'s run in this process to its next stop; raises
    ``Interrupted`` on Ctrl-C or SIGTERM (see ``Signals``)."""
    from keelgate.adapters.tracing import configured
    from keelgate.manifest import load_pricing
    from keelgate.runners.local import LocalRunner

    tracer = configured()  # the OTEL_* variables: nothing is traced without an endpoint
    signals = Signals()
    progress = Progress(spec.run)
    runner = LocalRunner(
        store=store,
        pricing=None if pricing is None else load_pricing(pricing),
        tracer=tracer,
        busy_wait=CLI_BUSY_WAIT,
        model_calls=progress.seen,
    )
    try:
        with signals.installed(), tool_output_to_stderr(), progress:
            if new_tick and spec.kind is LoopKind.MONITOR:
                outcome = runner.tick(spec, asked_to_stop=signals.asked)
            else:
                outcome = runner.run(spec, asked_to_stop=signals.asked)
    except KeyboardInterrupt as stop:
        # A monitor's own name resumes its latest tick, so the name given is the one to show.
        raise Interrupted(spec.run, terminated=isinstance(stop, Terminated)) from None
    finally:
        tracer.close()
    if signals.asked() and outcome.phase is RunPhase.RUNNING:
        raise Interrupted(spec.run, terminated=signals.terminated, finished=True)
    return outcome


def driven_now(stores: Stores, tenant: str, run: str) -> bool | None:
    """Whether a process drives the run now (it holds the run's lock: see ``RunLock``), for a
    run with no stop recorded: True, another process is at work on it; False, none is (the one
    that drove it ended first: a crash, Ctrl-C, a model server that could not be reached); None
    when the store cannot tell (it locks no runs, or it is on read-only media). The lock is
    taken and let go at once: a driver starting that instant waits for it (``CLI_BUSY_WAIT``)."""
    locks: object = stores.idempotency
    if not isinstance(locks, RunLock):
        return None
    try:
        release = locks.lock_run(tenant, run)
    except KeelgateError:
        return None
    if release is None:
        return True
    release()
    return False


__all__ = [
    "CLI_BUSY_WAIT",
    "Interrupted",
    "Progress",
    "Signals",
    "Terminated",
    "drive",
    "driven_now",
]
