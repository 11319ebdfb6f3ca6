"""The ``openai`` provider against a real chat-completions server on loopback, via the official SDK.

Why it exists: a user pointing Keelgate at OpenAI or any compatible server (Ollama, vLLM) relies
on tool calls becoming saved actions, on the provider's usage reaching the budgets, on transient
failures being retried and refusals failing the run with the provider's own words.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes.llm import LlmFake, openai_error, openai_reply
from fakes.loopback import Answer
from keelgate.adapters.models._retry import RetryPolicy
from keelgate.adapters.models.openai import OpenAIModel
from keelgate.adapters.tools.python import PythonTool
from keelgate.core.loop import Loop
from keelgate.core.model import ModelRequest, PlannedCall, ToolInfo
from keelgate.core.protocols import Stores
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import SideEffect, StopReason
from keelgate.errors import InputError, ModelError, ModelUnavailable
from keelgate.stores.sqlite import SQLiteStore

KEY = "sk-test-0123456789abcdef"
FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, max_retry_after=5)
SKU_SCHEMA = {
    "type": "object",
    "properties": {"sku": {"type": "string"}},
    "required": ["sku"],
    "additionalProperties": False,
}
TOOLS = (
    ToolInfo("get_inventory", "Stock of a SKU", SideEffect.READ, SKU_SCHEMA),
    ToolInfo("place_order", "Order a SKU", SideEffect.WRITE, {"type": "object"}),
)


@pytest.fixture
def llm() -> Iterator[LlmFake]:
    server = LlmFake("openai").start()
    yield server  # type: ignore[misc]
    server.stop()


def _model(llm: LlmFake, **kwargs: Any) -> OpenAIModel:
    kwargs.setdefault("retry", FAST)
    return OpenAIModel("gpt-test", api_key=KEY, base_url=llm.base_url, **kwargs)


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


def test_tool_calls_become_planned_actions_with_usage(llm: LlmFake) -> None:
    """The model's tool calls are the plan, in order, with their arguments; usage is reported."""
    llm.add(
        openai_reply(
            calls=[("get_inventory", {"sku": "A1"}), ("place_order", {"sku": "A1", "qty": 20})],
            prompt_tokens=321,
            completion_tokens=45,
        )
    )
    reply = _model(llm).call(_request())
    assert reply.actions == (
        PlannedCall("get_inventory", {"sku": "A1"}),
        PlannedCall("place_order", {"sku": "A1", "qty": 20}),
    )
    assert not reply.done
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (321, 45)
    sent = llm.calls()[0]
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    body = sent.json()
    assert body["model"] == "gpt-test"
    assert [t["function"]["name"] for t in body["tools"]] == ["get_inventory", "place_order"]
    assert body["tools"][0]["function"]["parameters"] == SKU_SCHEMA
    assert "tool_choice" not in body  # planning leaves the choice to the model
    assert "Restock SKU A1" in body["messages"][1]["content"]


def test_a_reply_without_tool_calls_is_done_with_its_text(llm: LlmFake) -> None:
    """No tool calls means the model considers the goal met: its text is the answer."""
    llm.add(openai_reply(text="Nothing to do: 42 in stock."))
    reply = _model(llm).call(_request())
    assert reply.done and reply.actions == ()
    assert reply.answer == "Nothing to do: 42 in stock."


def test_history_is_sent_as_native_tool_calls_and_results(llm: LlmFake) -> None:
    """Past iterations reach the model as its own tool calls followed by their results."""
    history = (
        {
            "iteration": 1,
            "actions": [
                {
                    "id": "1:0",
                    "tool": "get_inventory",
                    "args": {"sku": "A1"},
                    "status": "ok",
                    "output": {"count": 3},
                }
            ],
        },
        {"iteration": 1, "verdict": "reject", "reason": "check B2 too"},
    )
    llm.add(openai_reply(text="done"))
    _model(llm).call(_request(history=history, iteration=2, call=1))
    messages = llm.calls()[0].json()["messages"]
    assistant = next(m for m in messages if m["role"] == "assistant")
    assert assistant["tool_calls"][0]["function"]["name"] == "get_inventory"
    tool = next(m for m in messages if m["role"] == "tool")
    assert tool["tool_call_id"] == assistant["tool_calls"][0]["id"]
    assert '"count":3' in tool["content"]
    assert any("check B2 too" in (m.get("content") or "") for m in messages)


def test_verify_forces_the_verdict_tool_and_reads_a_rejection(llm: LlmFake) -> None:
    """A verify call forces ``keelgate_verdict``; its reject and reason reach the loop."""
    llm.add(openai_reply(calls=[("keelgate_verdict", {"verdict": "reject", "reason": "qty 0"})]))
    reply = _model(llm).call(_request("verify"))
    assert (reply.verdict, reply.reason) == ("reject", "qty 0")
    body = llm.calls()[0].json()
    assert body["tool_choice"] == {"type": "function", "function": {"name": "keelgate_verdict"}}
    assert "keelgate_verdict" in [t["function"]["name"] for t in body["tools"]]


def test_verify_reads_a_json_verdict_from_a_server_that_answers_in_prose(llm: LlmFake) -> None:
    """A compatible server that ignores tool_choice can still reject, as JSON in its text."""
    llm.add(openai_reply(text='Verdict: {"verdict": "reject", "reason": "wrong sku"}'))
    reply = _model(llm).call(_request("verify"))
    assert (reply.verdict, reply.reason) == ("reject", "wrong sku")


def test_max_output_tokens_reaches_the_wire(llm: LlmFake) -> None:
    """maxOutputTokens caps the reply: max_tokens for compatible servers, or the field asked."""
    llm.add(openai_reply(text="a"), openai_reply(text="b"), openai_reply(text="c"))
    _model(llm, max_output_tokens=256).call(_request())
    _model(llm, max_output_tokens=256, max_tokens_field="max_completion_tokens").call(_request())
    _model(llm, max_output_tokens=256).call(_request(max_output_tokens=64))
    bodies = [c.json() for c in llm.calls()]
    assert bodies[0]["max_tokens"] == 256 and "max_completion_tokens" not in bodies[0]
    assert bodies[1]["max_completion_tokens"] == 256 and "max_tokens" not in bodies[1]
    assert bodies[2]["max_tokens"] == 64  # the loop's own cap wins


def test_a_reply_cut_off_at_the_limit_is_refused(llm: LlmFake) -> None:
    """A reply truncated by the output cap is not acted on: half a tool call is no plan."""
    llm.add(openai_reply(calls=[("place_order", '{"sku": "A')], finish_reason="length"))
    with pytest.raises(ModelError, match="cut off at the output limit"):
        _model(llm, max_output_tokens=5).call(_request())


def test_5xx_and_dropped_connections_are_retried_then_succeed(llm: LlmFake) -> None:
    """Transient failures are retried with backoff; the third answer is used."""
    llm.add(
        openai_error(503, "overloaded", kind="server_error"),
        Answer(drop=True),
        openai_reply(calls=[("get_inventory", {"sku": "A1"})]),
    )
    slept: list[float] = []
    reply = _model(llm, sleep=slept.append).call(_request())
    assert reply.actions == (PlannedCall("get_inventory", {"sku": "A1"}),)
    assert len(llm.calls()) == 3
    assert slept == [0.01, 0.02]  # doubling backoff between the tries


def test_429_waits_as_long_as_retry_after_says(llm: LlmFake) -> None:
    """A 429 is retried after the server's Retry-After, not sooner."""
    llm.add(
        openai_error(429, "Rate limit reached", kind="requests", headers={"Retry-After": "1"}),
        openai_reply(text="ok"),
    )
    started = time.monotonic()
    reply = _model(llm).call(_request())
    assert reply.answer == "ok"
    assert time.monotonic() - started >= 1.0
    assert len(llm.calls()) == 2


def test_a_slow_reply_times_out_and_is_retried(llm: LlmFake) -> None:
    """A reply slower than the timeout is abandoned and the call made again."""
    llm.add(openai_reply(text="late", delay=1.5), openai_reply(text="on time"))
    reply = _model(llm, timeout_seconds=0.3).call(_request())
    assert reply.answer == "on time"
    assert len(llm.calls()) == 2


def test_retries_are_bounded(llm: LlmFake) -> None:
    """A server that keeps failing gets a bounded number of tries, then a ModelError."""
    llm.add(*[openai_error(500, "boom", kind="server_error") for _ in range(5)])
    with pytest.raises(ModelError, match=r"500 boom \(gave up after 4 attempts\)"):
        _model(llm).call(_request())
    assert len(llm.calls()) == 4


def test_the_default_policy_doubles_its_waits_and_stops_after_five_tries(llm: LlmFake) -> None:
    """Out of the box: 5 tries, waiting 0.5, 1, 2 and 4 seconds between them."""
    llm.add(*[openai_error(502, "bad gateway", kind="server_error") for _ in range(6)])
    slept: list[float] = []
    with pytest.raises(ModelError, match="gave up after 5 attempts"):
        OpenAIModel("gpt-test", api_key=KEY, base_url=llm.base_url, sleep=slept.append).call(
            _request()
        )
    assert slept == [0.5, 1.0, 2.0, 4.0]
    assert len(llm.calls()) == 5


def test_a_4xx_is_not_retried_and_carries_the_providers_message(llm: LlmFake) -> None:
    """A refusal is final: one request, and the provider's message on one line."""
    llm.add(openai_error(400, "Invalid schema for function 'place_order':\n  bad"))
    with pytest.raises(ModelError) as caught:
        _model(llm).call(_request())
    assert caught.value.message == ("openai: 400 Invalid schema for function 'place_order': bad")
    assert len(llm.calls()) == 1


def test_the_api_key_never_appears_in_an_error(llm: LlmFake) -> None:
    """A 401 that echoes the key does not put it (even masked) into the error."""
    llm.add(openai_error(401, f"Incorrect API key provided: {KEY}. Or sk-tes***cdef."))
    with pytest.raises(ModelError) as caught:
        _model(llm).call(_request())
    assert "0123456789" not in caught.value.message and "sk-tes" not in caught.value.message
    assert "401 Incorrect API key provided" in caught.value.message
    assert KEY not in repr(_model(llm))


def test_a_key_is_required_unless_a_base_url_is_given() -> None:
    """Without a key the official API cannot be used (a clear input error, naming the field);
    a local compatible server needs none."""
    with pytest.raises(InputError, match=r"model\.apiKeyEnv"):
        OpenAIModel("gpt-test", api_key=None)
    OpenAIModel("llama3", api_key=None, base_url="http://127.0.0.1:9/v1").close()


def test_the_estimate_grows_with_the_request_and_needs_no_network() -> None:
    """The pre-call estimate measures what would be sent, offline."""
    model = OpenAIModel("gpt-test", api_key=None, base_url="http://127.0.0.1:9/v1")
    small = model.estimate_input_tokens(_request())
    history = ({"iteration": 1, "verdict": "reject", "reason": "x" * 3500},)
    assert model.estimate_input_tokens(_request(history=history)) >= small + 1000


# Through the loop


def _loop(tmp_path: Path, model: OpenAIModel, orders: list[dict[str, Any]]) -> Loop:
    store = SQLiteStore(tmp_path / "keelgate.db")

    def place(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
        orders.append(args)
        return {"placed": True}

    return Loop(
        stores=Stores.of(store),
        model=model,
        tools=[PythonTool("place_order", place, SideEffect.WRITE)],
    )


def test_reported_usage_drives_the_token_budget(llm: LlmFake, tmp_path: Path) -> None:
    """A reply that reports more tokens than the budget stops the run before anything is acted
    on; raising the budget runs the saved plan without asking the model again."""
    llm.add(
        openai_reply(
            calls=[("place_order", {"sku": "A1", "qty": 20})],
            prompt_tokens=5000,
            completion_tokens=100,
        )
    )
    orders: list[dict[str, Any]] = []
    spec = LoopSpec("shop", "restock", "Restock A1", budget=Budget(tokens=2000))
    outcome = _loop(tmp_path, _model(llm), orders).run_or_resume(spec)
    assert outcome.stop.reason is StopReason.TOKEN_BUDGET and outcome.resumable
    assert (outcome.usage.input_tokens, outcome.usage.output_tokens) == (5000, 100)
    assert orders == []
    llm.add(
        openai_reply(calls=[("keelgate_verdict", {"verdict": "accept", "reason": "ok"})]),
        openai_reply(text="ordered 20", prompt_tokens=10, completion_tokens=5),
        openai_reply(calls=[("keelgate_verdict", {"verdict": "accept", "reason": "ok"})]),
    )
    outcome = _loop(tmp_path, _model(llm), orders).run_or_resume(
        spec.with_budget(Budget(tokens=100_000))
    )
    assert outcome.stop.reason is StopReason.GOAL_MET, outcome.stop.message
    assert orders == [{"sku": "A1", "qty": 20}]
    assert outcome.answer == "ordered 20"
    # plan (5000+100), verify, plan, verify: every reported token counted, nothing else.
    assert outcome.usage.input_tokens == 5000 + 100 + 10 + 100
    assert len(llm.calls()) == 4


def test_an_outage_leaves_the_run_where_it_was_to_be_tried_again(
    llm: LlmFake, tmp_path: Path
) -> None:
    """A provider down through every retry is not a stop: nothing is saved, the run is not
    failed, and the same call made again later continues it."""
    llm.add(
        openai_reply(calls=[("place_order", {"sku": "A1", "qty": 20})]),
        openai_reply(calls=[("keelgate_verdict", {"verdict": "accept", "reason": "ok"})]),
        *[openai_error(503, "overloaded", kind="server_error") for _ in range(4)],
    )
    orders: list[dict[str, Any]] = []
    spec = LoopSpec("shop", "restock", "Restock A1")
    with pytest.raises(ModelUnavailable, match="gave up after 4 attempts"):
        _loop(tmp_path, _model(llm), orders).run_or_resume(spec)
    store = SQLiteStore(tmp_path / "keelgate.db")
    try:
        before = Loop(stores=Stores.of(store)).state("shop", "restock")
    finally:
        store.close()
    assert before.stop is None and before.iteration == 1
    llm.add(
        openai_reply(text="all stocked up"),
        openai_reply(calls=[("keelgate_verdict", {"verdict": "accept", "reason": "ok"})]),
    )
    outcome = _loop(tmp_path, _model(llm), orders).run_or_resume(spec)
    assert outcome.stop.reason is StopReason.GOAL_MET and outcome.iteration == 2
    assert orders == [{"sku": "A1", "qty": 20}]


def test_a_4xx_stops_the_run_failed_with_the_providers_message(
    llm: LlmFake, tmp_path: Path
) -> None:
    """A provider refusal fails the run with the provider's message, on one line."""
    llm.add(openai_error(404, "The model `gpt-nope` does not exist", kind="not_found"))
    orders: list[dict[str, Any]] = []
    outcome = _loop(tmp_path, _model(llm), orders).run_or_resume(
        LoopSpec("shop", "restock", "Restock A1")
    )
    assert outcome.stop.reason is StopReason.FAILED and not outcome.resumable
    assert outcome.stop.message == "model: openai: 404 The model `gpt-nope` does not exist"
    assert "\n" not in outcome.stop.message and KEY not in outcome.stop.message
    assert len(llm.calls()) == 1


# From a manifest, through the builder


MANIFEST = """
apiVersion: keelgate.dev/v1alpha1
kind: AgentRun
metadata: {{name: restock, namespace: shop}}
spec:
  goal: "Restock SKU A1 if fewer than 10 are left"
  model:
    provider: openai
    name: llama3
    baseURL: "{llm}"
    apiKeyEnv: KG_TEST_LLM_KEY
    maxOutputTokens: 77
  tools:
    - name: get_inventory
      sideEffect: READ
      http: {{url: "{shop}/items/{{sku}}", method: GET}}
    - name: place_order
      sideEffect: WRITE
      timeoutSeconds: 5
      http: {{url: "{shop}/orders", method: POST}}
    - name: supplier_stock
      sideEffect: READ
      mcp: {{url: "{mcp}", tool: stock}}
    - name: supplier_order
      sideEffect: WRITE
      mcp: {{url: "{mcp}", tool: place_order}}
  budget: {{maxIterations: 5, tokens: 50000}}
"""


def test_a_manifest_with_openai_http_and_mcp_tools_runs_end_to_end(
    llm: LlmFake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An AgentRun naming provider openai with a baseURL, HTTP and MCP tools builds through the
    runner's registry and runs to goal_met: the key comes from apiKeyEnv, maxOutputTokens
    reaches the wire, each WRITE arrives once with its key, and usage is what was reported."""
    from fakes.downstream import Shop
    from fakes.mcp_server import McpFake
    from keelgate.manifest.load import load_agentrun
    from keelgate.runners.build import build_loop

    shop, mcp = Shop().start(), McpFake().start()
    try:
        monkeypatch.setenv("KG_TEST_LLM_KEY", KEY)
        accept = ("keelgate_verdict", {"verdict": "accept", "reason": "fine"})
        llm.add(
            openai_reply(
                calls=[("get_inventory", {"sku": "A1"}), ("supplier_stock", {"sku": "A1"})]
            ),
            openai_reply(calls=[accept]),
            openai_reply(
                calls=[
                    ("place_order", {"sku": "A1", "qty": 20}),
                    ("supplier_order", {"sku": "A1", "qty": 5}),
                ]
            ),
            openai_reply(calls=[accept]),
            openai_reply(text="Ordered 20 from the shop and 5 from the supplier."),
            openai_reply(calls=[accept]),
        )
        text = MANIFEST.format(llm=llm.base_url, shop=shop.url, mcp=mcp.url)
        spec = load_agentrun(text).to_loop_spec()
        store = SQLiteStore(tmp_path / "keelgate.db")
        loop = build_loop(spec, Stores.of(store))
        outcome = loop.run_or_resume(spec)
        assert outcome.stop.reason is StopReason.GOAL_MET, outcome.stop.message
        assert outcome.answer == "Ordered 20 from the shop and 5 from the supplier."
        assert outcome.usage.input_tokens == 600 and outcome.usage.output_tokens == 120
        calls = llm.calls()
        assert all(c.headers["authorization"] == f"Bearer {KEY}" for c in calls)
        assert all(c.json()["max_tokens"] == 77 for c in calls)
        second_plan = calls[2].json()["messages"]
        results = [m["content"] for m in second_plan if m["role"] == "tool"]
        assert '"count":3' in results[0] and '"count":3' in results[1]
        assert list(shop.orders.values()) == [1] and list(mcp.orders.values()) == [1]
        assert list(shop.orders) != list(mcp.orders)  # each WRITE has its own key
        store.close()
    finally:
        shop.stop()
        mcp.stop()
