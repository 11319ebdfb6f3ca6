"""What the loop's spans say: OpenTelemetry's GenAI conventions, and Keelgate's own attributes.

Why it exists: the names and attributes of a run's spans are a contract with whoever reads the
traces (Jaeger, Grafana, an LLM observability tool), so they are written once, here, following
the GenAI semantic conventions (latest experimental: ``invoke_agent``, ``chat``,
``execute_tool``, ``gen_ai.*``) with Keelgate's own under ``keelgate.``: the side-effect class,
the idempotency key, how a call came out, budgets used and left. This module must never put a
tool's arguments, a model's messages or a secret into an attribute, and never import
OpenTelemetry (``keelgate.core.tracing`` says why).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from keelgate.core.audit import AuditEvent
from keelgate.core.state import RunState
from keelgate.core.tracing import AttributeValue, RunEvent
from keelgate.core.types import Action, ActionResult, ResultStatus, SideEffect, Usage

#: ``gen_ai.provider.name`` of a model that names no provider of the conventions' list.
OWN_PROVIDER = "keelgate"

# The audit events of a run shown on its span, by the event name they take there.
_RUN_EVENTS = {
    "loop.stopped": "keelgate.stop",
    "loop.resumed": "keelgate.resume",
    "loop.reconciled": "keelgate.settlement",
    "loop.approved": "keelgate.approval",
    "loop.denied": "keelgate.approval",
    "loop.late_result": "keelgate.late_result",
}
# What of each event's data is shown (never arguments: the chain holds none anyway).
_EVENT_FIELDS = (
    "reason",
    "resumable",
    "from",
    "action",
    "tool",
    "verdict",
    "source",
    "status",
    "recorded",
)


def provider_of(model: Any) -> str:
    """The model's provider as the GenAI conventions name it (``openai``, ``anthropic``), or
    ``keelgate`` for Keelgate's own (scripted, a Python function)."""
    return str(getattr(model, "provider", "") or OWN_PROVIDER)


def chat_attributes(model: Any, phase: str, iteration: int) -> dict[str, AttributeValue]:
    name = str(getattr(model, "name", "") or "")
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider_of(model),
        "gen_ai.request.model": name,
        "keelgate.phase": phase,
        "keelgate.iteration": iteration,
    }


def usage_attributes(usage: Usage) -> dict[str, AttributeValue]:
    return {
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
    }


def tool_attributes(action: Action, side_effect: SideEffect | None) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": action.tool,
        "gen_ai.tool.call.id": action.id,
        "gen_ai.tool.type": "function",
    }
    if side_effect is not None:
        attributes["keelgate.side_effect"] = side_effect.value
        if side_effect is not SideEffect.READ:
            attributes["keelgate.idempotency_key"] = action.key
    return attributes


def outcome_of(result: ActionResult) -> str:
    """How a call came out, in one word: ok, replayed, refused, error, denied, abandoned."""
    if result.replayed:
        return "replayed"
    if result.status is ResultStatus.OK:
        return "ok"
    return result.status.value


def run_attributes(state: RunState, model: Any) -> dict[str, AttributeValue]:
    """The run's own span: the agent, its conversation, its end, and its budgets used and left."""
    usage = state.usage
    budget = state.spec.budget
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": state.run,
        "gen_ai.conversation.id": f"{state.tenant}/{state.run}",
        "gen_ai.provider.name": provider_of(model),
        "gen_ai.request.model": str(getattr(model, "name", "") or ""),
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
        "keelgate.tenant": state.tenant,
        "keelgate.run": state.run,
        "keelgate.iterations": state.iteration,
        "keelgate.budget.tokens.used": usage.tokens,
        "keelgate.budget.dollars.used": str(usage.dollars),
        "keelgate.budget.active_seconds.used": round(usage.active_seconds, 3),
    }
    if state.stop is not None:
        attributes["keelgate.stop_reason"] = state.stop.reason.value
    limits = {
        "tokens": (budget.tokens, usage.tokens),
        "iterations": (budget.max_iterations, state.iteration),
        "active_seconds": (budget.timeout_seconds, usage.active_seconds),
    }
    for name, (limit, used) in limits.items():
        if limit is not None:
            attributes[f"keelgate.budget.{name}.left"] = max(0, round(limit - used, 3))
    if budget.dollars is not None:
        attributes["keelgate.budget.dollars.left"] = str(max(budget.dollars - usage.dollars, 0))
    return attributes


def run_events(events: Iterable[AuditEvent]) -> list[RunEvent]:
    """The stops, resumes, settlements, approvals and late results of a run, from its audit
    chain, as events of its span (who decided goes with them; never an argument)."""
    shown: list[RunEvent] = []
    for event in events:
        name = _RUN_EVENTS.get(event.type)
        if name is None:
            continue
        attributes: dict[str, AttributeValue] = {
            f"keelgate.{key}": value
            for key in _EVENT_FIELDS
            if isinstance(value := event.data.get(key), str | bool | int | float)
        }
        if event.actor != "keelgate":
            attributes["keelgate.by"] = event.actor
        shown.append(RunEvent(name, event.at, attributes))
    return shown
