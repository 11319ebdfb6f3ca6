"""MCP tools against a real MCP server (the ``mcp`` SDK, streamable HTTP) on loopback.

Why it exists: MCP servers describe their own tools and claim hints about them; Keelgate must take
the schemas and descriptions but never the side-effect class from the server, must hand a WRITE
its idempotency key, and must treat a WRITE that got no answer, or an error after its side
effect, as an unknown outcome: the model's natural retry of the same call is never sent again.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from mcp.server.mcpserver import Context, MCPServer

from fakes.mcp_server import KEY_META, McpFake
from keelgate.adapters.models.scripted import ScriptedModel
from keelgate.adapters.tools.mcp import (
    McpServerRef,
    McpTool,
    McpToolSpec,
    discover,
    suggested_side_effect,
)
from keelgate.core import failpoints
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import LoopKind, SideEffect, StopReason
from keelgate.errors import InputError, OutcomeUncertain, SimulatedCrash, ToolError
from keelgate.stores.sqlite import SQLiteStore
from keelgate.testing.deadlines import within_a_call
from support.ledger import REVIEW_SPEC, scripted, sqlite_stores

READ = SideEffect.READ
WRITE = SideEffect.WRITE


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[McpFake]:
    server = McpFake().start()
    yield server
    server.stop()


@pytest.fixture
def fake(mcp_server: McpFake) -> McpFake:
    mcp_server.orders.clear()
    mcp_server.seen_meta.clear()
    mcp_server.slow_seconds = 0.0
    return mcp_server


def _tools(fake: McpFake, *specs: McpToolSpec, timeout: float = 10) -> dict[str, McpTool]:
    ref = McpServerRef(fake.url, timeout_seconds=timeout)
    return {t.name: t for t in discover(ref, specs)}


def _shop(fake: McpFake, **kwargs: Any) -> dict[str, McpTool]:
    return _tools(
        fake,
        McpToolSpec("get_stock", READ, remote_name="stock"),
        McpToolSpec("place_order", WRITE),
        **kwargs,
    )


def test_descriptions_and_schemas_come_from_the_server(fake: McpFake) -> None:
    """The model is told what the server says each tool does and takes."""
    tools = _shop(fake)
    order = tools["place_order"]
    assert order.description == "Order qty of a SKU."
    assert order.input_schema["required"] == ["sku", "qty"]
    assert order.input_schema["properties"]["qty"]["type"] == "integer"
    assert tools["get_stock"].remote_name == "stock"
    assert tools["get_stock"].warnings == () and order.warnings == ()


def test_a_read_returns_the_structured_result_without_a_key(fake: McpFake) -> None:
    """A READ answers with the tool's structured result and carries no idempotency key."""
    result = _shop(fake)["get_stock"].invoke({"sku": "A1"}, idempotency_key=None)
    assert result == {"sku": "A1", "count": 3}
    assert all(KEY_META not in meta for meta in fake.seen_meta)


def test_a_write_whose_tool_was_edited_to_read_still_carries_its_key_and_is_unsure(
    fake: McpFake,
) -> None:
    """A call planned as a WRITE whose tool was edited to READ since (the loop still gives it
    its key) stays a WRITE: its key reaches the server in _meta, and an answer that does not
    come in time is an unknown outcome, not a failure the loop could move past."""
    fake.slow_seconds = 2.0
    edited = _tools(fake, McpToolSpec("place_order", READ), timeout=0.5)["place_order"]
    with within_a_call("kg-r") as call, pytest.raises(OutcomeUncertain):
        edited.invoke({"sku": "A1", "qty": 1}, idempotency_key="kg-r")
    assert call.sent
    assert fake.seen_meta[-1][KEY_META] == "kg-r"


def test_a_write_carries_its_key_in_meta(fake: McpFake) -> None:
    """A WRITE's key reaches the server in _meta, where the server counts it."""
    with within_a_call("kg-1") as call:
        result = _shop(fake)["place_order"].invoke({"sku": "A1", "qty": 2}, idempotency_key="kg-1")
    assert call.sent
    assert result == {"ordered": 2, "sku": "A1"}
    assert fake.orders == {"kg-1": 1}
    assert fake.seen_meta[-1][KEY_META] == "kg-1"


def test_a_call_made_in_a_traced_run_carries_its_span_in_meta(fake: McpFake) -> None:
    """While a tool call's span is current, the MCP request's _meta carries its W3C
    ``traceparent`` beside the key, so the server's own spans join the run's trace."""
    from keelgate.core import tracing

    parent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    with tracing.carrying({"traceparent": parent}), within_a_call("kg-9"):
        _shop(fake)["place_order"].invoke({"sku": "A1", "qty": 2}, idempotency_key="kg-9")
    assert fake.seen_meta[-1]["traceparent"] == parent
    assert fake.seen_meta[-1][KEY_META] == "kg-9"
    with within_a_call("kg-10"):
        _shop(fake)["place_order"].invoke({"sku": "A1", "qty": 1}, idempotency_key="kg-10")
    assert "traceparent" not in fake.seen_meta[-1]  # nothing traced: nothing carried


def test_a_key_argument_is_filled_by_keelgate_and_hidden_from_the_model(fake: McpFake) -> None:
    """For a server that takes the key as a parameter, the model never sees or supplies it."""
    (tool,) = _tools(
        fake,
        McpToolSpec(
            "order", WRITE, remote_name="place_order_keyed", key_argument="idempotency_key"
        ),
    ).values()
    assert "idempotency_key" not in tool.input_schema["properties"]
    assert "idempotency_key" not in tool.input_schema["required"]
    with within_a_call("kg-2"):
        tool.invoke({"sku": "A1", "qty": 1}, idempotency_key="kg-2")
    assert fake.orders == {"kg-2": 1}


def test_the_manifest_decides_the_side_effect_and_hints_only_warn(fake: McpFake) -> None:
    """A tool the server calls read-only but the manifest calls WRITE is a WRITE (it gets a key);
    one the server calls destructive but the manifest calls READ is a READ. Both are warned."""
    tools = _tools(
        fake,
        McpToolSpec("stock_as_write", WRITE, remote_name="stock"),
        McpToolSpec("order_as_read", READ, remote_name="place_order"),
    )
    assert tools["stock_as_write"].side_effect is WRITE
    assert "marks it read-only" in tools["stock_as_write"].warnings[0]
    assert tools["order_as_read"].side_effect is READ
    assert "marks it destructive" in tools["order_as_read"].warnings[0]
    tools["order_as_read"].invoke({"sku": "A1", "qty": 1}, idempotency_key=None)
    # A READ gets no key, whatever the server hints (the loop gives a READ none).
    assert all(KEY_META not in meta for meta in fake.seen_meta)


def test_hints_suggest_a_side_effect_for_diagnostics_only(fake: McpFake) -> None:
    """readOnlyHint suggests READ, destructiveHint WRITE, no hints nothing."""
    from keelgate.adapters.tools.mcp import list_remote_tools

    remote = list_remote_tools(McpServerRef(fake.url))
    assert suggested_side_effect(remote["stock"].annotations) is READ
    assert suggested_side_effect(remote["place_order"].annotations) is WRITE
    assert suggested_side_effect(remote["place_order_keyed"].annotations) is None


def test_a_verification_loop_refuses_a_tool_the_manifest_calls_write(
    fake: McpFake, tmp_path: Path
) -> None:
    """The server's read-only hint does not let a WRITE-declared tool into a READ-only loop."""
    (tool,) = _tools(fake, McpToolSpec("stock_as_write", WRITE, remote_name="stock")).values()
    store = SQLiteStore(tmp_path / "k.db")
    script = [
        {"actions": [{"tool": "stock_as_write", "args": {"sku": "A1"}}]},
        {"done": True, "answer": "checked"},
    ]
    loop = Loop(stores=Stores.of(store), model=ScriptedModel(script), tools=[tool])
    spec = LoopSpec("shop", "check", "Check A1", kind=LoopKind.VERIFICATION)
    outcome = loop.run_or_resume(spec)
    assert outcome.stop.reason is StopReason.GOAL_MET
    action = loop.state("shop", "check").history[0]["actions"][0]
    assert action["status"] == "refused" and "side_effect_not_permitted" in action["error"]
    store.close()


def test_a_write_that_reports_an_error_is_an_uncertain_outcome(fake: McpFake) -> None:
    """isError on a WRITE says nothing about side effects (servers report a failure after the
    effect the same way), so it is uncertain: the gateway stops instead of allowing a retry."""
    (wipe,) = _tools(fake, McpToolSpec("wipe", WRITE)).values()
    with (
        within_a_call("kg-4"),
        pytest.raises(OutcomeUncertain, match="wipe: Error executing tool wipe"),
    ):
        wipe.invoke({"table": "orders"}, idempotency_key="kg-4")


def test_a_read_that_reports_an_error_is_a_tool_error(fake: McpFake) -> None:
    """isError on a READ is just a failure the model sees: reading again is harmless."""
    (wipe,) = _tools(fake, McpToolSpec("wipe", READ)).values()
    with pytest.raises(ToolError, match="wipe: Error executing tool wipe"):
        wipe.invoke({"table": "orders"}, idempotency_key=None)


def test_schema_invalid_arguments_are_not_sent(fake: McpFake) -> None:
    """Arguments that break the server's schema are refused here; the server sees no call."""
    with (
        within_a_call("kg-5"),
        pytest.raises(ToolError, match=r"args\.qty: 'two' is not of type 'integer'"),
    ):
        _shop(fake)["place_order"].invoke({"sku": "A1", "qty": "two"}, idempotency_key="kg-5")
    assert fake.seen_meta == [] and fake.orders == {}


def test_an_unreachable_server_is_a_definite_failure() -> None:
    """No server: the session never opened, nothing was sent, so even a WRITE fails definitely."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    tool = McpTool(
        "place_order", server=McpServerRef(f"http://127.0.0.1:{port}/mcp"), side_effect=WRITE
    )
    with within_a_call("kg-6") as call, pytest.raises(ToolError, match="nothing was sent"):
        tool.invoke({"sku": "A1"}, idempotency_key="kg-6")
    assert not call.sent
    with pytest.raises(ToolError, match="cannot list the tools"):
        discover(McpServerRef(f"http://127.0.0.1:{port}/mcp"), [McpToolSpec("x", READ)])


def test_a_write_without_an_answer_is_an_uncertain_outcome(fake: McpFake) -> None:
    """A WRITE whose answer does not come in time may or may not have happened."""
    fake.slow_seconds = 2.0
    tool = _shop(fake, timeout=0.5)["place_order"]
    with (
        within_a_call("kg-7") as call,
        pytest.raises(OutcomeUncertain, match="may or may not have taken effect"),
    ):
        tool.invoke({"sku": "A1", "qty": 1}, idempotency_key="kg-7")
    assert call.sent
    assert fake.seen_meta[-1][KEY_META] == "kg-7"  # the call did reach the server


def test_a_tool_the_server_lacks_is_an_input_error(fake: McpFake) -> None:
    """A manifest naming a tool the server does not offer fails to build, naming the entry."""
    with pytest.raises(InputError, match=r"tools\[refund\]\.mcp\.tool: .*offers no tool 'refund'"):
        _tools(fake, McpToolSpec("refund", WRITE))


def test_read_and_write_through_the_loop_with_a_crash_and_restart(
    fake: McpFake, tmp_path: Path
) -> None:
    """Through the loop: the READ runs, the WRITE runs once with its action's key; a crash after
    the WRITE and a restart over the same SQLite file stop as outcome_unknown, and after settling
    from the server's own count the run finishes with exactly one order."""
    script = [
        {"actions": [{"tool": "get_stock", "args": {"sku": "A1"}}]},
        {"actions": [{"tool": "place_order", "args": {"sku": "A1", "qty": 20}}]},
        {"done": True, "answer": "ordered 20"},
    ]
    spec = LoopSpec("shop", "restock", "Restock A1", budget=Budget(max_iterations=10))
    path = tmp_path / "keelgate.db"

    def build() -> tuple[Loop, SQLiteStore]:
        store = SQLiteStore(path)
        tools = list(_shop(fake).values())
        return Loop(stores=Stores.of(store), model=ScriptedModel(script), tools=tools), store

    loop, store = build()
    with failpoints.armed({"after_gateway_call": 2}, mode="raise"), pytest.raises(SimulatedCrash):
        loop.run_or_resume(spec)
    store.close()

    loop, store = build()
    outcome = loop.run_or_resume(spec)
    assert outcome.stop.reason is StopReason.OUTCOME_UNKNOWN
    (unknown,) = outcome.unknown_actions
    assert fake.orders == {unknown.idempotency_key: 1}
    loop.reconcile(
        "shop",
        "restock",
        unknown.action,
        executed=fake.orders[unknown.idempotency_key] == 1,
        by="alice",
    )
    outcome = loop.run_or_resume(spec)
    assert outcome.stop.reason is StopReason.GOAL_MET, outcome.stop.message
    assert fake.orders == {unknown.idempotency_key: 1}
    stock = loop.state("shop", "restock").history[0]["actions"][0]
    assert stock["output"] == {"sku": "A1", "count": 3}
    store.close()


class ChargingMcpServer:
    """A real MCP server (the SDK's MCPServer, streamable HTTP) whose ``charge`` tool makes its
    change downstream and then fails: FastMCP-style servers turn any exception into isError."""

    def __init__(self) -> None:
        self.charges: Counter[str] = Counter()
        server = MCPServer("review-charging")
        fake = self

        @server.tool()
        async def charge(customer: str, cents: int, ctx: Context) -> dict[str, Any]:
            """Charge a customer's card."""
            meta = dict(ctx.request_context.meta or {})
            fake.charges[str(meta.get("keelgate.dev/idempotency-key", ""))] += 1
            await asyncio.sleep(0)
            # The card network accepted the charge; reading its receipt then timed out.
            raise TimeoutError("receipt lookup timed out")

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/mcp"
        config = uvicorn.Config(
            server.streamable_http_app(), log_level="warning", lifespan="on", access_log=False
        )
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._uvicorn.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def __enter__(self) -> ChargingMcpServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._uvicorn.started:
            assert time.monotonic() < deadline, "the MCP server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._uvicorn.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


def test_an_mcp_write_that_errs_after_its_side_effect_is_never_sent_again(tmp_path: Path) -> None:
    """An MCP WRITE's server charges the card, then its tool raises; the SDK answers isError.
    Keelgate cannot know nothing happened, so the model's natural retry of the same call must
    not charge the card a second time."""
    with ChargingMcpServer() as server:
        tools = discover(McpServerRef(server.url), [McpToolSpec("charge", SideEffect.WRITE)])
        call = {"tool": "charge", "args": {"customer": "c-1", "cents": 1999}}
        plans = [{"actions": [call]}, {"actions": [call]}, {"done": True}]
        stores = sqlite_stores(tmp_path / "kg.db")
        try:
            Loop(stores=stores, model=scripted(plans), tools=tools).run_or_resume(REVIEW_SPEC)
        finally:
            stores.close()
        assert sum(server.charges.values()) == 1, f"charged {dict(server.charges)}"
