"""Tracing through OpenTelemetry: the SDK and its OTLP exporter behind ``keelgate.core.tracing``.

Why it exists: traces go where the platform already looks (an OpenTelemetry Collector, Jaeger,
Tempo, a vendor), configured the standard way: the SDK's ``OTEL_*`` environment variables
(``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``OTEL_SERVICE_NAME``,
``OTEL_EXPORTER_OTLP_HEADERS``, ...). Without an endpoint (or with ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none``) ``configured`` returns the core's ``NO_TRACING`` without importing
OpenTelemetry at all, so a step pod's start pays nothing for it. A process handed a trace
context from its parent (the W3C ``TRACEPARENT`` and ``TRACESTATE`` environment variables, as
the operator gives each step pod) puts its spans under it. With an endpoint set and the
``tracing`` extra not installed, a process runs as without tracing and says so once (a warning
naming the extra to install): a standard variable set for every process must never stop one.

Keelgate keeps a tracer provider of its own (never the process-wide one an application may have
set). This module must never put a tool's arguments, a model's messages or a secret on a span,
except a tool's arguments when ``KEELGATE_TRACE_TOOL_ARGUMENTS=true`` asks for them.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from keelgate.core import tracing
from keelgate.core.tracing import Attributes, AttributeValue, RunEvent, TraceRef
from keelgate.errors import MissingExtra

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import Span as OtelSpan
    from opentelemetry.trace import SpanContext

#: Where a process finds the trace context its parent handed it (W3C trace context).
TRACEPARENT_ENV = "TRACEPARENT"
TRACESTATE_ENV = "TRACESTATE"

log = logging.getLogger("keelgate.tracing")


def configured(
    *,
    environ: Mapping[str, str] | None = None,
    service: str = "keelgate",
    export_each_span: bool = False,
    exporter: Any = None,
) -> tracing.Tracer:
    """The tracer the environment asks for: ``NO_TRACING`` unless an OTLP endpoint is set (or an
    ``exporter`` is given, as tests give the SDK's in-memory one).

    ``export_each_span`` sends each span as it ends (a step pod: what a crash cuts short stays
    sent); otherwise spans go in batches, sent by ``close``.
    """
    env = os.environ if environ is None else environ
    if exporter is None and not tracing.endpoint_set(env):
        return tracing.NO_TRACING
    missing = missing_extra(env)
    if missing is not None:
        # Asked for, but not installed: the process goes on untraced, and says so once.
        if str(missing) not in _told:
            _told.add(str(missing))
            log.warning("%s", unavailable(missing))
        return tracing.NO_TRACING
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()  # reads the OTEL_EXPORTER_OTLP_* variables itself
    name = env.get("OTEL_SERVICE_NAME") or service
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    processor = SimpleSpanProcessor(exporter) if export_each_span else BatchSpanProcessor(exporter)
    provider.add_span_processor(processor)
    arguments = env.get("KEELGATE_TRACE_TOOL_ARGUMENTS", "").strip().lower() == "true"
    return OtelTracer(
        provider,
        processor,
        parent=env.get(TRACEPARENT_ENV, ""),
        state=env.get(TRACESTATE_ENV, ""),
        tool_arguments=arguments,
    )


def missing_extra(environ: Mapping[str, str] | None = None) -> MissingExtra | None:
    """The ``tracing`` extra, when the environment asks for traces and this install lacks it
    (None: not asked for, or installed)."""
    env = os.environ if environ is None else environ
    if not tracing.endpoint_set(env):
        return None
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ModuleNotFoundError as error:
        variable = next(v for v in tracing.ENDPOINT_VARIABLES if env.get(v))
        return MissingExtra.of(error, what=f"tracing (asked for by {variable})")
    return None


def unavailable(missing: MissingExtra) -> str:
    """The one line a process whose tracing cannot start says (log, stderr, an Event)."""
    return f"{missing}; going on without tracing"


#: The lines said already: once per process, however many commands or loops ask.
_told: set[str] = set()


@dataclass(frozen=True)
class _Parent:
    """The span a process was handed (its step pod's), and the run's trace it belongs to."""

    trace_id: str
    span_id: str
    run: TraceRef | None


def _parse_parent(traceparent: str, tracestate: str) -> _Parent | None:
    parts = traceparent.strip().split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None
    return _Parent(parts[1], parts[2], TraceRef.handed(traceparent, tracestate))


def _nanos(iso: str, default: int) -> int:
    if not iso:
        return default
    try:
        moment = dt.datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return default
    return int(moment.timestamp() * 1_000_000_000)


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class OtelTracer:
    """Keelgate's spans through an OpenTelemetry tracer provider of its own."""

    enabled = True

    def __init__(
        self,
        provider: TracerProvider,
        processor: SpanProcessor,
        *,
        parent: str = "",
        state: str = "",
        tool_arguments: bool = False,
    ) -> None:
        self.provider = provider
        self.processor = processor
        self.tracer = provider.get_tracer("keelgate")
        self.parent = _parse_parent(parent, state) if parent else None
        self.records_arguments = tool_arguments

    def new_run(self) -> TraceRef:
        if self.parent is not None and self.parent.run is not None:
            return self.parent.run
        return TraceRef.new(started_at=_now_iso())

    def run(self, ref: TraceRef) -> OtelRunTrace:
        # Under the span this process was handed, if it belongs to the run's trace (a step
        # pod's); else right under the run's own span.
        parent = self.parent
        if parent is not None and parent.trace_id == ref.trace_id:
            return OtelRunTrace(self, ref, _context(ref.trace_id, parent.span_id), handed=True)
        return OtelRunTrace(self, ref, _context(ref.trace_id, ref.span_id), handed=False)

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
        """Export a span whose ids were chosen beforehand (a run's own span, a step pod's)
        and whose times are known: it is made now, whole, and sent as any other."""
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanKind, Status, StatusCode

        now = time.time_ns()
        ended = _nanos(end, now)
        span = ReadableSpan(
            name,
            context=_span_context(trace_id, span_id, remote=False),
            parent=None if parent_span_id is None else _span_context(trace_id, parent_span_id),
            resource=self.provider.resource,
            attributes=dict(attributes or {}),
            events=[Event(e.name, dict(e.attributes), _nanos(e.at, ended)) for e in events or []],
            kind=SpanKind.INTERNAL,
            status=Status(StatusCode.ERROR, error) if error else Status(StatusCode.UNSET),
            start_time=min(_nanos(start, ended), ended),
            end_time=ended,
            instrumentation_scope=InstrumentationScope("keelgate"),
        )
        self.processor.on_end(span)

    def close(self) -> None:
        """Send what is still to be sent, and stop."""
        self.provider.shutdown()


class OtelRunTrace:
    def __init__(self, tracer: OtelTracer, ref: TraceRef, parent: Any, *, handed: bool) -> None:
        self._tracer = tracer
        self._ref = ref
        self._parent = parent
        self._handed = handed

    @contextmanager
    def session(self, attributes: Attributes) -> Iterator[tracing.Span]:
        if not self._handed:
            with self.span("keelgate.session", attributes) as span:
                yield span
            return
        # A step pod: the operator sends its span; this process's spans hang right under it.
        from opentelemetry import context as otel_context

        token = otel_context.attach(self._parent)
        try:
            yield tracing.NO_SPAN
        finally:
            otel_context.detach(token)

    @contextmanager
    def span(
        self, name: str, attributes: Attributes | None = None, *, kind: str = "internal"
    ) -> Iterator[tracing.Span]:
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        current = trace.get_current_span().get_span_context()
        # A span of this run under way in this context: nest under it; else under the parent.
        ours = current.is_valid and f"{current.trace_id:032x}" == self._ref.trace_id
        with self._tracer.tracer.start_as_current_span(
            name,
            context=None if ours else self._parent,
            kind=SpanKind.CLIENT if kind == "client" else SpanKind.INTERNAL,
            attributes=dict(attributes or {}),
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            headers: dict[str, str] = {}
            TraceContextTextMapPropagator().inject(headers)
            with tracing.carrying(headers):
                yield _Span(span)

    def end_run(self, name: str, attributes: Attributes, events: list[RunEvent]) -> None:
        self._tracer.record(
            name,
            trace_id=self._ref.trace_id,
            span_id=self._ref.span_id,
            parent_span_id=None,
            start=self._ref.started_at,
            attributes=attributes,
            events=events,
            error="" if attributes.get("keelgate.stop_reason") == "goal_met" else "the run failed",
        )


class _Span:
    def __init__(self, span: OtelSpan) -> None:
        self._span = span

    def set(self, key: str, value: AttributeValue) -> None:
        self._span.set_attribute(key, value)

    def event(self, name: str, attributes: Attributes | None = None) -> None:
        self._span.add_event(name, dict(attributes or {}))

    def fail(self, description: str) -> None:
        from opentelemetry.trace import Status, StatusCode

        self._span.set_status(Status(StatusCode.ERROR, description))


def _span_context(trace_id: str, span_id: str, *, remote: bool = True) -> SpanContext:
    from opentelemetry.trace import SpanContext, TraceFlags

    return SpanContext(
        int(trace_id, 16), int(span_id, 16), is_remote=remote, trace_flags=TraceFlags(1)
    )


def _context(trace_id: str, span_id: str) -> Any:
    from opentelemetry import trace

    return trace.set_span_in_context(trace.NonRecordingSpan(_span_context(trace_id, span_id)))
