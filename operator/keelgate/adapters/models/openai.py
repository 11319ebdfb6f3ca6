"""The ``openai`` provider: chat completions with native tool calling, through the official SDK.

``base_url`` points it at any OpenAI-compatible server (vLLM, Ollama, LiteLLM). A plan is the
model's tool calls (or, with none, a final answer); a verdict is a forced ``keelgate_verdict``
tool call. Usage comes from the reply, so budgets count what the provider billed. Transient
failures are retried by ``_retry`` (the SDK's own retries are off); a refusal is a ModelError with
the provider's message on one line. This module must never log or repeat the API key, and never
retry anything but the model call itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

import openai

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

log = logging.getLogger("keelgate.models.openai")

MaxTokensField = Literal["max_completion_tokens", "max_tokens"]
# Local OpenAI-compatible servers ignore the key but the SDK insists on one.
_NO_KEY = "unused"


class OpenAIModel:
    """A chat-completions model. ``name`` is the model id sent on the wire and priced by."""

    def __init__(
        self,
        name: str,
        *,
        api_key: str | None,
        base_url: str | None = None,
        max_output_tokens: int | None = None,
        max_tokens_field: MaxTokensField | None = None,
        timeout_seconds: float = 120.0,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        if not api_key and not base_url:
            raise InputError(
                "spec.model.apiKeyEnv",
                "no API key: set the environment variable that apiKeyEnv names",
            )
        self.name = name
        self.base_url = base_url or None
        self.max_output_tokens = max_output_tokens
        # OpenAI's own API wants max_completion_tokens (reasoning models refuse max_tokens);
        # most compatible servers (Ollama, llama.cpp, older vLLM) only read max_tokens.
        self.max_tokens_field: MaxTokensField = max_tokens_field or (
            "max_tokens" if self.base_url else "max_completion_tokens"
        )
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._secret = api_key or ""
        self._client = openai.OpenAI(
            api_key=api_key or _NO_KEY,
            base_url=self.base_url,
            max_retries=0,
            timeout=timeout_seconds,
        )

    def __repr__(self) -> str:  # never show the key
        return f"OpenAIModel(name={self.name!r}, base_url={self.base_url!r})"

    def close(self) -> None:
        self._client.close()

    # The wire form

    def payload(self, request: ModelRequest) -> dict[str, Any]:
        """The chat.completions arguments for a request (also what the estimate measures)."""
        tools = [_function(t.name, t.description, dict(t.input_schema)) for t in request.tools]
        body: dict[str, Any] = {
            "model": self.name,
            "messages": [{"role": "system", "content": _prompt.SYSTEM}, *_messages(request)],
        }
        if request.phase == "verify":
            tools.append(
                _function(_prompt.VERDICT_TOOL, _prompt.VERDICT_DESCRIPTION, _prompt.VERDICT_SCHEMA)
            )
            body["tool_choice"] = {"type": "function", "function": {"name": _prompt.VERDICT_TOOL}}
        if tools:
            body["tools"] = tools
        limit = request.max_output_tokens or self.max_output_tokens
        if limit is not None:
            body[self.max_tokens_field] = limit
        return body

    def estimate_input_tokens(self, request: ModelRequest) -> int:
        """The input size of this request as this provider will be sent it (no network)."""
        body = self.payload(request)
        return _prompt.estimate_tokens([body["messages"], body.get("tools", [])])

    # The call

    def call(self, request: ModelRequest) -> ModelReply:
        body = self.payload(request)
        completion = call_with_retries(
            lambda: self._client.chat.completions.create(**body),
            self._classify,
            policy=self.retry,
            provider=f"openai at {self.base_url}" if self.base_url else "openai",
            sleep=self._sleep,
        )
        return self._reply(request, completion, body)

    def _classify(self, error: Exception) -> Transient | ModelError:
        if isinstance(error, openai.APITimeoutError):
            return Transient("the request timed out")
        if isinstance(error, openai.APIConnectionError):
            return Transient("could not reach the server")
        if isinstance(error, openai.APIStatusError):
            message = _status_message(error, self._secret)
            if error.status_code == 429 or error.status_code >= 500:
                return Transient(message, retry_after_seconds(dict(error.response.headers)))
            return ModelError(f"openai: {message}")
        return ModelError(f"openai: {one_line(_describe(error), secrets=(self._secret,))}")

    def _reply(self, request: ModelRequest, completion: Any, body: dict[str, Any]) -> ModelReply:
        if not getattr(completion, "choices", None):
            raise ModelError("openai: the reply has no choices")
        choice = completion.choices[0]
        message = choice.message
        text = (message.content or "").strip()
        usage = _usage(completion, body, text)
        calls = [c for c in (message.tool_calls or []) if getattr(c, "type", "") == "function"]
        cut = choice.finish_reason == "length"
        if request.phase == "verify":
            for call in calls:
                if call.function.name == _prompt.VERDICT_TOOL:
                    args = _prompt.parse_arguments(call.function.arguments, tool=call.function.name)
                    return _prompt.verdict_from_args(args, usage)
            if cut:
                raise ModelError(_cut_message(body))
            return _prompt.verdict_from_text(text, usage)
        if cut:
            # A reply cut off mid-way may carry half a tool call or half an answer: act on neither.
            raise ModelError(_cut_message(body))
        if not calls and message.refusal:
            raise ModelError(f"openai: the model refused: {one_line(message.refusal)}")
        actions = tuple(
            PlannedCall(
                c.function.name,
                _prompt.parse_arguments(c.function.arguments, tool=c.function.name),
            )
            for c in calls
        )
        if actions:
            return ModelReply(actions=actions, usage=usage)
        return ModelReply(done=True, answer=text, usage=usage)


def _function(name: str, description: str, schema: Any) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": schema},
    }


def _messages(request: ModelRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for turn in _prompt.turns(request):
        if isinstance(turn, _prompt.Text):
            out.append({"role": "user", "content": turn.text})
        elif isinstance(turn, _prompt.Calls):
            out.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {
                                "name": c.tool,
                                "arguments": _prompt.json_text(c.args),
                            },
                        }
                        for c in turn.calls
                    ],
                }
            )
        else:
            out.extend(
                {"role": "tool", "tool_call_id": r.id, "content": r.content} for r in turn.results
            )
    return out


def _usage(completion: Any, body: dict[str, Any], text: str) -> Usage:
    usage = getattr(completion, "usage", None)
    if usage is not None and usage.prompt_tokens is not None:
        return Usage(
            input_tokens=int(usage.prompt_tokens or 0),
            output_tokens=int(usage.completion_tokens or 0),
        )
    # Some compatible servers omit usage. Counting nothing would let a run spend without limit,
    # so charge the estimate instead, and say so.
    log.warning("openai: the reply has no usage; charging an estimate")
    return Usage(
        input_tokens=_prompt.estimate_tokens([body["messages"], body.get("tools", [])]),
        output_tokens=_prompt.estimate_tokens(text) if text else 1,
    )


def _status_message(error: openai.APIStatusError, secret: str) -> str:
    body = error.body
    message: Any = None
    if isinstance(body, dict):
        message = body.get("message")
        if message is None and isinstance(body.get("error"), dict):
            message = body["error"].get("message")
    elif isinstance(body, str):
        message = body
    text = str(message) if message else f"HTTP {error.status_code}"
    return f"{error.status_code} {one_line(text, secrets=(secret,))}"


def _cut_message(body: dict[str, Any]) -> str:
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    return (
        f"openai: the reply was cut off at the output limit ({limit} tokens); raise maxOutputTokens"
    )


def _describe(error: Exception) -> str:
    return str(error) or type(error).__name__
