"""The ``anthropic`` provider: the Messages API with tool_use blocks, through the official SDK.

A plan is the model's tool_use blocks (or, with none, its text as the final answer); a verdict is
a forced ``keelgate_verdict`` tool call. Usage (input, cache and output tokens) comes from the
reply into the budgets. Transient failures are retried by ``_retry`` (the SDK's own retries are
off); a refusal is a ModelError with the provider's message on one line. This module must never
log or repeat the API key, and never retry anything but the model call itself.

What every SDK provider shares (the key rule, retries, reading errors, the reply rules) is
``_sdk``'s: this module keeps the wire form and how it reads its SDK's reply.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

import anthropic

from keelgate.adapters.models import _prompt
from keelgate.adapters.models._sdk import SdkModel
from keelgate.core.model import ModelReply, ModelRequest
from keelgate.core.types import Usage

# The Messages API requires an output limit; this one applies only when the manifest sets none.
DEFAULT_MAX_OUTPUT_TOKENS = 4096


class AnthropicModel(SdkModel):
    """A Messages API model. ``name`` is the model id sent on the wire and priced by."""

    provider = "anthropic"
    sdk: ClassVar[ModuleType] = anthropic

    def _connect(self, api_key: str | None, timeout_seconds: float) -> Any:
        return anthropic.Anthropic(
            api_key=api_key,
            base_url=self.base_url,
            max_retries=0,
            timeout=timeout_seconds,
            http_client=self._http_client(),
        )

    # The wire form

    def payload(self, request: ModelRequest) -> dict[str, Any]:
        """The messages.create arguments for a request (also what the estimate measures)."""
        tools = [_tool(t.name, t.description, dict(t.input_schema)) for t in request.tools]
        body: dict[str, Any] = {
            "model": self.name,
            "system": _prompt.SYSTEM,
            "messages": _messages(request),
            "max_tokens": request.max_output_tokens
            or self.max_output_tokens
            or DEFAULT_MAX_OUTPUT_TOKENS,
        }
        if request.phase == "verify":
            tools.append(
                _tool(_prompt.VERDICT_TOOL, _prompt.VERDICT_DESCRIPTION, _prompt.VERDICT_SCHEMA)
            )
            body["tool_choice"] = {"type": "tool", "name": _prompt.VERDICT_TOOL}
        if tools:
            body["tools"] = tools
        return body

    def estimate_input_tokens(self, request: ModelRequest) -> int:
        """The input size of this request as this provider will be sent it (no network)."""
        body = self.payload(request)
        return _prompt.estimate_tokens([body["system"], body["messages"], body.get("tools", [])])

    # The call

    def _create(self, body: dict[str, Any]) -> Any:
        return self._client.messages.create(**body)

    @staticmethod
    def _status_text(error: Any) -> str:
        return str(error.api_message or "") or _body_text(error.body)

    def _reply(self, request: ModelRequest, message: Any, body: dict[str, Any]) -> ModelReply:
        text = " ".join(b.text for b in message.content or [] if getattr(b, "type", "") == "text")
        uses = [b for b in message.content or [] if getattr(b, "type", "") == "tool_use"]
        text = text.strip()
        refused = message.stop_reason == "refusal"
        return self.planned_reply(
            request,
            text=text,
            calls=[(u.name, u.input) for u in uses],
            cut=message.stop_reason == "max_tokens",
            refusal=(text or "no reason given") if refused else None,
            usage=_usage(message),
            limit=body["max_tokens"],
        )


def _tool(name: str, description: str, schema: Any) -> dict[str, Any]:
    return {"name": name, "description": description, "input_schema": schema}


def _messages(request: ModelRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for turn in _prompt.turns(request):
        role: str
        blocks: list[dict[str, Any]]
        if isinstance(turn, _prompt.Text):
            role, blocks = "user", [{"type": "text", "text": turn.text}]
        elif isinstance(turn, _prompt.Calls):
            role = "assistant"
            blocks = [
                {"type": "tool_use", "id": c.id, "name": c.tool, "input": dict(c.args)}
                for c in turn.calls
            ]
        else:
            role = "user"
            blocks = [
                {
                    "type": "tool_result",
                    "tool_use_id": r.id,
                    "content": r.content,
                    "is_error": r.is_error,
                }
                for r in turn.results
            ]
        # Roles must alternate; tool results come first in their user turn, which this keeps.
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return out


def _usage(message: Any) -> Usage:
    usage = message.usage
    cached = (usage.cache_creation_input_tokens or 0) + (usage.cache_read_input_tokens or 0)
    return Usage(
        input_tokens=int(usage.input_tokens or 0) + int(cached),
        output_tokens=int(usage.output_tokens or 0),
    )


def _body_text(body: object) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if body.get("message"):
            return str(body["message"])
        return ""
    return str(body) if body else ""
