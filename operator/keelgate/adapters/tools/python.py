"""The ``python`` tool: a user's function ``fn(args: dict, *, idempotency_key: str | None)``.

A WRITE or PROPOSE gets its idempotency key as a keyword argument so the function can pass it to
the system it changes. A timeout, when set, is enforced from a watcher thread: the call's outcome
is then unknown (the function may still be running), never retried. A WRITE or PROPOSE is always
bounded: by the timeout, or else by its write deadline (``keelgate.core.fence``). A function that
sends by itself calls ``keelgate.about_to_send(idempotency_key)`` right before each request (it
checks the deadline and records the send); threads it starts run ``keelgate.fenced(...)``
functions to stay inside the call. The function signals a definite failure by raising
``keelgate.ToolError``, which is read as "nothing happened" only if nothing of the call was
reported sent.

Where a bounded call runs and how its caller waits for it is one seam (``simulated``): kept
worker threads waited on in real time, everywhere but in a simulation, which runs the function
on its virtual time (``keelgate.testing.sim``) so that this module's own handling of a call
that outlives its limit is what the simulated world meets. The seam must never change what a
call's end or timeout means, only where the function runs and how time passes for its caller.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from keelgate.core import fence
from keelgate.core.calls import callable_name
from keelgate.core.types import ApprovalRule, SideEffect
from keelgate.core.values import SECONDS_MAX
from keelgate.errors import OutcomeUncertain

ToolFunction = Callable[..., Any]


@dataclass
class PythonTool:
    name: str
    function: ToolFunction
    side_effect: SideEffect = SideEffect.READ
    requires_approval: bool = False
    approval: ApprovalRule | None = None  # who must approve (a count, groups ...), if more than one
    description: str = ""
    input_schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})
    timeout_seconds: float | None = None
    # The manifest's reference to the function ("pkg.module:function"), when built from one.
    reference: str = ""
    # The step image the manifest names (``spec.step.image``), whose code the function is;
    # "" for the operator's own (the platform's) or outside a cluster.
    image: str = ""

    @property
    def definition(self) -> Mapping[str, Any]:
        """What decides this tool's call (``keelgate.core.calls``): the function called, as the
        manifest names it, else by its module and name, and the step image it is loaded from
        when the manifest names one (another image may hold other code under the same name)."""
        parts: dict[str, Any] = {"python.callable": self.reference or callable_name(self.function)}
        if self.image:
            parts["python.image"] = self.image
        return parts

    def __post_init__(self) -> None:
        # Refused here, not when the call is made: a timeout the thread join cannot take would
        # raise after a WRITE started, and the WRITE would read as an unknown outcome.
        timeout = self.timeout_seconds
        if timeout is not None and not 0 < timeout <= SECONDS_MAX:
            raise ValueError(
                f"{self.name}: timeout_seconds must be above 0 and at most {SECONDS_MAX} "
                f"(a year), not {timeout!r}"
            )

    def invoke(self, args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        limit = self.timeout_seconds
        deadline = fence.current()
        if deadline is not None:  # a WRITE or PROPOSE: never waited on past its deadline
            left = deadline.remaining()
            limit = left if limit is None else min(limit, left)
        if limit is None:
            return self.function(dict(args), idempotency_key=idempotency_key)
        call = _Call()
        # It runs in a copy of this context, so the function sees the call's write deadline.
        context = contextvars.copy_context()
        workers = _workers
        workers.run(
            self.name, lambda: call.run(context, self.function, dict(args), idempotency_key)
        )
        if not workers.wait(call, limit):
            within = (
                f"{self.timeout_seconds}s"
                if self.timeout_seconds is not None and limit >= self.timeout_seconds
                else "its write deadline"
            )
            raise OutcomeUncertain(
                f"{self.name} did not return within {within}", still_running=call
            )
        return call.outcome()


class _Call:
    """A call on its worker thread: its outcome, and who to tell when it ends late."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Held until the call ends: a bare lock is the cheapest way to wait for another thread.
        self._ended = threading.Lock()
        self._ended.acquire()
        self._done = False
        self._result: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Any, BaseException | None], None]] = []

    def run(
        self,
        context: contextvars.Context,
        function: ToolFunction,
        args: dict[str, Any],
        idempotency_key: str | None,
    ) -> None:
        try:
            result = context.run(function, args, idempotency_key=idempotency_key)
        except BaseException as error:
            self.finish(None, error)
        else:
            self.finish(result, None)

    def wait(self, seconds: float) -> bool:
        """Whether the call ended within `seconds`."""
        if not self._ended.acquire(timeout=seconds):
            return False
        self._ended.release()
        return True

    def finish(self, result: Any, error: BaseException | None) -> None:
        with self._lock:
            self._done, self._result, self._error = True, result, error
            callbacks, self._callbacks = self._callbacks, []
        self._ended.release()
        for callback in callbacks:
            callback(result, error)

    def when_done(self, callback: Callable[[Any, BaseException | None], None]) -> None:
        with self._lock:
            if not self._done:
                self._callbacks.append(callback)
                return
        callback(self._result, self._error)

    def outcome(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._result


class Workers(Protocol):
    """Where bounded calls run, and how their caller waits for one (``simulated``)."""

    def run(self, name: str, job: Callable[[], None]) -> None:
        """Start ``job`` (one call of tool ``name``; it never raises) apart from the caller."""

    def wait(self, call: _Call, seconds: float) -> bool:
        """Whether ``call``, started by ``run``, ended within ``seconds`` of the caller's
        waiting for it."""


class _Workers:
    """Daemon threads that run bounded calls, kept for the next call once one returns.

    Starting a thread per call cost more than the rest of a WRITE's bookkeeping together; a
    kept thread takes the next call from a queue. Daemon threads, not an executor: a hung tool
    must not hold the process open at exit, and it keeps its thread (the next call gets
    another), so no call ever waits behind a hung one.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def run(self, name: str, job: Callable[[], None]) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1
        self._jobs.put(job)
        if spawn:
            threading.Thread(target=self._work, name=f"tool-{name}", daemon=True).start()

    def _work(self) -> None:
        while True:
            self._jobs.get()()
            with self._lock:
                self._idle += 1

    def wait(self, call: _Call, seconds: float) -> bool:
        return call.wait(seconds)  # on this thread, in real time


_WORKERS = _Workers()
#: Where bounded calls run now: the kept threads, unless a simulation put its own (``simulated``).
_workers: Workers = _WORKERS


@contextmanager
def simulated(workers: Workers) -> Iterator[None]:
    """Run every bounded call with ``workers`` for the block (a simulation's, on its virtual
    time), then on the kept threads again."""
    global _workers
    saved, _workers = _workers, workers
    try:
        yield
    finally:
        _workers = saved
