"""The ``anthropic`` provider: the Messages API with tool_use blocks, through the official SDK.

A plan is the model's tool_use blocks (or, with none, its text as the final answer); a verdict is
a forced ``keelgate_verdict`` tool call. Usage (input, cache and output tokens) comes from the
reply into the budgets. Transient failures are retried by ``_retry`` (the SDK's own retries are
off); a refusal is a ModelError with the provider's message on one line. This module must never
log or repeat the API key, and never retry anything but the model call itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic

from keelgate.adapters.models import _prompt
from keelgate.adapters.models._retry import (
    RetryPolicy,
    Transient,
    call_with_retries,
    one_line,
    retry_after_seconds,
)
from keelgate.core.model import ModelReply, ModelRequest, PlannedCall
from keelgate.core.types import Usage
from keelgate.errors import InputError, ModelError

# The Messages API requires an output limit; this one applies only when the manifest sets none.
DEFAULT_MAX_OUTPUT_TOKENS = 4096


class AnthropicModel:
    """A Messages API model. ``name`` is the model id sent on the wire and priced by."""

    def __init__(
        self,
        name: str,
        *,
        api_key: str | None,
        base_url: str | None = None,
        max_output_tokens: int | None = None,
        timeout_seconds: float = 120.0,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        if not api_key:
            raise InputError(
                "spec.model.apiKeyEnv",
                "no API key: set the environment variable that apiKeyEnv names",
            )
        self.name = name
        self.base_url = base_url or None
        self.max_output_tokens = max_output_tokens
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._secret = api_key
        self._client = anthropic.Anthropic(
            api_key=api_key,
            base_url=self.base_url,
            max_retries=0,
            timeout=timeout_seconds,
        )

    def __repr__(self) -> str:  # never show the key
        return f"AnthropicModel(name={self.name!r}, base_url={self.base_url!r})"

    def close(self) -> None:
        self._client.close()

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

    def call(self, request: ModelRequest) -> ModelReply:
        body = self.payload(request)
        message = call_with_retries(
            lambda: self._client.messages.create(**body),
            self._classify,
            policy=self.retry,
            provider=f"anthropic at {self.base_url}" if self.base_url else "anthropic",
            sleep=self._sleep,
        )
        return _reply(request, message, body)

    def _classify(self, error: Exception) -> Transient | ModelError:
        if isinstance(error, anthropic.APITimeoutError):
            return Transient("the request timed out")
        if isinstance(error, anthropic.APIConnectionError):
            return Transient("could not reach the server")
        if isinstance(error, anthropic.APIStatusError):
            text = error.api_message or _body_text(error.body) or f"HTTP {error.status_code}"
            message = f"{error.status_code} {one_line(text, secrets=(self._secret,))}"
            if error.status_code == 429 or error.status_code >= 500:
                return Transient(message, retry_after_seconds(dict(error.response.headers)))
            return ModelError(f"anthropic: {message}")
        text = str(error) or type(error).__name__
        return ModelError(f"anthropic: {one_line(text, secrets=(self._secret,))}")


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


def _reply(request: ModelRequest, message: Any, body: dict[str, Any]) -> ModelReply:
    usage = _usage(message)
    blocks = list(message.content or [])
    text = " ".join(b.text for b in blocks if getattr(b, "type", "") == "text").strip()
    uses = [b for b in blocks if getattr(b, "type", "") == "tool_use"]
    cut = message.stop_reason == "max_tokens"
    if request.phase == "verify":
        for use in uses:
            if use.name == _prompt.VERDICT_TOOL:
                args = _prompt.parse_arguments(use.input, tool=use.name)
                return _prompt.verdict_from_args(args, usage)
        if cut:
            raise ModelError(_cut_message(body))
        return _prompt.verdict_from_text(text, usage)
    if cut:
        # A reply cut off mid-way may carry half a tool call or half an answer: act on neither.
        raise ModelError(_cut_message(body))
    if message.stop_reason == "refusal" and not uses:
        raise ModelError(f"anthropic: the model refused: {one_line(text or 'no reason given')}")
    actions = tuple(
        PlannedCall(u.name, _prompt.parse_arguments(u.input, tool=u.name)) for u in uses
    )
    if actions:
        return ModelReply(actions=actions, usage=usage)
    return ModelReply(done=True, answer=text, usage=usage)


def _body_text(body: object) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if body.get("message"):
            return str(body["message"])
        return ""
    return str(body) if body else ""


def _cut_message(body: dict[str, Any]) -> str:
    return (
        f"anthropic: the reply was cut off at the output limit ({body['max_tokens']} tokens); "
        "raise maxOutputTokens"
    )
