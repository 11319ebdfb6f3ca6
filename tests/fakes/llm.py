"""Model servers on loopback speaking the OpenAI chat-completions and Anthropic messages formats.

Each answers from a script of ``Answer``s, one per request, built with the helpers below in the
providers' documented wire shapes (tool calls, usage, provider-style error JSON). The official
SDKs talk to them over real HTTP, unpatched. Every request is kept for assertions on what reached
the wire (max_tokens, tools, tool_choice, the API key header).
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from fakes.loopback import Answer, LoopbackServer, Received

_ids = itertools.count(1)


class LlmFake(LoopbackServer):
    """``flavor`` is "openai" (POST /v1/chat/completions) or "anthropic" (POST /v1/messages)."""

    def __init__(self, flavor: str, script: Sequence[Answer] = ()) -> None:
        super().__init__()
        self.flavor = flavor
        self.path = "/v1/chat/completions" if flavor == "openai" else "/v1/messages"
        self.script: list[Answer] = list(script)
        self._script_lock = threading.Lock()

    @property
    def base_url(self) -> str:
        """What the SDK's base_url is set to (the OpenAI SDK's includes /v1)."""
        return f"{self.url}/v1" if self.flavor == "openai" else self.url

    def add(self, *answers: Answer) -> None:
        with self._script_lock:
            self.script.extend(answers)

    def calls(self) -> list[Received]:
        return [r for r in self.received if r.path == self.path]

    def respond(self, received: Received) -> Answer:
        if received.path != self.path:
            return Answer(404, {"error": {"message": f"no route {received.path}"}})
        with self._script_lock:
            if not self.script:
                return _error(self.flavor, 418, "the fake's script is exhausted")
            return self.script.pop(0)


# OpenAI wire format


def openai_reply(
    *,
    calls: Sequence[tuple[str, Mapping[str, Any] | str]] = (),
    text: str | None = None,
    prompt_tokens: int = 100,
    completion_tokens: int = 20,
    finish_reason: str | None = None,
    usage: bool = True,
    **answer: Any,
) -> Answer:
    """A chat.completion with tool calls (name, args) and/or text."""
    tool_calls = [
        {
            "id": f"call_{next(_ids)}",
            "type": "function",
            "function": {
                "name": name,
                "arguments": args if isinstance(args, str) else json.dumps(args),
            },
        }
        for name, args in calls
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    body: dict[str, Any] = {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": 1_790_000_000,
        "model": "fake-model",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
                "logprobs": None,
            }
        ],
    }
    if usage:
        body["usage"] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
    return Answer(200, body, **answer)


def openai_error(
    status: int, message: str, *, kind: str = "invalid_request_error", **answer: Any
) -> Answer:
    return Answer(
        status, {"error": {"message": message, "type": kind, "param": None, "code": None}}, **answer
    )


# Anthropic wire format


def anthropic_reply(
    *,
    calls: Sequence[tuple[str, Mapping[str, Any]]] = (),
    text: str | None = None,
    input_tokens: int = 100,
    output_tokens: int = 20,
    cache_read_tokens: int = 0,
    stop_reason: str | None = None,
    **answer: Any,
) -> Answer:
    """A Message with tool_use blocks (name, input) and/or a text block."""
    content: list[dict[str, Any]] = []
    if text is not None:
        content.append({"type": "text", "text": text})
    content.extend(
        {"type": "tool_use", "id": f"toolu_{next(_ids):08d}", "name": name, "input": dict(args)}
        for name, args in calls
    )
    body = {
        "id": f"msg_{next(_ids):08d}",
        "type": "message",
        "role": "assistant",
        "model": "fake-model",
        "content": content,
        "stop_reason": stop_reason or ("tool_use" if calls else "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cache_read_tokens,
        },
    }
    return Answer(200, body, **answer)


def anthropic_error(
    status: int, message: str, *, kind: str = "invalid_request_error", **answer: Any
) -> Answer:
    return Answer(
        status,
        {"type": "error", "error": {"type": kind, "message": message}},
        **answer,
    )


def _error(flavor: str, status: int, message: str) -> Answer:
    return openai_error(status, message) if flavor == "openai" else anthropic_error(status, message)
