"""The admission policies' list of what an AgentRun does, held to the AgentRun's own fields.

The policies on a run's key Secret and step ServiceAccount ask again, on an update that keeps
the reference, when the update changes what the run does: every spec field but the few that
only say how much or when (budget, pricing, suspend, schedule, the ticks' history limits). The
CEL lists the fields it compares one by one (CEL cannot take fields out of an object), so a
field added to the spec later would silently be free to change under someone else's
ServiceAccount. This test fails until such a field is put on one side or the other. The
policies themselves are tried on the real API server in e2e/tests/test_e2e_access.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from keelgate.manifest.agentrun import AgentRunSpec

ROOT = Path(__file__).resolve().parents[1]
#: Spec fields an update may change without being asked again: how much and when, not what.
FREE = {
    "budget",
    "pricing",
    "suspend",
    "schedule",
    "successfulTicksHistoryLimit",
    "failedTicksHistoryLimit",
}


def _compared(expression: str) -> set[str]:
    """The spec fields a sameWork expression compares, old with new."""
    pairs = re.findall(r"object\.spec\.\?(\w+) == oldObject\.spec\.\?(\w+)", expression)
    assert all(new == old for new, old in pairs), pairs
    return {new for new, _ in pairs}


def _spec_fields() -> set[str]:
    return {field.alias or name for name, field in AgentRunSpec.model_fields.items()}


def test_an_update_is_asked_again_when_it_changes_any_field_but_how_much_and_when() -> None:
    """Every AgentRun spec field is either compared by the policies (a change is asked again)
    or among the few that only say how much or when; deploy/admission.yaml's two policies and
    the chart's helper compare the same fields."""
    spec = _spec_fields()
    assert spec > FREE
    policies = [
        doc
        for doc in yaml.safe_load_all((ROOT / "deploy" / "admission.yaml").read_text())
        if doc and doc["kind"] == "ValidatingAdmissionPolicy"
    ]
    same_work = {
        doc["metadata"]["name"]: v["expression"]
        for doc in policies
        for v in doc["spec"].get("variables", [])
        if v["name"] == "sameWork"
    }
    assert set(same_work) == {"keelgate-secret-references", "keelgate-step-service-account"}
    helper = (ROOT / "charts" / "keelgate" / "templates" / "_helpers.tpl").read_text()
    chart = helper.split('{{- define "keelgate.sameWork" -}}', 1)[1].split("{{- end -}}", 1)[0]
    for expression in [*same_work.values(), chart]:
        assert expression.split()[:3] == ["oldObject", "!=", "null"]  # a create is asked
        assert _compared(expression) == spec - FREE
