"""Tracing: the seam through which the loop tells where a run's time and tokens went.

Why it exists: a run is one trace, whichever processes drive it (a step pod per iteration, the
CLI, a Temporal worker), so the loop marks its run, session, phases, model calls and tool calls
as spans, with the OpenTelemetry GenAI conventions' names and attributes, and Keelgate's own under
``keelgate.``. The core only speaks to ``Tracer``, a small protocol; the OpenTelemetry SDK lives
in ``keelgate.adapters.tracing`` and is imported only when tracing is configured. By default
(``NO_TRACING``) every span is a shared no-op object: tracing off costs a method call.

The run's trace is named by a ``TraceRef`` kept in its checkpoint (``RunState.trace``), so a
resume, a step pod or a settlement anywhere joins the same trace. This module must never import
OpenTelemetry, and never put a tool's arguments, a model's messages or a secret on a span (a
setting of the tracer may add a tool's arguments; nothing here does).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated, Protocol

from keelgate.core.json_codec import OMIT_EMPTY, JsonValue

AttributeValue = str | bool | int | float
Attributes = Mapping[str, AttributeValue]


@dataclass(frozen=True)
class TraceRef(JsonValue):
    """A run's trace: its trace id, the id of the run's own span (every other span of the run
    descends from it), and when the run started (ISO 8601): all the run span needs to be
    exported by whoever ends the run."""

    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    started_at: Annotated[str, OMIT_EMPTY] = ""

    @classmethod
    def new(cls, *, started_at: str = "") -> TraceRef:
        return cls(secrets.token_hex(16), secrets.token_hex(8), started_at)

    @property
    def traceparent(self) -> str:
        """The W3C traceparent naming the run's span (sampled)."""
        return f"00-{self.trace_id}-{self.span_id}-01"

    @property
    def tracestate(self) -> str:
        """The W3C tracestate entry that names the run's span and its start to a process
        handed another span of the run (``keelgate=<span id>@<started at>``)."""
        return f"{STATE_KEY}={self.span_id}@{self.started_at}"

    def traceparent_of(self, span_id: str) -> str:
        """The W3C traceparent naming another span of the run's trace (sampled)."""
        return f"00-{self.trace_id}-{span_id}-01"

    @classmethod
    def handed(cls, traceparent: str, tracestate: str) -> TraceRef | None:
        """The run's trace a process was handed with one of its spans (``traceparent``) and
        ``tracestate`` naming the run's own span; None when they name none."""
        parts = traceparent.strip().split("-")
        if len(parts) != 4 or len(parts[1]) != 32 or not _hex(parts[1]):
            return None
        for entry in tracestate.split(","):
            key, _, value = entry.strip().partition("=")
            span, at, started = value.partition("@")
            if key == STATE_KEY and at and len(span) == 16 and _hex(span):
                return cls(parts[1], span, started)
        return None


#: The tracestate key of Keelgate's entry.
STATE_KEY = "keelgate"


def _hex(text: str) -> bool:
    try:
        int(text, 16)
    except ValueError:
        return False
    return True


class Span(Protocol):
    """One span under way: attributes and events may be added until it ends."""

    def set(self, key: str, value: AttributeValue) -> None: ...

    def event(self, name: str, attributes: Attributes | None = None) -> None: ...

    def fail(self, description: str) -> None:
        """Mark the span as failed (its status ERROR), saying why in Keelgate's own words."""
        ...


class Tracer(Protocol):
    """Where the loop's spans go."""

    @property
    def enabled(self) -> bool: ...

    @property
    def records_arguments(self) -> bool:
        """Whether tool calls' spans carry their arguments (off unless a setting asks)."""
        ...

    def new_run(self) -> TraceRef:
        """The trace of a run this tracer meets without one: the one it was handed (the
        operator names a run's trace before its first step pod), else a new one."""
        ...

    def run(self, ref: TraceRef) -> RunTrace:
        """The tracer of one run: its spans descend from the run's span."""
        ...

    def record(
        self,
        name: str,
        *,
        trace_id: str,
        span_id: str,
        parent_span_id: str | None,
        start: str,
        end: str = "",
        attributes: Attributes | None = None,
        events: list[RunEvent] | None = None,
        error: str = "",
    ) -> None:
        """Send a span whose ids were chosen beforehand and whose times are known (ISO 8601;
        ``end`` "" is now): a step pod's, told by the operator once the pod has ended."""
        ...

    def close(self) -> None:
        """Send what is still to be sent (a process's last act)."""
        ...


class RunTrace(Protocol):
    def session(self, attributes: Attributes) -> ContextManagerSpan:
        """The span of this process's session of the run: a new one, or (a step pod, handed
        its own span by the operator, which sends it) that span, made current, so that a crash
        leaves no span without its parent."""
        ...

    def span(
        self, name: str, attributes: Attributes | None = None, *, kind: str = "internal"
    ) -> ContextManagerSpan:
        """A span (child of the current one, else of the run's parent) for the ``with``
        block; ``kind`` is ``internal`` or ``client``."""
        ...

    def end_run(self, name: str, attributes: Attributes, events: list[RunEvent]) -> None:
        """Export the run's own span (``TraceRef.span_id``) now that the run has ended: from
        ``TraceRef.started_at`` to now, with ``events`` (stops, settlements) on it."""
        ...


class ContextManagerSpan(Protocol):
    def __enter__(self) -> Span: ...

    def __exit__(self, *exc: object) -> bool | None: ...


@dataclass(frozen=True)
class RunEvent:
    """A moment of a run shown on its span: a stop, a settlement, an approval."""

    name: str
    at: str  # ISO 8601
    attributes: Attributes


class _NoSpan:
    """The span of a tracer that traces nothing."""

    def set(self, key: str, value: AttributeValue) -> None:
        pass

    def event(self, name: str, attributes: Attributes | None = None) -> None:
        pass

    def fail(self, description: str) -> None:
        pass

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


NO_SPAN = _NoSpan()


class _NoRunTrace:
    def session(self, attributes: Attributes) -> _NoSpan:
        return NO_SPAN

    def span(
        self, name: str, attributes: Attributes | None = None, *, kind: str = "internal"
    ) -> _NoSpan:
        return NO_SPAN

    def end_run(self, name: str, attributes: Attributes, events: list[RunEvent]) -> None:
        pass


class _NoTracing:
    enabled = False
    records_arguments = False
    _run = _NoRunTrace()

    def close(self) -> None:
        pass

    def record(self, name: str, **fields: object) -> None:
        pass

    def new_run(self) -> TraceRef:
        return TraceRef.new()

    def run(self, ref: TraceRef) -> _NoRunTrace:
        return self._run


#: The tracer of a loop that traces nothing (the default).
NO_TRACING: Tracer = _NoTracing()


def endpoint_set(environ: Mapping[str, str]) -> bool:
    """Whether the environment asks for traces to be exported (the OpenTelemetry SDK's own
    variables: an OTLP endpoint, and the SDK and its trace exporter not turned off)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(environ.get(name) for name in ENDPOINT_VARIABLES)


#: The OpenTelemetry SDK's variables that name where traces go (the first set wins).
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


# What an outgoing call of a tool should carry to join the trace (W3C trace context headers),
# set by the tracer while a tool's span is current.
_outgoing: ContextVar[Mapping[str, str] | None] = ContextVar("keelgate_trace_headers", default=None)


def outgoing_headers() -> Mapping[str, str]:
    """The trace context headers (``traceparent``, ``tracestate``) an HTTP request or an MCP
    call made now should carry; empty when nothing is traced."""
    return _outgoing.get() or {}


@contextmanager
def carrying(headers: Mapping[str, str]) -> Iterator[None]:
    """Make ``headers`` what outgoing calls carry while the block runs (the tracer's part)."""
    token = _outgoing.set(dict(headers))
    try:
        yield
    finally:
        _outgoing.reset(token)
