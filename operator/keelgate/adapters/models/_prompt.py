"""How a ModelRequest becomes a conversation, for every chat provider alike.

Both the OpenAI and the Anthropic adapters render the same neutral turns, so a run reads the same
to either model: the goal, then each past iteration as the model's own tool calls followed by
their results, then what is asked now. The verify phase asks for a verdict through a forced tool
call (``keelgate_verdict``), which is far sturdier than parsing prose. This module must never
decide anything about a run; it only words the request.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from keelgate.core.model import ModelReply, ModelRequest, reply_from_mapping
from keelgate.core.types import Usage
from keelgate.errors import ModelError

VERDICT_TOOL = "keelgate_verdict"
VERDICT_DESCRIPTION = (
    "Give your verdict on the most recent step: accept if it was right and moves toward the "
    "goal (or, if it ended without tool calls, the goal is met); reject otherwise, with a reason."
)
VERDICT_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["accept", "reject"]},
        "reason": {"type": "string"},
    },
    "required": ["verdict", "reason"],
    "additionalProperties": False,
}

SYSTEM = (
    "You are the planner of an agent run. Work toward the user's goal by calling the tools "
    "provided. Every call you make is recorded and executed once, and you will see its result; "
    "a tool that modifies something must not be called again for the same change unless its "
    "result says it failed. Call several tools in one reply only when they do not depend on "
    "each other. When the goal is met, or cannot be met with these tools, reply without any "
    "tool call and give a short final answer."
)


@dataclass(frozen=True)
class Text:
    """A user turn of plain text."""

    text: str


@dataclass(frozen=True)
class Call:
    id: str
    tool: str
    args: Mapping[str, Any]


@dataclass(frozen=True)
class Calls:
    """An assistant turn: the tool calls the model made in one iteration."""

    calls: tuple[Call, ...]


@dataclass(frozen=True)
class Result:
    id: str
    content: str
    is_error: bool


@dataclass(frozen=True)
class Results:
    """What those calls came to, answering a Calls turn."""

    results: tuple[Result, ...]


Turn = Text | Calls | Results


def call_id(action_id: str) -> str:
    """A tool-call id both providers accept (letters, digits, _ and -) from an action id."""
    return "kg_" + re.sub(r"[^A-Za-z0-9_-]", "_", action_id)


def turns(request: ModelRequest) -> list[Turn]:
    """The conversation for a request: goal, history, then the question of this phase."""
    out: list[Turn] = [Text(f"Goal: {request.goal}")]
    for entry in request.history:
        out.extend(_entry_turns(entry))
    if request.phase == "verify":
        out.append(
            Text(
                f"Verify iteration {request.iteration}: judge the most recent step against the "
                f"goal. Answer only by calling {VERDICT_TOOL}."
            )
        )
    elif request.history:
        out.append(
            Text(
                f"Iteration {request.iteration}: call the next tools, or answer without a tool "
                "call if the goal is met."
            )
        )
    return out


def _entry_turns(entry: Mapping[str, Any]) -> list[Turn]:
    iteration = entry.get("iteration", "?")
    if "verdict" in entry:
        reason = entry.get("reason") or "no reason given"
        return [Text(f"A verifier rejected iteration {iteration}: {reason}. Revise your plan.")]
    actions = entry.get("actions")
    if not isinstance(actions, list):
        return [Text(json.dumps(dict(entry), ensure_ascii=False, default=str))]
    if not actions:
        return [Text(f"Iteration {iteration} ended without tool calls (the goal declared met).")]
    calls: list[Call] = []
    results: list[Result] = []
    for action in actions:
        ident = call_id(str(action.get("id", "")))
        args = action.get("args")
        calls.append(
            Call(ident, str(action.get("tool", "")), args if isinstance(args, dict) else {})
        )
        status = str(action.get("status", ""))
        body: dict[str, Any] = {"status": status}
        if "output" in action:
            body["output"] = action["output"]
        if action.get("error"):
            body["error"] = action["error"]
        results.append(Result(ident, json_text(body), status != "ok"))
    return [Calls(tuple(calls)), Results(tuple(results))]


def json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def estimate_tokens(payload: Any) -> int:
    """Tokens a payload is likely to cost: about 3.5 characters of its JSON a token.

    JSON is denser in tokens than prose (the core's neutral estimate uses 4), and the estimate
    only refuses calls that would cross a budget, so erring a little high is the safe side.
    """
    text = json_text(payload)
    return math.ceil(len(text) / 3.5) + 1


def verdict_from_args(args: Mapping[str, Any], usage: Usage) -> ModelReply:
    reply = reply_from_mapping(dict(args), phase="verify")
    return ModelReply(verdict=reply.verdict, reason=reply.reason, usage=usage)


def verdict_from_text(text: str, usage: Usage) -> ModelReply:
    """A verdict from a model that answered in prose (a server without forced tool choice).

    A JSON object with a ``verdict`` is read as such; anything else means accept, as the contract
    says of a missing verdict, with the text kept as the reason.
    """
    for match in re.finditer(r"\{[^{}]*\}", text):
        try:
            data = json.loads(match.group(0))
        except ValueError:
            continue
        if isinstance(data, dict) and "verdict" in data:
            return verdict_from_args(data, usage)
    return ModelReply(verdict="accept", reason=" ".join(text.split())[:300], usage=usage)


def parse_arguments(raw: str | Mapping[str, Any] | None, *, tool: str) -> dict[str, Any]:
    """A tool call's arguments as an object; anything else is a ModelError (nothing is run)."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ModelError(f"the model called {tool!r} with arguments that are not a JSON object")
    return data
