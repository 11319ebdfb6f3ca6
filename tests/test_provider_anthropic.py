"""The ``anthropic`` provider against a real Messages API server on loopback, via the official SDK.

Why it exists: a run on Claude relies on tool_use blocks becoming saved actions, on the reported
usage (cache reads included) reaching the budgets, on transient failures being retried and on
refusals failing the run with Anthropic's own message.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes.llm import LlmFake, anthropic_error, anthropic_reply
from fakes.loopback import Answer
from keelgate.adapters.models._retry import RetryPolicy
from keelgate.adapters.models.anthropic import DEFAULT_MAX_OUTPUT_TOKENS, AnthropicModel
from keelgate.adapters.tools.python import PythonTool
from keelgate.core.loop import Loop
from keelgate.core.model import ModelRequest, PlannedCall, ToolInfo
from keelgate.core.protocols import Stores
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import SideEffect, StopReason
from keelgate.errors import InputError, ModelError
from keelgate.stores.sqlite import SQLiteStore

KEY = "sk-ant-test-0123456789abcdef"
FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, max_retry_after=5)
SKU_SCHEMA = {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}
TOOLS = (
    ToolInfo("get_inventory", "Stock of a SKU", SideEffect.READ, SKU_SCHEMA),
    ToolInfo("place_order", "Order a SKU", SideEffect.WRITE, {"type": "object"}),
)


@pytest.fixture
def llm() -> Iterator[LlmFake]:
    server = LlmFake("anthropic").start()
    yield server  # type: ignore[misc]
    server.stop()


def _model(llm: LlmFake, **kwargs: Any) -> AnthropicModel:
    kwargs.setdefault("retry", FAST)
    return AnthropicModel("claude-test", api_key=KEY, base_url=llm.base_url, **kwargs)


def _request(phase: str = "plan", **kwargs: Any) -> ModelRequest:
    fields: dict[str, Any] = {
        "phase": phase,
        "goal": "Restock SKU A1 if fewer than 10 are left",
        "iteration": 1,
        "call": 0,
        "history": (),
        "tools": TOOLS,
    }
    fields.update(kwargs)
    return ModelRequest(**fields)


def test_tool_use_blocks_become_planned_actions_with_usage(llm: LlmFake) -> None:
    """tool_use blocks are the plan, in order; input, cache-read and output tokens are counted."""
    llm.add(
        anthropic_reply(
            text="Checking stock first.",
            calls=[("get_inventory", {"sku": "A1"}), ("place_order", {"sku": "A1", "qty": 20})],
            input_tokens=300,
            cache_read_tokens=21,
            output_tokens=45,
        )
    )
    reply = _model(llm).call(_request())
    assert reply.actions == (
        PlannedCall("get_inventory", {"sku": "A1"}),
        PlannedCall("place_order", {"sku": "A1", "qty": 20}),
    )
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (321, 45)
    sent = llm.calls()[0]
    # The SDK chooses the header (x-api-key or a bearer token); either way the key is sent.
    assert KEY in (sent.headers.get("x-api-key"), sent.headers.get("authorization", "")[7:])
    body = sent.json()
    assert body["model"] == "claude-test"
    assert body["max_tokens"] == DEFAULT_MAX_OUTPUT_TOKENS  # required by the API, capped
    assert [t["name"] for t in body["tools"]] == ["get_inventory", "place_order"]
    assert body["tools"][0]["input_schema"] == SKU_SCHEMA
    assert "tool_choice" not in body
    assert body["messages"][0]["role"] == "user"


def test_a_reply_without_tool_use_is_done_with_its_text(llm: LlmFake) -> None:
    """No tool_use means the goal is met: the text is the answer."""
    llm.add(anthropic_reply(text="Nothing to do: 42 in stock."))
    reply = _model(llm).call(_request())
    assert reply.done and reply.answer == "Nothing to do: 42 in stock."


def test_history_alternates_roles_with_tool_results_first(llm: LlmFake) -> None:
    """Past calls are assistant tool_use turns; their results open the next user turn, and a
    rejection that follows joins that same turn (the API requires alternating roles)."""
    history = (
        {
            "iteration": 1,
            "actions": [
                {"id": "1:0", "tool": "get_inventory", "args": {"sku": "A1"}, "status": "ok"},
                {"id": "1:1", "tool": "place_order", "args": {}, "status": "error", "error": "422"},
            ],
        },
        {"iteration": 1, "verdict": "reject", "reason": "order failed"},
    )
    llm.add(anthropic_reply(text="done"))
    _model(llm).call(_request(history=history, iteration=2, call=1))
    messages = llm.calls()[0].json()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    uses = messages[1]["content"]
    results = messages[2]["content"]
    assert [b["type"] for b in results] == ["tool_result", "tool_result", "text", "text"]
    assert [r["tool_use_id"] for r in results[:2]] == [u["id"] for u in uses]
    assert results[1]["is_error"] is True and results[0]["is_error"] is False
    assert "order failed" in results[2]["text"]


def test_verify_forces_the_verdict_tool_and_reads_a_rejection(llm: LlmFake) -> None:
    """A verify call forces ``keelgate_verdict``; its reject and reason reach the loop."""
    llm.add(anthropic_reply(calls=[("keelgate_verdict", {"verdict": "reject", "reason": "qty 0"})]))
    reply = _model(llm).call(_request("verify"))
    assert (reply.verdict, reply.reason) == ("reject", "qty 0")
    body = llm.calls()[0].json()
    assert body["tool_choice"] == {"type": "tool", "name": "keelgate_verdict"}


def test_an_unreadable_verdict_is_a_model_error(llm: LlmFake) -> None:
    """A verdict that is neither accept nor reject is not guessed at."""
    llm.add(anthropic_reply(calls=[("keelgate_verdict", {"verdict": "maybe", "reason": "?"})]))
    with pytest.raises(ModelError, match="verdict must be 'accept' or 'reject'"):
        _model(llm).call(_request("verify"))


def test_max_output_tokens_reaches_the_wire(llm: LlmFake) -> None:
    """maxOutputTokens is sent as max_tokens; the loop's own cap wins over the provider's."""
    llm.add(anthropic_reply(text="a"), anthropic_reply(text="b"))
    _model(llm, max_output_tokens=256).call(_request())
    _model(llm, max_output_tokens=256).call(_request(max_output_tokens=64))
    assert [c.json()["max_tokens"] for c in llm.calls()] == [256, 64]


def test_a_reply_cut_off_at_the_limit_is_refused(llm: LlmFake) -> None:
    """A reply stopped by max_tokens is not acted on."""
    llm.add(anthropic_reply(text="I will order", stop_reason="max_tokens"))
    with pytest.raises(ModelError, match=r"cut off at the output limit \(8 tokens\)"):
        _model(llm, max_output_tokens=8).call(_request())


def test_overloaded_and_dropped_connections_are_retried_then_succeed(llm: LlmFake) -> None:
    """529 overloaded and a dropped connection are retried with backoff."""
    llm.add(
        anthropic_error(529, "Overloaded", kind="overloaded_error"),
        Answer(drop=True),
        anthropic_reply(calls=[("get_inventory", {"sku": "A1"})]),
    )
    slept: list[float] = []
    reply = _model(llm, sleep=slept.append).call(_request())
    assert reply.actions == (PlannedCall("get_inventory", {"sku": "A1"}),)
    assert len(llm.calls()) == 3 and slept == [0.01, 0.02]


def test_429_waits_as_long_as_retry_after_says(llm: LlmFake) -> None:
    """A 429 is retried after the server's Retry-After, not sooner."""
    llm.add(
        anthropic_error(429, "rate limited", kind="rate_limit_error", headers={"retry-after": "1"}),
        anthropic_reply(text="ok"),
    )
    started = time.monotonic()
    assert _model(llm).call(_request()).answer == "ok"
    assert time.monotonic() - started >= 1.0


def test_a_retry_after_longer_than_the_policy_allows_is_not_waited_for(llm: LlmFake) -> None:
    """A server asking for an hour's wait fails the call at once, saying so."""
    llm.add(
        anthropic_error(
            429, "rate limited", kind="rate_limit_error", headers={"retry-after": "3600"}
        )
    )
    started = time.monotonic()
    with pytest.raises(ModelError, match="the server asked to wait 3600s"):
        _model(llm).call(_request())
    assert time.monotonic() - started < 1.0


def test_a_slow_reply_times_out_and_is_retried(llm: LlmFake) -> None:
    """A reply slower than the timeout is abandoned and the call made again."""
    llm.add(anthropic_reply(text="late", delay=1.5), anthropic_reply(text="on time"))
    assert _model(llm, timeout_seconds=0.3).call(_request()).answer == "on time"
    assert len(llm.calls()) == 2


def test_a_4xx_is_not_retried_and_carries_the_providers_message(llm: LlmFake) -> None:
    """A refusal is final: one request, Anthropic's message, no key."""
    llm.add(anthropic_error(400, "tools.0.input_schema: JSON schema is invalid"))
    with pytest.raises(ModelError) as caught:
        _model(llm).call(_request())
    assert caught.value.message == "anthropic: 400 tools.0.input_schema: JSON schema is invalid"
    assert len(llm.calls()) == 1


def test_the_api_key_never_appears_in_an_error(llm: LlmFake) -> None:
    """A 401 that echoes the key does not carry it into the error or the repr."""
    llm.add(anthropic_error(401, f"invalid x-api-key {KEY}", kind="authentication_error"))
    with pytest.raises(ModelError) as caught:
        _model(llm).call(_request())
    assert "0123456789" not in caught.value.message
    assert KEY not in repr(_model(llm))


def test_a_key_is_required() -> None:
    """Without a key the provider is not built: an input error naming the field."""
    with pytest.raises(InputError, match=r"model\.apiKeyEnv"):
        AnthropicModel("claude-test", api_key=None)


# Through the loop


def test_reported_usage_drives_the_token_budget(llm: LlmFake, tmp_path: Path) -> None:
    """A reply whose reported usage crosses the budget stops the run before acting; the stop is
    resumable and the usage is exactly what the provider reported."""
    llm.add(
        anthropic_reply(
            calls=[("place_order", {"sku": "A1", "qty": 20})], input_tokens=5000, output_tokens=100
        )
    )
    store = SQLiteStore(tmp_path / "keelgate.db")
    orders: list[dict[str, Any]] = []

    def place(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
        orders.append(args)
        return {"placed": True}

    loop = Loop(
        stores=Stores.of(store),
        model=_model(llm),
        tools=[PythonTool("place_order", place, SideEffect.WRITE)],
    )
    outcome = loop.run_or_resume(LoopSpec("shop", "r1", "Restock A1", budget=Budget(tokens=2000)))
    assert outcome.stop.reason is StopReason.TOKEN_BUDGET and outcome.resumable
    assert (outcome.usage.input_tokens, outcome.usage.output_tokens) == (5000, 100)
    assert orders == []


def test_a_4xx_stops_the_run_failed_with_the_providers_message(
    llm: LlmFake, tmp_path: Path
) -> None:
    """A provider refusal fails the run with Anthropic's message, on one line."""
    llm.add(anthropic_error(404, "model: claude-nope", kind="not_found_error"))
    store = SQLiteStore(tmp_path / "keelgate.db")
    loop = Loop(stores=Stores.of(store), model=_model(llm))
    outcome = loop.run_or_resume(LoopSpec("shop", "r1", "Restock A1"))
    assert outcome.stop.reason is StopReason.FAILED and not outcome.resumable
    assert outcome.stop.message == "model: anthropic: 404 model: claude-nope"
