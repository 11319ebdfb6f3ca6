"""Write deadlines: the moment after which a claimed WRITE may no longer be sent.

Why it exists: a process can be paused for any length of time (a long GC, a stalled node, a VM
migration) between claiming a WRITE's key and sending the call. Meanwhile its store sessions may
end, the next step reads the key as an unknown outcome, and a person may truthfully find nothing
downstream and settle it as not executed. If the process then thawed and sent the call, the
order would be placed after a truthful "not executed". So every claim records a deadline on the
store server's clock (claim time + the call's time limit + ``MARGIN``), a settlement "not
executed" is refused until that deadline has passed there, and the process checks its own,
earlier deadline right before the call leaves (``WriteDeadline.check``), on a clock that keeps
counting while the process is paused (``now``: the kernel's boot-time clock on Linux).

The local deadline starts before the claim is sent, so it always falls before the server's; the
margin covers the two clocks' rates, not their settings (no wall clock is compared). What is
left is the time between the last check and the kernel taking the request's first byte: the
HTTP tool checks inside its transport right before the request's headers are written.

This module must never extend a deadline, never read a wall clock for a fence, and never let a
passed deadline read as anything but "nothing was sent".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from keelgate.core import clocks
from keelgate.errors import ToolError

#: Seconds the store's deadline lies beyond the call's own time limit: room for the two clocks'
#: rates to differ, never for a pause (a pause is what the fence is for).
MARGIN = 5.0
#: The time limit of a PROPOSE or WRITE whose tool sets none: every such call is bounded.
DEFAULT_CALL_SECONDS = 300.0
#: The time limit of an HTTP or MCP call whose tool sets none (the tools' own default).
NETWORK_CALL_SECONDS = 30.0


def now() -> float:
    """Seconds on a clock that never goes back and keeps counting while the process is stopped
    or the machine suspended (``CLOCK_BOOTTIME``; ``time.monotonic`` where there is none; read
    through ``keelgate.core.clocks``, which a simulation runs on virtual time)."""
    return clocks.boot()


class DeadlinePassed(ToolError):
    """A WRITE's deadline passed before its call was sent: nothing was sent, and nothing will be
    under this claim (a settlement "not executed" may already stand)."""

    def __init__(self, key: str, late: float) -> None:
        super().__init__(
            f"the call's deadline passed {late:.1f}s before it could be sent (the process was "
            "held up); nothing was sent",
            key=key,
        )
        self.key = key
        self.late = late


@dataclass(frozen=True)
class WriteDeadline:
    """The local deadline of one claimed call: it may start sending only before ``at``
    (seconds on ``now``'s clock)."""

    key: str
    at: float

    @classmethod
    def starting_now(cls, key: str, seconds: float) -> WriteDeadline:
        """A deadline ``seconds`` from now; take it *before* the claim is sent, so it falls
        before the one the store records."""
        return cls(key, now() + seconds)

    def remaining(self) -> float:
        """Seconds left before the call may no longer start (never below zero)."""
        return max(0.0, self.at - now())

    def check(self) -> None:
        """Raise ``DeadlinePassed`` if the call may no longer be sent. Call it right before the
        first byte of the call leaves."""
        late = now() - self.at
        if late >= 0:
            raise DeadlinePassed(self.key, late)


_current: ContextVar[WriteDeadline | None] = ContextVar("keelgate_write_deadline", default=None)


def current() -> WriteDeadline | None:
    """The deadline of the WRITE or PROPOSE this code runs for, if any: a tool checks it right
    before it sends (``check()``) and bounds its wait by it (``remaining()``)."""
    return _current.get()


@contextmanager
def fenced(deadline: WriteDeadline) -> Iterator[WriteDeadline]:
    """Make ``deadline`` the current one while a tool is called (``current``)."""
    token = _current.set(deadline)
    try:
        yield deadline
    finally:
        _current.reset(token)


def call_seconds(timeout: float | None) -> float:
    """The time limit of a PROPOSE or WRITE: its tool's own, or ``DEFAULT_CALL_SECONDS``."""
    return DEFAULT_CALL_SECONDS if timeout is None else float(timeout)
