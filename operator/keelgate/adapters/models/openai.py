"""The ``openai`` provider: chat completions with native tool calling, through the official SDK.

``base_url`` points it at any OpenAI-compatible server (vLLM, Ollama, LiteLLM). A plan is the
model's tool calls (or, with none, a final answer); a verdict is a forced ``keelgate_verdict``
tool call. Usage comes from the reply, so budgets count what the provider billed. Transient
failures are retried by ``_retry`` (the SDK's own retries are off); a refusal is a ModelError with
the provider's message on one line. This module must never log or repeat the API key, and never
retry anything but the model call itself.

What every SDK provider shares (the key rule, retries, reading errors, the reply rules) is
``_sdk``'s: this module keeps the wire form and how it reads its SDK's reply.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any, ClassVar, Literal, Unpack

import openai

from keelgate.adapters.models import _prompt
from keelgate.adapters.models._sdk import SdkModel, SdkOptions
from keelgate.core.model import ModelReply, ModelRequest
from keelgate.core.types import Usage
from keelgate.errors import ModelError

log = logging.getLogger("keelgate.models.openai")

MaxTokensField = Literal["max_completion_tokens", "max_tokens"]
# Local OpenAI-compatible servers ignore the key but the SDK insists on one.
_NO_KEY = "unused"


class OpenAIModel(SdkModel):
    """A chat-completions model. ``name`` is the model id sent on the wire and priced by."""

    provider = "openai"
    sdk: ClassVar[ModuleType] = openai

    keyless_servers = True  # Ollama, vLLM and the like need none

    def __init__(
        self,
        name: str,
        *,
        max_tokens_field: MaxTokensField | None = None,
        **options: Unpack[SdkOptions],
    ) -> None:
        super().__init__(name, **options)
        # OpenAI's own API wants max_completion_tokens (reasoning models refuse max_tokens);
        # most compatible servers (Ollama, llama.cpp, older vLLM) only read max_tokens.
        self.max_tokens_field: MaxTokensField = max_tokens_field or (
            "max_tokens" if self.base_url else "max_completion_tokens"
        )

    def _connect(self, api_key: str | None, timeout_seconds: float) -> Any:
        return openai.OpenAI(
            api_key=api_key or _NO_KEY,
            base_url=self.base_url,
            max_retries=0,
            timeout=timeout_seconds,
            http_client=self._http_client(),
        )

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

    def _create(self, body: dict[str, Any]) -> Any:
        return self._client.chat.completions.create(**body)

    @staticmethod
    def _status_text(error: Any) -> str:
        body = error.body
        message: Any = None
        if isinstance(body, dict):
            message = body.get("message")
            if message is None and isinstance(body.get("error"), dict):
                message = body["error"].get("message")
        elif isinstance(body, str):
            message = body
        return str(message) if message else ""

    def _reply(self, request: ModelRequest, completion: Any, body: dict[str, Any]) -> ModelReply:
        if not getattr(completion, "choices", None):
            raise ModelError("openai: the reply has no choices")
        choice = completion.choices[0]
        message = choice.message
        text = (message.content or "").strip()
        calls = [c for c in (message.tool_calls or []) if getattr(c, "type", "") == "function"]
        return self.planned_reply(
            request,
            text=text,
            calls=[(c.function.name, c.function.arguments) for c in calls],
            cut=choice.finish_reason == "length",
            refusal=message.refusal or None,
            usage=_usage(completion, body, text),
            limit=body.get("max_completion_tokens") or body.get("max_tokens"),
        )


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
