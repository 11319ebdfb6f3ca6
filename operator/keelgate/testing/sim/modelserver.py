"""The world's model as a server on the simulated network, in OpenAI's and Anthropic's formats.

Why it exists: a run's model is reached through the product's own adapters
(``keelgate.adapters.models``), with their retries (a 429 or a 5xx tried again after a pause, a
timeout counted), their reading of a reply, and their usage. This server answers them as a
provider would: it reads the question off the conversation the adapter sends (the phase and
iteration from the adapter's own wording, how many plans the history shows carried out), asks
the world's ``Planner``, and answers in the provider's wire format; or, as the schedule says,
refuses the connection, answers 429 with a Retry-After, fails with a 500, or loses the answer.
It follows the wire formats of the two SDKs the adapters use; nothing of the adapters is copied.
With ``cached_input`` (the whole world), Anthropic's answers say part of their input was read
from or written to a prompt cache, as a cached prompt's are: the tokens are the model's all the
same (the world's books keep the whole count); only their report is split.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from keelgate.core.model import ModelReply
from keelgate.core.types import Usage
from keelgate.testing.sim.model import Planner, Question, estimate_floor
from keelgate.testing.sim.network import Fate, Reply, Request
from keelgate.testing.sim.world import World

HOST = "model.sim"
OPENAI_URL = f"http://{HOST}/v1"
ANTHROPIC_URL = f"http://{HOST}"
#: The variable the manifest names for the API key (the simulation sets it).
KEY_ENV = "KEELGATE_SIM_MODEL_KEY"
VERDICT_TOOL = "keelgate_verdict"

_VERIFY = re.compile(r"Verify iteration (\d+):")
_PLAN = re.compile(r"Iteration (\d+): call the next tools")
_ENDED = re.compile(r"Iteration \d+ ended without tool calls")
_REJECTED = re.compile(r"A verifier rejected iteration (\d+):")
#: How long a prompt-cache entry lives after its last use (Anthropic's default time to live,
#: five minutes, counted again from each read).
CACHE_SECONDS = 300.0


def manifest_model(face: str) -> dict[str, Any]:
    """The manifest's model entry for a run whose model is reached as ``face``."""
    if face == "openai":
        return {"provider": "openai", "name": "sim-gpt", "baseURL": OPENAI_URL}
    if face == "anthropic":
        return {
            "provider": "anthropic",
            "name": "sim-claude",
            "baseURL": ANTHROPIC_URL,
            "apiKeyEnv": KEY_ENV,
        }
    # In process: the simulation's builder puts the world's model in (the script is never read).
    return {"provider": "scripted", "script": [{"done": True}]}


class ModelServer:
    """The provider's API: one endpoint per format."""

    def __init__(self, world: World, planner: Planner, *, cached_input: bool = False) -> None:
        self.world = world
        self.planner = planner
        self.cached_input = cached_input
        self._ids = itertools.count(1)
        #: The prompt cache: each prefix (system prompt and tools) and when its entry expires.
        self._cache: dict[str, float] = {}

    def fate(self, request: Request, limit: float) -> Fate:
        schedule = self.world.schedule
        pick = schedule.pick(24)
        if pick == 1:
            return Fate("unreachable")
        if pick == 2:
            wait = f"{schedule.between(0.0, 3.0):.1f}"
            return Fate("refused", status=429, headers={"retry-after": wait})
        if pick == 3:
            return Fate("error", status=500, acts=False)
        if pick == 4:
            return Fate("lost", reset=schedule.chance(500))
        if pick == 5:
            return Fate("answer-lost", reset=schedule.chance(500))
        return Fate("ok")

    def handle(self, request: Request, sent: int | None) -> Reply:
        body = request.args
        # What the adapter estimates a question's input from: its messages and tools (and
        # Anthropic's system prompt), as sent.
        if request.path.endswith("/chat/completions"):
            texts, calls = _openai_turns(body.get("messages") or ())
            asked = _text([body.get("messages"), body.get("tools", [])])
            reply = self.planner.answer(_question(texts, calls), estimate=estimate_floor(asked))
            return Reply(200, self._openai(body, reply))
        if request.path.endswith("/messages"):
            texts, calls = _anthropic_turns(body.get("messages") or ())
            asked = _text([body.get("system"), body.get("messages"), body.get("tools", [])])
            reply = self.planner.answer(_question(texts, calls), estimate=estimate_floor(asked))
            return Reply(200, self._anthropic(body, reply))
        return Reply(404, {"error": {"message": f"no such endpoint {request.path}"}})

    def _openai(self, body: Mapping[str, Any], reply: ModelReply) -> dict[str, Any]:
        calls = _calls(reply)
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{next(self._ids)}",
                    "type": "function",
                    "function": {"name": name, "arguments": _json(args)},
                }
                for name, args in calls
            ]
        else:
            message["content"] = reply.answer or ""
        return {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", ""),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if calls else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": reply.usage.input_tokens,
                "completion_tokens": reply.usage.output_tokens,
                "total_tokens": reply.usage.tokens,
            },
        }

    def _anthropic(self, body: Mapping[str, Any], reply: ModelReply) -> dict[str, Any]:
        calls = _calls(reply)
        content: list[dict[str, Any]] = [
            {"type": "tool_use", "id": f"toolu_{next(self._ids)}", "name": name, "input": args}
            for name, args in calls
        ]
        if not calls:
            content = [{"type": "text", "text": reply.answer or ""}]
        return {
            "id": f"msg_{next(self._ids)}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", ""),
            "content": content,
            "stop_reason": "tool_use" if calls else "end_turn",
            "stop_sequence": None,
            "usage": self._anthropic_usage(body, reply.usage),
        }

    def _anthropic_usage(self, body: Mapping[str, Any], usage: Usage) -> dict[str, Any]:
        """An answer's usage as Anthropic's ``messages`` reports it. With ``cached_input``, three
        quarters of its input is the prompt's prefix (the system prompt and the tools, the same
        in every question of a run): written to the cache (``cache_creation_input_tokens``,
        with its breakdown by time to live) when no entry of that very prefix is alive, read
        from it (``cache_read_input_tokens``) when one is, and ``input_tokens`` is the rest
        only. The input billed is the sum of the three, as before."""
        if not self.cached_input:
            return {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}
        prefix = usage.input_tokens * 3 // 4
        key = _json([body.get("system"), body.get("tools")])
        read = self._cache.get(key, -1.0) >= self.world.now
        self._cache[key] = self.world.now + CACHE_SECONDS
        written = 0 if read else prefix
        return {
            "input_tokens": usage.input_tokens - prefix,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": prefix - written,
            "cache_creation": {
                "ephemeral_5m_input_tokens": written,
                "ephemeral_1h_input_tokens": 0,
            },
            "output_tokens": usage.output_tokens,
        }


def _calls(reply: ModelReply) -> list[tuple[str, dict[str, Any]]]:
    """The tool calls of a reply: a plan's actions, or a verdict (always a forced call)."""
    if reply.actions:
        return [(c.tool, dict(c.args)) for c in reply.actions]
    if reply.done:
        return []
    return [(VERDICT_TOOL, {"verdict": reply.verdict, "reason": reply.reason or "fine"})]


def _question(texts: Sequence[str], calls: int) -> Question:
    """The question a conversation asks, read off the adapter's wording of it."""
    ended = sum(1 for t in texts if _ENDED.match(t))
    rejections = [int(m.group(1)) for t in texts if (m := _REJECTED.match(t))]
    acted = calls + ended - len(rejections)
    last = texts[-1] if texts else ""
    if (verify := _VERIFY.match(last)) is not None:
        iteration = int(verify.group(1))
        return Question("verify", iteration, acted, iteration in rejections)
    plan = _PLAN.match(last)
    iteration = int(plan.group(1)) if plan is not None else 1
    return Question("plan", iteration, acted, iteration in rejections)


def _openai_turns(messages: Sequence[Mapping[str, Any]]) -> tuple[list[str], int]:
    texts: list[str] = []
    calls = 0
    for message in messages:
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            texts.append(message["content"])
        elif message.get("role") == "assistant" and message.get("tool_calls"):
            calls += 1
    return texts, calls


def _anthropic_turns(messages: Sequence[Mapping[str, Any]]) -> tuple[list[str], int]:
    texts: list[str] = []
    calls = 0
    for message in messages:
        blocks = message.get("content")
        if isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        blocks = blocks or []
        if message.get("role") == "assistant":
            calls += any(b.get("type") == "tool_use" for b in blocks)
        else:
            texts.extend(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
    return texts, calls


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _text(value: Any) -> str:
    """JSON as the adapters write it when they estimate (no escapes of non-ASCII text)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
