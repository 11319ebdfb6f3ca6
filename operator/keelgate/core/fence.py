"""Write deadlines: the moment after which a claimed WRITE may no longer be sent, and what one
call of its tool may have sent.

Why it exists: a process can be paused for any length of time (a long GC, a stalled node, a
SIGSTOP) between claiming a WRITE's key and sending the call. Meanwhile its store sessions may
end, the next step reads the key as an unknown outcome, and a person may truthfully find nothing
downstream and settle it as not executed. If the process then thawed and sent the call, the
order would be placed after a truthful "not executed". So every claim records a deadline on the
store server's clock (claim time + the call's time limit + ``MARGIN``), a settlement "not
executed" is refused until that deadline has passed there, and the process checks its own,
earlier deadline right before each request leaves (``Invocation.sending``), on a clock that
keeps counting while the process is stopped (``now``: the kernel's boot-time clock on Linux).

That clock counts what the guest kernel sees pass: a stopped process, a starved scheduler, a
suspended machine. It does not count time the kernel itself does not run for: a virtual machine
paused by its hypervisor (a KVM pause, the stop phase of a live migration) or a process
checkpointed and restored (CRIU restores its clocks from the checkpoint, in a time namespace).
Such a pause between the claim and the check is not seen here; only the store's deadline, on
another machine's clock, still counts it (docs/design.md, "What is left of each window").

A READ let through on approvals that expire is held to a deadline the same way (its approvals
may lapse during a pause as a WRITE's may), though it has no claim: the gateway asks the
approval gate again before trying it afresh.

A tool call is one unit of knowledge. The gateway makes one ``Invocation`` per call of a WRITE's
or PROPOSE's tool (and of such a READ's); every request it makes (the HTTP and MCP tools do it,
a Python tool reports its own with ``about_to_send``) first checks the deadline and records that
the call may have sent something (a ``Send``). From then on no error of a WRITE's or PROPOSE's
call can mean "nothing happened": the gateway reads it as an unknown outcome, unless every
request sent was answered with a definite refusal (``Send.refused``: a 4xx, a JSON-RPC
refusal), which took no effect. The invocation is carried by a context variable, so it follows
the tool into threads started with ``fenced`` (or any copy of the context), and a Keelgate tool
asked to send for a WRITE with none in reach refuses (``for_sending``) rather than sends
unfenced.
Once the gateway has taken the call's outcome (``Invocation.end``), nothing more of it is sent.
A request that left in time does not outlive the deadline either: Keelgate's tools cut each
exchange there, whatever the server sends (``keelgate.core.cutoff``), since a settlement "not
executed" assumes that no request of the call is still open once the store's deadline has passed.

This module must never extend a deadline, never read a wall clock for a fence, and never let a
refusal it raises read as anything but "nothing was sent by this request".
"""

from __future__ import annotations

import contextvars
import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from keelgate.core import clocks
from keelgate.core.types import SideEffect
from keelgate.errors import ToolError

P = ParamSpec("P")
R = TypeVar("R")

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
    through ``keelgate.core.clocks``, which a simulation runs on virtual time). It does not count
    a hypervisor's pause of the whole machine or a checkpoint-restore (CRIU)."""
    return clocks.boot()


class DeadlinePassed(ToolError):
    """A WRITE's deadline passed before a request of its call was sent: that request was not
    sent, and nothing more will be under this claim (a settlement "not executed" may already
    stand). Whether the call as a whole sent nothing is the gateway's to judge
    (``Invocation.end``): an earlier request of the same call may have left."""

    def __init__(self, key: str, late: float) -> None:
        super().__init__(
            f"the call's deadline passed {late:.1f}s before it could be sent (the process was "
            "held up); nothing was sent",
            key=key,
        )
        self.key = key
        self.late = late


class CallEnded(ToolError):
    """A request of a tool call that the gateway has already finished with (a thread the tool
    left running): it is not sent, since its outcome could no longer be recorded."""

    def __init__(self, key: str) -> None:
        super().__init__(
            "the tool call this request belongs to has already ended; nothing was sent", key=key
        )


@dataclass(frozen=True)
class WriteDeadline:
    """The local deadline of one claimed call (or of a READ let through on approvals that
    expire, which has no claim): it may start sending only before ``at`` (seconds on ``now``'s
    clock)."""

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
        """Raise ``DeadlinePassed`` if the call may no longer be sent. This checks only: a tool
        that sends by itself calls ``about_to_send``, which also records the send."""
        late = now() - self.at
        if late >= 0:
            raise DeadlinePassed(self.key, late)


class Send:
    """One request of a tool call, recorded as possibly sent (``Invocation.sending``)."""

    def __init__(self, call: Invocation) -> None:
        self._call = call
        self._refused = False

    def refused(self) -> None:
        """The request was answered with a definite refusal (a 4xx, a JSON-RPC refusal): it
        took no effect, so it no longer counts as something the call may have done. Only for
        an answer that says so: a timeout, a reset or a 5xx is no such answer."""
        self._call._withdraw(self)


class Invocation:
    """One call of a WRITE's or PROPOSE's tool: its deadline, whether any request of it may
    have taken effect (``sent``), and whether the gateway has finished with it (``end``).
    Shared by every thread the call runs on."""

    def __init__(self, deadline: WriteDeadline) -> None:
        self.deadline = deadline
        self._lock = threading.Lock()
        self._sends = 0  # requests sent and not answered with a definite refusal
        self._ended = False

    @property
    def key(self) -> str:
        return self.deadline.key

    @property
    def sent(self) -> bool:
        """Whether a request of this call may have left and taken effect."""
        with self._lock:
            return self._sends > 0

    def sending(self) -> Send:
        """A request of this call is about to leave: raise ``DeadlinePassed`` if the deadline
        has passed, ``CallEnded`` if the gateway has finished with the call (either way the
        request must not be sent), else record that the call may have sent something."""
        with self._lock:
            if self._ended:
                raise CallEnded(self.key)
            self.deadline.check()
            self._sends += 1
        return Send(self)

    def _withdraw(self, send: Send) -> None:
        with self._lock:
            # Once the gateway has judged the call, its judgement stands.
            if not send._refused and not self._ended:
                send._refused = True
                self._sends -= 1

    def end(self) -> bool:
        """The gateway takes the call's outcome: from now on nothing more of it is sent (a
        thread it left behind is refused). Returns whether anything may have been sent and
        taken effect: the answer cannot change after this, so a refusal judged on it stays
        true."""
        with self._lock:
            self._ended = True
            return self._sends > 0


_current: ContextVar[Invocation | None] = ContextVar("keelgate_invocation", default=None)


def invocation() -> Invocation | None:
    """The WRITE's or PROPOSE's call this code runs for, if any."""
    return _current.get()


def current() -> WriteDeadline | None:
    """The deadline of the WRITE or PROPOSE this code runs for, if any: a tool bounds its wait
    by it (``remaining()``). A tool that sends by itself calls ``about_to_send`` right before
    it does."""
    call = _current.get()
    return None if call is None else call.deadline


@contextmanager
def invoking(call: Invocation) -> Iterator[Invocation]:
    """Make ``call`` the current one while its tool runs (``invocation``, ``current``)."""
    token = _current.set(call)
    try:
        yield call
    finally:
        _current.reset(token)


def changes_things(side_effect: SideEffect, idempotency_key: str | None) -> bool:
    """Whether a tool's call may change things: its tool says WRITE or PROPOSE, or the loop
    gave it a key. A call keeps the class it was planned as, whatever its tool's definition
    says now (edited to READ since the plan): its key goes with it, it is fenced, and an answer
    it never got whole is an unknown outcome, never a failure."""
    return side_effect is not SideEffect.READ or idempotency_key is not None


def for_sending(
    who: str, *, idempotency_key: str | None, changes_things: bool
) -> Invocation | None:
    """The call a request is about to be made for, or None for a READ sent unfenced (a READ let
    through on approvals that expire has one). A request made for a WRITE or PROPOSE (the
    tool's own class says so, or it was given an idempotency key) with no call in reach is
    refused: it runs outside the fence (most likely on a thread the tool started without
    ``fenced``), and would be sent with no deadline checked and no record that the call sent
    anything."""
    call = _current.get()
    if call is None and (changes_things or idempotency_key is not None):
        raise ToolError(
            f"{who}: called for a WRITE or PROPOSE with no write deadline in reach (a thread "
            "started without keelgate.fenced?); nothing was sent"
        )
    return call


class _NoSend(Send):
    """What ``about_to_send`` returns for a READ: there is nothing to withdraw."""

    def __init__(self) -> None:
        self._refused = True

    def refused(self) -> None:
        pass


def about_to_send(idempotency_key: str | None) -> Send:
    """What a Python tool calls right before its own request leaves (Keelgate's HTTP and MCP
    tools do it themselves). For a WRITE or PROPOSE (``idempotency_key`` is its call's key):
    raises ``DeadlinePassed`` once the call's deadline has passed, or ``ToolError`` with no call
    in reach (a thread started without ``fenced``), and then the request must not be sent;
    otherwise records that the call may have sent something, so that no error it raises from
    then on reads as "nothing happened". The request's ``Send`` is returned: ``refused()`` on
    it when the request was answered with a definite refusal that took no effect. For a READ
    (no key, no call) it does nothing."""
    call = for_sending("a request", idempotency_key=idempotency_key, changes_things=False)
    return _NoSend() if call is None else call.sending()


def fenced(function: Callable[P, R]) -> Callable[P, R]:
    """``function``, made to run as part of the tool call in progress wherever it runs: on a
    thread a tool starts (``pool.submit(keelgate.fenced(work), ...)``), it sees the call's
    deadline, its requests are checked against it and counted as the call's own. Each run gets
    its own copy of the context taken now, so one wrapped function may run on many threads at
    once. Outside a tool call it simply runs ``function``."""
    context = contextvars.copy_context()

    @functools.wraps(function)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return context.copy().run(function, *args, **kwargs)

    return run


def call_seconds(timeout: float | None) -> float:
    """The time limit of a PROPOSE or WRITE: its tool's own, or ``DEFAULT_CALL_SECONDS``."""
    return DEFAULT_CALL_SECONDS if timeout is None else float(timeout)
