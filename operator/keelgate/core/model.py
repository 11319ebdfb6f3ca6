"""What the loop asks a model and what it accepts back, independent of any provider.

Provider adapters translate these to and from their wire formats. The loop trusts nothing in a
reply beyond its shape: a reply that names an unknown tool becomes a tool error the model sees,
and a reply the loop cannot read stops the run as ``failed``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

from keelgate.core.json_codec import OMIT_NONE, JsonValue
from keelgate.core.types import SideEffect, Usage
from keelgate.errors import ModelError


@dataclass(frozen=True)
class ToolInfo(JsonValue):
    """What the model is told about a tool."""

    name: str
    description: str
    side_effect: SideEffect
    input_schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})


@dataclass(frozen=True)
class ModelRequest(JsonValue):
    """One planning or verifying call.

    ``call`` is the number of planning calls this run made before this one (for a verify call:
    the planning call of the iteration being verified), so deterministic providers such as
    ``scripted`` answer the same after a restart.
    """

    phase: Literal["plan", "verify"]
    goal: str
    iteration: int
    call: int
    history: Sequence[Mapping[str, Any]]
    tools: Sequence[ToolInfo]
    answer: Annotated[str | None, OMIT_NONE] = None  # verify only: the answer under review
    max_output_tokens: Annotated[int | None, OMIT_NONE] = None


@dataclass(frozen=True)
class PlannedCall:
    tool: str
    args: Mapping[str, Any]


@dataclass(frozen=True)
class ModelReply:
    """A plan (``actions`` or ``done``) or a verdict, plus what the call cost."""

    actions: tuple[PlannedCall, ...] = ()
    done: bool = False
    answer: str | None = None
    verdict: Literal["accept", "reject"] = "accept"
    reason: str = ""
    usage: Usage = field(default_factory=Usage)


@runtime_checkable
class Model(Protocol):
    """A model provider. ``name`` is what prices are looked up by."""

    name: str

    def call(self, request: ModelRequest) -> ModelReply: ...


def estimate_input_tokens(request: ModelRequest) -> int:
    """A provider-neutral estimate of a request's input size: about four characters a token.

    Used only to refuse a call whose input alone would cross a budget, so erring a little high is
    the safe side; providers with a tokenizer may do better.
    """
    text = json.dumps(request.to_json(), separators=(",", ":"), default=str)
    return len(text) // 4 + 1


def reply_from_mapping(data: Mapping[str, Any], *, phase: str) -> ModelReply:
    """Read the dict form of a reply (the ``python`` and ``scripted`` providers' shape)."""
    if not isinstance(data, Mapping):
        raise ModelError(f"model reply must be an object, not {type(data).__name__}")
    usage_data = data.get("usage") or {}
    if not isinstance(usage_data, Mapping):
        raise ModelError("model reply usage must be an object")
    usage = Usage(
        input_tokens=int(usage_data.get("inputTokens", 0)),
        output_tokens=int(usage_data.get("outputTokens", 0)),
    )
    if phase == "verify":
        verdict = data.get("verdict", "accept") or "accept"
        if verdict not in ("accept", "reject"):
            raise ModelError(f"verdict must be 'accept' or 'reject', not {verdict!r}")
        return ModelReply(
            verdict="reject" if verdict == "reject" else "accept",
            reason=str(data.get("reason", "") or ""),
            usage=usage,
        )
    raw_actions = data.get("actions") or []
    if not isinstance(raw_actions, list):
        raise ModelError("model reply actions must be a list")
    actions: list[PlannedCall] = []
    for index, raw in enumerate(raw_actions):
        if not isinstance(raw, Mapping) or not isinstance(raw.get("tool"), str):
            raise ModelError(f"model reply actions[{index}] needs a tool name")
        args = raw.get("args") or {}
        if not isinstance(args, Mapping):
            raise ModelError(f"model reply actions[{index}].args must be an object")
        actions.append(PlannedCall(raw["tool"], dict(args)))
    done = bool(data.get("done", False))
    if not actions and not done:
        raise ModelError("model reply has neither actions nor done")
    answer = data.get("answer")
    return ModelReply(
        actions=tuple(actions),
        done=done and not actions,
        answer=None if answer is None else str(answer),
        usage=usage,
    )
