"""One trace per AgentRun on the control plane, read back from a real collector (Jaeger).

The operator (a pod, installed by the chart with `tracing.otlpEndpoint` set) and every step pod
send their spans over OTLP/HTTP to the session's Jaeger; these tests read what Jaeger made of
them through its query API, as a person reading the trace would. They must never depend on how
many spans a model call or a phase produces beyond what the run itself did.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from keelgate.kube.controller.traces import run_trace

from keelgate_e2e import runs, traceview
from keelgate_e2e.jaeger import Jaeger
from keelgate_e2e.keelgate import OperatorPod
from keelgate_e2e.kube import Kube
from keelgate_e2e.runs import agentrun, apply, look, order, wait_phase
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl, keelgate_venv, wait_for

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]


def _tags(span: JSON) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span.get("tags", [])}


def _parent(span: JSON) -> str:
    refs = [r for r in span.get("references", []) if r.get("refType") == "CHILD_OF"]
    return str(refs[0]["spanID"]) if refs else ""


def _service(spans_of: JSON, span: JSON) -> str:
    return str(spans_of["processes"][span["processID"]]["serviceName"])


def test_a_run_with_a_crash_and_a_settlement_is_one_trace_in_the_collector(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
    jaeger: Jaeger,
) -> None:
    """Read, then order (the step pod dies right after the shop took the order), alice settles
    the Reconciliation, the run succeeds. In Jaeger it is one trace: the run's span
    (``invoke_agent``) at the root with the stop and alice's settlement as events; one span per
    step pod (from the operator), the crashed one failed; each step's phases, model calls
    (``chat``) and tool calls (``execute_tool``, the order with its idempotency key) under its
    pod's span, even the crashed pod's; and the shop got the order's span as its traceparent.
    No argument value is on any span."""
    run = agentrun(
        "traced",
        shop,
        [[look("T1"), order("T1", 7)]],  # the order passes the window second, after the read
        annotations={"keelgate.dev/failpoints": "after_gateway_call@2"},
        # Every step pod kept (three by default): each pod's span is counted against them.
        extra={"step": {"keepFinishedPods": 20}},
    )
    apply(kubectl, run)
    wait_for(lambda: runs.reconciliations(admin, tenant), timeout=120, what="the Reconciliation")
    (rec,) = runs.reconciliations(admin, tenant)
    patch = {"spec": {"executed": True, "by": "alice", "note": "in the book"}}
    alice(
        "patch", "reconciliation", rec["metadata"]["name"], "--type=merge", "-p", json.dumps(patch)
    )
    done = wait_phase(admin, tenant, "traced", "Succeeded", timeout=180)
    ref = run_trace(done, None)

    pods = admin.get(
        f"/api/v1/namespaces/{tenant}/pods", {"labelSelector": "keelgate.dev/run=traced"}
    )["items"]

    def complete(spans: list[JSON]) -> bool:
        """Every pod's span in (the operator sends in batches), the run's, the settlement's."""
        names = {s["operationName"] for s in spans}
        steps = [s for s in spans if s["operationName"].startswith("step ")]
        return (
            "invoke_agent traced" in names
            and "settle place_order" in names
            and len(steps) == len(pods)
        )

    jaeger.wait_for(ref.trace_id, complete, timeout=90)
    # Spans and the processes they name, from one answer (process ids are per answer).
    whole = jaeger.answer(ref.trace_id)["data"][0]
    spans = whole["spans"]
    by_id = {s["spanID"]: s for s in spans}
    (root,) = [s for s in spans if s["operationName"] == "invoke_agent traced"]
    assert root["spanID"] == ref.span_id and _parent(root) == ""
    tags = _tags(root)
    assert tags["gen_ai.operation.name"] == "invoke_agent"
    assert tags["gen_ai.conversation.id"] == f"{tenant}/traced"
    assert tags["keelgate.stop_reason"] == "goal_met"
    logs = [{f["key"]: f["value"] for f in log["fields"]} for log in root.get("logs", [])]
    assert any(
        log.get("event") == "keelgate.stop" and log.get("keelgate.reason") == "outcome_unknown"
        for log in logs
    )
    assert any(
        log.get("event") == "keelgate.settlement" and log.get("keelgate.by") == "alice"
        for log in logs
    )
    steps = [s for s in spans if s["operationName"].startswith("step ")]
    assert all(_parent(s) == ref.span_id for s in steps), [
        (s["operationName"], s.get("references"), ref.span_id) for s in steps
    ]
    assert all(_service(whole, s) == "keelgate-operator" for s in steps)
    crashed = [s for s in steps if _tags(s).get("otel.status_code") == "ERROR"]
    assert len(crashed) == 1 and "137" in _tags(crashed[0])["keelgate.step.end"]
    assert crashed[0]["operationName"] == "step 1 attempt 1"
    # Each pod's span is its session: its phases hang right under it, sent by the step.
    phases = [s for s in spans if s["operationName"] in ("plan", "act", "observe", "verify")]
    assert phases and all(_parent(s) in {p["spanID"] for p in steps} for s in phases)
    assert all(_service(whole, s) == "keelgate-step" for s in phases)
    orders = [s for s in spans if s["operationName"] == "execute_tool place_order"]
    assert orders
    first = orders[0]
    assert _tags(first)["keelgate.side_effect"] == "WRITE"
    assert str(_tags(first)["keelgate.idempotency_key"]).startswith("kg-")
    chats = [s for s in spans if s["operationName"].startswith("chat ")]
    assert chats and all(_tags(c)["gen_ai.operation.name"] == "chat" for c in chats)
    settles = [s for s in spans if s["operationName"] == "settle place_order"]
    assert settles and _parent(settles[0]) == ref.span_id
    # Every span hangs in the one tree under the run's span, but what the crash cut short: a
    # phase still open when the pod died was never sent, so the spans it had ended (during
    # the crashed pod's life) lack their parent.
    (dead,) = crashed
    for span in spans:
        walked, node = 0, span
        while _parent(node) in by_id and walked < 20:
            node = by_id[_parent(node)]
            walked += 1
        if node["spanID"] != ref.span_id:
            assert dead["startTime"] <= node["startTime"] <= dead["startTime"] + dead["duration"]
            assert _service(whole, node) == "keelgate-step", node["operationName"]
    # The shop's order request carried a span of the run's trace (the order call's own, in the
    # pod that died before it could send that span).
    (sent,) = shop.shop.orders
    _, trace_id, span_id, _ = sent["traceparent"].split("-")
    assert trace_id == ref.trace_id and span_id not in {s["spanID"] for s in steps}
    assert "T1" not in json.dumps([s.get("tags") for s in spans])
    # Kept beside the cluster's logs; KEELGATE_SCREENSHOTS=docs/images draws it for the docs.
    answer = jaeger.answer(ref.trace_id)
    (operator.cluster.run_dir / "trace-traced.json").write_text(json.dumps(answer))
    shots = os.environ.get("KEELGATE_SCREENSHOTS")
    if shots:
        title = "One AgentRun's trace: a crash right after the order, alice's settlement"
        document = traceview.page(answer["data"][0], title=title)
        traceview.photograph(document, Path(shots) / "trace.png", height=80 + 30 * len(spans))


def test_an_operator_without_the_tracing_extra_starts_untraced_and_says_so(
    operator_process: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
    tmp_path: Path,
) -> None:
    """The chart with `tracing.otlpEndpoint` set (the session's collector), its operator run
    from an install without the tracing extra (the operator and postgres extras: a slim image,
    or `make up`'s venv as it was): the pod starts and answers /healthz (it crash-looped on
    `No module named 'opentelemetry'`), its log says once that tracing was asked for and what
    to install, a Warning Event `TracingUnavailable` on the pod itself says the same, and a run
    goes to its end untraced: its step pods get no trace settings and the shop's order no
    traceparent."""
    keelgate = keelgate_venv("operator,postgres", tmp_path) / "bin" / "keelgate"
    try:
        operator_process.install(f"operator.command[0]={keelgate}")
        (pod,) = operator_process.pods()
        assert pod["spec"]["containers"][0]["command"] == [str(keelgate)]
        told = [
            line for line in operator_process.logs().splitlines() if "keelgate[tracing]" in line
        ]
        assert len(told) == 1, told
        assert (
            "tracing (asked for by OTEL_EXPORTER_OTLP_ENDPOINT) needs the tracing extra" in told[0]
        )
        assert "going on without tracing" in told[0] and "Traceback" not in told[0]
        events = admin.get(f"/api/v1/namespaces/{operator_process.namespace}/events")["items"]
        (event,) = [e for e in events if e["reason"] == "TracingUnavailable"]
        assert event["type"] == "Warning"
        assert event["involvedObject"]["name"] == pod["metadata"]["name"]
        assert event["involvedObject"]["uid"] == pod["metadata"]["uid"]  # describe shows it
        assert "pip install 'keelgate[tracing]'" in event["message"]

        apply(kubectl, agentrun("untraced", shop, [[look("U1"), order("U1", 2)]]))
        wait_phase(admin, tenant, "untraced", "Succeeded", timeout=180)
        (sent,) = shop.shop.orders
        assert "traceparent" not in sent
        step_pods = admin.get(
            f"/api/v1/namespaces/{tenant}/pods", {"labelSelector": "keelgate.dev/run=untraced"}
        )["items"]
        assert step_pods
        names = {e["name"] for p in step_pods for c in p["spec"]["containers"] for e in c["env"]}
        assert not {n for n in names if n.startswith(("OTEL_", "TRACE"))}, names
    finally:
        operator_process.install()  # the session's operator, tracing again
