"""One trace per run, with the GenAI conventions: what a trace backend shows of a run.

Why it exists: a run is driven by many processes (a step pod per iteration, a CLI resume, a
person's settlement); its spans must form one trace with the run's own span at its root, named
and attributed as OpenTelemetry's GenAI conventions say (``invoke_agent``, ``chat``,
``execute_tool``, ``gen_ai.*``), with Keelgate's side-effect classes, keys and outcomes, the
stops and settlements as events, and never a tool's arguments unless a setting asks. These tests
drive the real loop over real SQLite files with the SDK's in-memory exporter (each "process" a
tracer of its own over the same exporter), and a real shop on loopback for the HTTP header.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from crashkit import Journal, Rig, World
from crashkit.rig import sqlite_opener
from fakes.downstream import Shop
from keelgate.adapters import tracing as tracing_adapter
from keelgate.adapters.models.scripted import ScriptedModel
from keelgate.adapters.tools.http import HttpTool
from keelgate.adapters.tracing import configured
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.tracing import NO_TRACING, TraceRef
from keelgate.core.types import SideEffect, StopReason
from keelgate.errors import SimulatedCrash
from keelgate.stores.sqlite import SQLiteStore

SECRET_SKU = "sku-never-on-a-span-7731"
SCRIPT: list[dict[str, Any]] = [
    {
        "actions": [{"tool": "get_inventory", "args": {"sku": SECRET_SKU}}],
        "usage": {"inputTokens": 120, "outputTokens": 20},
    },
    {
        "actions": [{"tool": "place_order", "args": {"sku": SECRET_SKU, "qty": 2}}],
        "usage": {"inputTokens": 150, "outputTokens": 30},
    },
    {"done": True, "answer": "ordered", "usage": {"inputTokens": 90, "outputTokens": 10}},
]
SPEC = LoopSpec("shop", "restock", "restock", budget=Budget(max_iterations=10, tokens=100_000))


class Collector:
    """What a trace backend receives from any number of processes, each with an exporter of its
    own (closing a process's tracer shuts its exporter down, as a process's end does)."""

    def __init__(self) -> None:
        self.exporters: list[InMemorySpanExporter] = []

    def get_finished_spans(self) -> list[ReadableSpan]:
        return [span for e in self.exporters for span in e.get_finished_spans()]


@pytest.fixture
def exporter() -> Collector:
    return Collector()


def tracer_of(collector: Collector, **environ: str) -> Any:
    """The tracer one process would have: its own provider and exporter, sending to the
    collector."""
    own = InMemorySpanExporter()
    collector.exporters.append(own)
    return configured(environ=environ, exporter=own, export_each_span=True)


def by_name(spans: list[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        found.setdefault(span.name, []).append(span)
    return found


def text_of(spans: list[ReadableSpan]) -> str:
    return json.dumps(
        [
            {
                "attributes": dict(s.attributes or {}),
                "events": [(e.name, dict(e.attributes or {})) for e in s.events],
            }
            for s in spans
        ]
    )


def hex_of(span: ReadableSpan) -> tuple[str, str]:
    assert span.context is not None
    return f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"


def parent_of(span: ReadableSpan) -> str:
    return "" if span.parent is None else f"{span.parent.span_id:016x}"


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(Journal(tmp_path / "world.jsonl"), effect="before")


def test_a_run_is_one_trace_of_genai_spans_rooted_at_its_own_span(
    tmp_path: Path, world: World, exporter: Collector
) -> None:
    """Read, order, done, in one process: the run's span (``invoke_agent restock``) is the root;
    under it the session, under that each phase (plan, act, observe/verify), each model call
    (``chat scripted``, a client span with the provider, model and tokens), each tool call
    (``execute_tool``, with its call id, side-effect class, the WRITE's idempotency key, and how
    it came out); all in one trace; no argument value anywhere."""
    stores = Stores.of(SQLiteStore(tmp_path / "kg.db"))
    tracer = tracer_of(exporter)
    try:
        loop = Loop(stores=stores, model=ScriptedModel(SCRIPT), tools=world.tools(), tracer=tracer)
        done = loop.run_or_resume(SPEC)
        assert done.stop.reason is StopReason.GOAL_MET
    finally:
        stores.close()
        tracer.close()
    spans = list(exporter.get_finished_spans())
    named = by_name(spans)
    assert {hex_of(s)[0] for s in spans} == {hex_of(named["invoke_agent restock"][0])[0]}
    (run,) = named["invoke_agent restock"]
    assert run.parent is None
    assert dict(run.attributes or {})["gen_ai.operation.name"] == "invoke_agent"
    assert dict(run.attributes or {})["gen_ai.agent.name"] == "restock"
    assert dict(run.attributes or {})["gen_ai.conversation.id"] == "shop/restock"
    assert dict(run.attributes or {})["gen_ai.usage.input_tokens"] == 360
    assert dict(run.attributes or {})["keelgate.stop_reason"] == "goal_met"
    assert dict(run.attributes or {})["keelgate.budget.tokens.left"] == 100_000 - 420
    (session,) = named["keelgate.session"]
    assert parent_of(session) == hex_of(run)[1]
    phases = [s for s in spans if s.name in ("plan", "act", "observe", "verify")]
    assert phases and all(parent_of(p) == hex_of(session)[1] for p in phases)
    chats = named["chat scripted"]
    assert len(chats) == 6  # three plans, three verdicts
    first = dict(chats[0].attributes or {})
    assert first["gen_ai.operation.name"] == "chat"
    assert first["gen_ai.provider.name"] == "keelgate.scripted"
    assert first["gen_ai.request.model"] == "scripted"
    assert (first["gen_ai.usage.input_tokens"], first["gen_ai.usage.output_tokens"]) == (120, 20)
    assert chats[0].kind.name == "CLIENT"
    (order,) = named["execute_tool place_order"]
    attributes = dict(order.attributes or {})
    assert attributes["gen_ai.tool.name"] == "place_order"
    assert attributes["gen_ai.tool.call.id"] == "2:0"
    assert attributes["keelgate.side_effect"] == "WRITE"
    assert str(attributes["keelgate.idempotency_key"]).startswith("kg-")
    assert attributes["keelgate.outcome"] == "ok"
    (read,) = named["execute_tool get_inventory"]
    assert "keelgate.idempotency_key" not in dict(read.attributes or {})
    assert SECRET_SKU not in text_of(spans)


def test_a_crash_a_settlement_and_a_resume_stay_in_the_runs_one_trace(
    tmp_path: Path, world: World, exporter: Collector
) -> None:
    """A process dies right after its order went out; a second finds the outcome unknown and
    stops; alice settles it; a third finishes. Three processes, one trace: the stop is an event
    of the session that stopped, the settlement a span of its own with alice and the verdict,
    the unknown call's span is marked failed, and the run's span carries the stop and the
    settlement as events."""
    rig = Rig(sqlite_opener(tmp_path / "kg.db"), world, SCRIPT)
    first = tracer_of(exporter)
    rig.loop.tracer = first
    death = rig.attempt(SPEC, ("after_gateway_call", 2))
    assert isinstance(death, SimulatedCrash)
    first.close()
    second = tracer_of(exporter)
    rig.loop.tracer = second
    stopped = rig.loop.run_or_resume(SPEC)
    assert stopped.stop.reason is StopReason.OUTCOME_UNKNOWN
    rig.loop.reconcile("shop", "restock", "2:0", executed=True, by="alice")
    second.close()
    third = tracer_of(exporter)
    rig.loop.tracer = third
    assert rig.loop.run_or_resume(SPEC).stop.reason is StopReason.GOAL_MET
    third.close()
    rig.die()
    spans = list(exporter.get_finished_spans())
    named = by_name(spans)
    assert "invoke_agent restock" in named, " | ".join(sorted(named))
    (run,) = named["invoke_agent restock"]
    trace_id, run_span = hex_of(run)
    assert {hex_of(s)[0] for s in spans} == {trace_id}
    sessions = named["keelgate.session"]
    assert len(sessions) >= 2 and all(parent_of(s) == run_span for s in sessions)
    stops = [e for s in sessions for e in s.events if e.name == "keelgate.stop"]
    assert [dict(e.attributes or {})["keelgate.stop_reason"] for e in stops] == [
        "outcome_unknown",
        "goal_met",
    ]
    (settle,) = named["settle place_order"]
    assert parent_of(settle) == run_span
    (event,) = settle.events
    assert (event.name, dict(event.attributes or {})["keelgate.by"]) == (
        "keelgate.settlement",
        "alice",
    )
    assert dict(event.attributes or {})["keelgate.verdict"] == "executed"
    unknown = [
        s
        for s in named["execute_tool place_order"]
        if dict(s.attributes or {}).get("keelgate.outcome") == "unknown"
    ]
    assert unknown and unknown[0].status.status_code.name == "ERROR"
    on_run = [(e.name, dict(e.attributes or {})) for e in run.events]
    assert ("keelgate.stop", "outcome_unknown") in [
        (name, attrs.get("keelgate.reason")) for name, attrs in on_run
    ]
    assert any(
        name == "keelgate.settlement" and attrs.get("keelgate.by") == "alice"
        for name, attrs in on_run
    )
    assert SECRET_SKU not in text_of(spans)


def test_a_step_handed_its_pods_span_puts_its_spans_under_it_in_the_runs_trace(
    tmp_path: Path, world: World, exporter: Collector
) -> None:
    """The operator hands a step pod its span (TRACEPARENT) and the run's own span
    (TRACESTATE): the step's phases hang right under the pod's span (the pod's span is the
    session), in the run's trace, and the run keeps that trace in its checkpoint for every
    later process."""
    ref = TraceRef.new(started_at="2026-12-04T10:00:00Z")
    pod_span = "a1b2c3d4e5f60718"
    tracer = tracer_of(
        exporter,
        TRACEPARENT=f"00-{ref.trace_id}-{pod_span}-01",
        TRACESTATE=ref.tracestate,
    )
    stores = Stores.of(SQLiteStore(tmp_path / "kg.db"))
    try:
        loop = Loop(stores=stores, model=ScriptedModel(SCRIPT), tools=world.tools(), tracer=tracer)
        loop.run_or_resume(SPEC, one_iteration=True)
        assert loop.state("shop", "restock").trace == ref
    finally:
        stores.close()
        tracer.close()
    named = by_name(list(exporter.get_finished_spans()))
    # The pod's span is the session (the operator sends it): no span is left without its parent
    # if the step crashes.
    assert "keelgate.session" not in named
    phases = [s for s in named["plan"] + named["act"] + named.get("verify", [])]
    assert phases and all(parent_of(p) == pod_span for p in phases)
    assert {hex_of(p)[0] for p in phases} == {ref.trace_id}


def test_an_http_tool_call_carries_the_tools_span_as_its_traceparent(
    tmp_path: Path, exporter: Collector
) -> None:
    """The shop receives a W3C ``traceparent`` naming the run's trace and the very
    ``execute_tool`` span of the call, so its own spans join the run's trace."""
    shop = Shop().start()
    tracer = tracer_of(exporter)
    stores = Stores.of(SQLiteStore(tmp_path / "kg.db"))
    try:
        order = HttpTool(
            "place_order", url=f"{shop.url}/orders", method="POST", side_effect=SideEffect.WRITE
        )
        script = [{"actions": [{"tool": "place_order", "args": {"sku": "A1"}}]}, {"done": True}]
        loop = Loop(stores=stores, model=ScriptedModel(script), tools=[order], tracer=tracer)
        loop.run_or_resume(LoopSpec("shop", "http", "order"))
    finally:
        stores.close()
        tracer.close()
        shop.stop()
    (sent,) = shop.order_requests()
    version, trace_id, span_id, flags = sent.headers["traceparent"].split("-")
    (call,) = by_name(list(exporter.get_finished_spans()))["execute_tool place_order"]
    assert (trace_id, span_id) == hex_of(call) and (version, flags) == ("00", "01")


def test_tool_arguments_go_on_spans_only_when_a_setting_asks(
    tmp_path: Path, world: World, exporter: Collector
) -> None:
    """With KEELGATE_TRACE_TOOL_ARGUMENTS=true a tool call's span carries its arguments
    (``gen_ai.tool.call.arguments``); the default run above shows that none do otherwise."""
    tracer = tracer_of(exporter, KEELGATE_TRACE_TOOL_ARGUMENTS="true")
    stores = Stores.of(SQLiteStore(tmp_path / "kg.db"))
    try:
        loop = Loop(stores=stores, model=ScriptedModel(SCRIPT), tools=world.tools(), tracer=tracer)
        loop.run_or_resume(SPEC)
    finally:
        stores.close()
        tracer.close()
    (order,) = by_name(list(exporter.get_finished_spans()))["execute_tool place_order"]
    arguments = json.loads(str(dict(order.attributes or {})["gen_ai.tool.call.arguments"]))
    assert arguments == {"qty": 2, "sku": SECRET_SKU}


def test_without_an_endpoint_nothing_is_traced_and_opentelemetry_is_never_imported() -> None:
    """No OTEL_EXPORTER_OTLP_ENDPOINT: the tracer is the core's no-op one, and a step's start
    does not import OpenTelemetry at all (it costs a step pod's start about 0.1 s)."""
    assert configured(environ={}) is NO_TRACING
    assert (
        configured(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"})
        is NO_TRACING
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    probe = (
        "import sys, keelgate.adapters.tracing as t; t.configured(); "
        "print(any(m.startswith('opentelemetry') for m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip() == "False"


def test_an_endpoint_without_the_tracing_extra_is_untraced_and_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set and OpenTelemetry not importable (as without the
    tracing extra): every tracer asked for is the no-op one, and the process says once, as a
    warning naming the variable and the extra to install, however many times it asks.
    (tests/test_image.py runs the base install itself; e2e/tests/test_e2e_tracing.py the
    operator.)"""
    for name in [n for n in sys.modules if n.split(".")[0] == "opentelemetry"]:
        monkeypatch.setitem(sys.modules, name, None)  # what an absent package looks like
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.setattr(tracing_adapter, "_told", set())
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9"}
    with caplog.at_level("WARNING", logger="keelgate.tracing"):
        tracers = [configured(environ=env), configured(environ=env, export_each_span=True)]
    assert tracers == [NO_TRACING, NO_TRACING]
    said = [r.getMessage() for r in caplog.records if r.name == "keelgate.tracing"]
    assert said == [
        "tracing (asked for by OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) needs the tracing extra: "
        "pip install 'keelgate[tracing]' (opentelemetry is not installed); going on without "
        "tracing"
    ]
    assert tracing_adapter.missing_extra({}) is None  # not asked for: nothing to say
