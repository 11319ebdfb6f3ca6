"""The end of one network exchange: whatever the other side sends, the exchange is over then.

Why it exists: an HTTP client's ``timeout`` bounds each connect, read and write, not the
exchange; a server that sends its headers, or its body, a byte a second keeps a request open for
as long as it likes. For a WRITE that breaks the fence (``keelgate.core.fence``): a settlement
"not executed" is allowed once the store's deadline has passed, on the assumption that no
request of the call is still open by then (docs/design.md, "What the fence assumes of the
downstream"). Elsewhere it holds a step, a confirmer or the notifier's sink past its time limit.
So every exchange Keelgate makes runs under a ``Cutoff``: at its moment (on the boot clock,
through ``keelgate.core.clocks``, so a simulation rings it on virtual time) every connection the
exchange reported is shut down, which ends a read or a write blocked on it at once, and every
``closer`` it was given runs (an event loop's cancellation, a simulated transport's hang-up).
Code that reads the answer in pieces also asks ``passed`` between them.

An HTTP client reports its connections through httpcore's ``trace`` extension (``trace`` for a
synchronous client, ``atrace`` for an asynchronous one): each connection made (TCP, a Unix
socket, TLS on top, a proxy's tunnel) is taken by its socket. A simulated transport that wants
to be cut reports a connection the same way, whose ``get_extra_info("socket")`` has a
``shutdown``, or gives a closer with ``close_with``.

This module must never extend a moment once set, never let a closer's failure stop the others,
and never close anything after the exchange has ended (``__exit__``): a connection's socket
number may belong to someone else by then.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from keelgate.core import clocks

log = logging.getLogger("keelgate.cutoff")

# The httpcore trace events whose return value is a connection's stream.
_CONNECTED = ("connect_tcp.complete", "connect_unix_socket.complete", "start_tls.complete")


class Cutoff:
    """One exchange's end, ``at`` seconds on the boot clock. Use it as a context manager around
    the whole exchange (its request, its answer's headers and body): the alarm is set on entry
    and taken back on exit. ``cut`` says whether the moment came while the exchange was open."""

    def __init__(self, at: float) -> None:
        self.at = at
        self._lock = threading.Lock()
        self._closers: list[Callable[[], object]] = []
        self._cancel: clocks.Cancel | None = None
        self._over = False
        self.cut = False

    @classmethod
    def after(cls, seconds: float, *, at_most: float | None = None) -> Cutoff:
        """An exchange of at most ``seconds`` from now, and never past ``at_most``."""
        at = clocks.boot() + seconds
        return cls(at if at_most is None else min(at, at_most))

    def remaining(self) -> float:
        """Seconds left (never below zero): what a per-operation timeout may be at most."""
        return max(0.0, self.at - clocks.boot())

    @property
    def passed(self) -> bool:
        """Whether the moment has come (or the alarm has already cut the exchange)."""
        return self.cut or clocks.boot() >= self.at

    def __enter__(self) -> Cutoff:
        self._cancel = clocks.alarm(self.at, self._ring)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        with self._lock:
            self._over = True
            self._closers.clear()
        if self._cancel is not None:
            self._cancel()

    def close_with(self, closer: Callable[[], object]) -> None:
        """Run ``closer`` when the moment comes while the exchange is open (at once, if it
        already came)."""
        with self._lock:
            if self._over:
                return
            if not self.cut:
                self._closers.append(closer)
                return
        _quietly(closer)

    def _ring(self) -> None:
        # Under the lock, so that the exchange cannot end (and its sockets be closed and their
        # numbers reused) while they are being shut down.
        with self._lock:
            if self._over:
                return
            self.cut = True
            closers, self._closers = self._closers, []
            for closer in closers:
                _quietly(closer)

    # httpcore's trace extension

    def trace(self, event: str, info: Mapping[str, Any]) -> None:
        """A synchronous client's ``trace``: takes each connection it makes."""
        if event.endswith(_CONNECTED):
            self._take(info.get("return_value"))

    async def atrace(self, event: str, info: Mapping[str, Any]) -> None:
        """An asynchronous client's ``trace``: takes each connection it makes."""
        self.trace(event, info)

    def _take(self, stream: Any) -> None:
        sock = None if stream is None else stream.get_extra_info("socket")
        if sock is not None:
            self.close_with(lambda: sock.shutdown(socket.SHUT_RDWR))


def _quietly(closer: Callable[[], object]) -> None:
    try:
        closer()
    except OSError:
        pass  # closed already: the exchange ended on its own as the moment came
    except Exception:  # one closer's failure must not keep the others from closing
        log.warning("closing an exchange at its time limit failed", exc_info=True)
