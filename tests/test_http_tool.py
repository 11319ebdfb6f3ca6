"""The ``http`` tool against a real shop service on loopback that counts orders by Idempotency-Key.

Why it exists: an HTTP WRITE is where "never twice" meets the network. These tests prove the key
goes downstream, that every way of not knowing (timeout, reset, 5xx after sending) stops the run
as outcome_unknown and is never retried, that only a provably unsent request or a 4xx is a
definite failure, and that through a crash and a restart the shop sees exactly one order.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from fakes.downstream import Shop
from keelgate.adapters.models.python import PythonModel
from keelgate.adapters.models.scripted import ScriptedModel
from keelgate.adapters.tools.http import HttpTool
from keelgate.core import failpoints
from keelgate.core.loop import Loop
from keelgate.core.model import Model
from keelgate.core.protocols import Stores
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import SideEffect, StopReason, UnknownAction
from keelgate.errors import InputError, OutcomeUncertain, SimulatedCrash, ToolError
from keelgate.stores.sqlite import SQLiteStore
from keelgate.testing.deadlines import within_a_call

ORDER_SCHEMA = {
    "type": "object",
    "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
    "required": ["sku", "qty"],
    "additionalProperties": False,
}
SCRIPT = [
    {"actions": [{"tool": "get_inventory", "args": {"sku": "A1"}}]},
    {"actions": [{"tool": "place_order", "args": {"sku": "A1", "qty": 20}}]},
    {"done": True, "answer": "ordered 20"},
]
SPEC = LoopSpec("shop", "restock", "Restock A1", budget=Budget(max_iterations=10))


@pytest.fixture
def shop() -> Iterator[Shop]:
    server = Shop().start()
    yield server  # type: ignore[misc]
    server.stop()


def _inventory(shop: Shop) -> HttpTool:
    return HttpTool("get_inventory", url=f"{shop.url}/items/{{sku}}", timeout_seconds=5)


def _order(
    shop: Shop, *, timeout: float = 5, side_effect: SideEffect = SideEffect.WRITE
) -> HttpTool:
    return HttpTool(
        "place_order",
        url=f"{shop.url}/orders",
        method="POST",
        side_effect=side_effect,
        input_schema=ORDER_SCHEMA,
        headers={"Authorization": "Bearer shop-secret"},
        timeout_seconds=timeout,
    )


# The tool on its own


def test_a_read_fills_the_url_from_the_arguments_escaped(shop: Shop) -> None:
    """Placeholders are URL-escaped, the JSON answer is the result, and a READ sends no key."""
    result = _inventory(shop).invoke({"sku": "A 1/x?"}, idempotency_key=None)
    assert result == {"sku": "A 1/x?", "count": 3}
    sent = shop.received[-1]
    assert sent.path == "/items/A%201%2Fx%3F"
    assert "idempotency-key" not in sent.headers


def test_a_plain_http_tool_loads_no_certificate_authorities_an_https_one_does(
    shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step pod pays for what its tools use: a tool on a plain http URL (redirects are never
    followed, so no TLS connection can follow) does not load the system's certificate
    authorities, a few tens of milliseconds of every step's CPU; its context would refuse any
    certificate. A tool on an https URL verifies as before."""
    import ssl

    loaded: list[str] = []
    real = ssl.create_default_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        loaded.append("default context")
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counting)
    assert _inventory(shop).invoke({"sku": "A1"}, idempotency_key=None) == {"sku": "A1", "count": 3}
    assert loaded == []
    plain = _inventory(shop).client._transport._pool._ssl_context  # type: ignore[attr-defined]
    assert plain.verify_mode is ssl.CERT_REQUIRED and plain.cert_store_stats()["x509_ca"] == 0
    secure = HttpTool("get_inventory", url="https://shop.example/items/{sku}", timeout_seconds=5)
    assert secure.client is not None and loaded == ["default context"]


def test_a_read_sends_the_other_arguments_as_the_query(shop: Shop) -> None:
    """For GET, arguments that are not in the URL template become the query string."""
    tool = HttpTool("get_inventory", url=f"{shop.url}/items/{{sku}}")
    tool.invoke({"sku": "A1", "warehouse": "north", "fresh": True}, idempotency_key=None)
    assert shop.received[-1].path == "/items/A1?warehouse=north&fresh=true"


def test_a_write_sends_its_key_headers_and_json_body(shop: Shop) -> None:
    """A WRITE carries Idempotency-Key, the configured headers, and the arguments as JSON."""
    with within_a_call("kg-abc"):
        result = _order(shop).invoke({"sku": "A1", "qty": 20}, idempotency_key="kg-abc")
    assert result == {"placed": True, "key": "kg-abc"}
    sent = shop.order_requests()[0]
    assert sent.headers["idempotency-key"] == "kg-abc"
    assert sent.headers["authorization"] == "Bearer shop-secret"
    assert sent.json() == {"sku": "A1", "qty": 20}


def test_a_propose_also_sends_its_key(shop: Shop) -> None:
    """PROPOSE is not free to repeat either: it carries the key too."""
    with within_a_call("kg-p"):
        _order(shop, side_effect=SideEffect.PROPOSE).invoke(
            {"sku": "A1", "qty": 1}, idempotency_key="kg-p"
        )
    assert shop.orders["kg-p"] == 1


def test_a_4xx_is_a_tool_error_with_status_and_body(shop: Shop) -> None:
    """A 4xx is definite: the model sees the status and a short body."""
    shop.mode = "reject"
    with within_a_call("kg-r"), pytest.raises(ToolError) as caught:
        _order(shop).invoke({"sku": "A1", "qty": 20}, idempotency_key="kg-r")
    assert caught.value.message == 'place_order: HTTP 422: {"error": "qty must be positive"}'
    with pytest.raises(ToolError, match="HTTP 404"):
        _inventory(shop).invoke({"sku": "missing"}, idempotency_key=None)


def test_connection_refused_is_a_definite_failure() -> None:
    """Nothing listening: nothing was sent, so even a WRITE fails definitely (not unknown)."""
    with socket.socket() as probe:  # a port that was free a moment ago and has no listener
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    tool = HttpTool(
        "place_order",
        url=f"http://127.0.0.1:{port}/orders",
        method="POST",
        side_effect=SideEffect.WRITE,
    )
    with within_a_call("kg-x") as call, pytest.raises(ToolError, match="before anything was sent"):
        tool.invoke({"sku": "A1"}, idempotency_key="kg-x")
    assert not call.sent


@pytest.mark.parametrize("mode", ["slow", "reset", "error"])
def test_not_knowing_after_a_write_was_sent_is_an_uncertain_outcome(shop: Shop, mode: str) -> None:
    """A timeout, a reset or a 5xx after the order arrived: the tool cannot know, and says so."""
    shop.mode = mode
    with (
        within_a_call("kg-u") as call,
        pytest.raises(OutcomeUncertain, match="may or may not have taken effect"),
    ):
        _order(shop, timeout=0.3).invoke({"sku": "A1", "qty": 20}, idempotency_key="kg-u")
    assert call.sent
    assert shop.orders["kg-u"] == 1  # it did arrive: guessing "not sent" would be wrong


def test_for_a_read_the_same_failures_are_plain_tool_errors(shop: Shop) -> None:
    """A READ has nothing to be unsure about: a 5xx is an error the model sees."""
    shop.mode = "error"
    tool = HttpTool("peek", url=f"{shop.url}/orders", method="POST", timeout_seconds=2)
    with pytest.raises(ToolError, match="HTTP 503"):
        tool.invoke({}, idempotency_key=None)


@pytest.mark.parametrize("mode", ["slow", "error"])
def test_a_write_whose_tool_was_edited_to_read_still_sends_its_key_and_is_unsure(
    shop: Shop, mode: str
) -> None:
    """alice's run planned place_order as a WRITE; its owner then edits the tool to READ. The
    call the plan keeps is still a WRITE (the loop gives it its key): the key goes with the
    request, so the shop and a confirmer asking it by the key know of the order, and an answer
    that never came whole is an unknown outcome, not a failure the loop could move past (the
    simulator found the order recorded "not executed" by a confirmer the shop never told)."""
    shop.mode = mode
    edited = _order(shop, timeout=0.3, side_effect=SideEffect.READ)
    with within_a_call("kg-e") as call, pytest.raises(OutcomeUncertain):
        edited.invoke({"sku": "A1", "qty": 20}, idempotency_key="kg-e")
    assert call.sent
    assert shop.order_requests()[0].headers["idempotency-key"] == "kg-e"
    assert shop.orders["kg-e"] == 1


def test_schema_invalid_arguments_send_nothing(shop: Shop) -> None:
    """Arguments that break the input schema are a tool error naming the argument; no request."""
    with within_a_call("kg-s"), pytest.raises(ToolError) as caught:
        _order(shop).invoke({"sku": "A1", "qty": 0}, idempotency_key="kg-s")
    assert "args.qty" in caught.value.message and "minimum" in caught.value.message
    with within_a_call("kg-s"), pytest.raises(ToolError, match="'qty' is a required property"):
        _order(shop).invoke({"sku": "A1"}, idempotency_key="kg-s")
    assert shop.received == []


def test_errors_never_show_header_values(shop: Shop) -> None:
    """Credentials in headers stay out of errors and reprs."""
    shop.mode = "error"
    with within_a_call("kg-h"), pytest.raises(OutcomeUncertain) as caught:
        _order(shop).invoke({"sku": "A1", "qty": 1}, idempotency_key="kg-h")
    assert "shop-secret" not in caught.value.message and "shop-secret" not in repr(_order(shop))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"url": "http://x/{sku}", "method": "FETCH"}, r"tools\[t\]\.http\.method"),
        ({"url": "/items/{sku}"}, r"tools\[t\]\.http\.url: must be an absolute"),
        ({"url": "http://x/{sku!r}"}, r"tools\[t\]\.http\.url: placeholder"),
        ({"url": "http://x/{sku"}, r"tools\[t\]\.http\.url: bad URL template"),
        ({"url": "http://x/", "input_schema": {"type": "object", "required": 3}}, "inputSchema"),
        ({"url": "http://x/", "timeout_seconds": 0}, r"tools\[t\]\.timeoutSeconds"),
        ({"url": "x/{sku}", "where": "spec.tools[3]"}, r"^spec\.tools\[3\]\.http\.url"),
    ],
)
def test_bad_tool_settings_are_input_errors_naming_the_field(
    kwargs: dict[str, Any], field: str
) -> None:
    """A bad manifest entry is refused when the tool is built, in one line naming the field."""
    with pytest.raises(InputError, match=field):
        HttpTool("t", **kwargs)


def test_without_a_schema_the_url_placeholders_are_required() -> None:
    """The derived schema tells the model which arguments the URL needs."""
    tool = HttpTool("get_inventory", url="http://127.0.0.1:9/items/{sku}")
    assert tool.input_schema["required"] == ["sku"]
    with pytest.raises(ToolError, match="'sku' is a required property"):
        tool.invoke({}, idempotency_key=None)


# Through the loop, with restarts over the same SQLite file


def _loop(path: Path, shop: Shop, model: Model, **kwargs: Any) -> tuple[Loop, Stores]:
    store = SQLiteStore(path)
    stores = Stores.of(store)
    timeout = kwargs.pop("timeout", 5)
    tools = [_inventory(shop), _order(shop, timeout=timeout)]
    return Loop(stores=stores, model=model, tools=tools, **kwargs), stores


def _downstream_count(shop: Shop, key: str) -> int:
    """What the system of record says, asked over HTTP as a person or confirmer would."""
    return int(httpx.get(f"{shop.url}/orders/{key}").json()["orders"])


class ShopConfirmer:
    """Trusted harness code: asks the shop whether the order with this key arrived."""

    name = "shop-confirmer"

    def __init__(self, shop: Shop) -> None:
        self.shop = shop

    def confirm(
        self, tenant: str, run: str, action: UnknownAction, args: Mapping[str, Any]
    ) -> bool | None:
        return _downstream_count(self.shop, action.idempotency_key) > 0


def test_a_crash_right_after_the_write_ends_in_exactly_one_order(
    shop: Shop, tmp_path: Path
) -> None:
    """Crash after the order was sent but before it was recorded; restart over the same file:
    the run stops outcome_unknown, a person settles it from the shop's own count, and the
    resumed run finishes without sending the order again."""
    path = tmp_path / "keelgate.db"
    loop, stores = _loop(path, shop, ScriptedModel(SCRIPT))
    with failpoints.armed({"after_gateway_call": 2}, mode="raise"), pytest.raises(SimulatedCrash):
        loop.run_or_resume(SPEC)
    stores.close()

    loop, stores = _loop(path, shop, ScriptedModel(SCRIPT))
    outcome = loop.run_or_resume(SPEC)
    assert outcome.stop.reason is StopReason.OUTCOME_UNKNOWN
    (unknown,) = outcome.unknown_actions
    assert unknown.tool == "place_order"
    assert len(shop.order_requests()) == 1  # the restart did not send it again

    executed = _downstream_count(shop, unknown.idempotency_key) == 1
    loop.reconcile("shop", "restock", unknown.action, executed=executed, by="alice")
    outcome = loop.run_or_resume(SPEC)
    assert outcome.stop.reason is StopReason.GOAL_MET, outcome.stop.message
    assert len(shop.order_requests()) == 1
    assert shop.orders == {unknown.idempotency_key: 1}
    stores.close()


def test_a_confirmer_that_asks_the_shop_settles_the_crash_window(
    shop: Shop, tmp_path: Path
) -> None:
    """With a confirmer that asks the shop, the restart settles the unknown order by itself and
    finishes with one order."""
    path = tmp_path / "keelgate.db"
    loop, stores = _loop(path, shop, ScriptedModel(SCRIPT))
    with failpoints.armed({"after_gateway_call": 2}, mode="raise"), pytest.raises(SimulatedCrash):
        loop.run_or_resume(SPEC)
    stores.close()
    loop, stores = _loop(path, shop, ScriptedModel(SCRIPT), confirmer=ShopConfirmer(shop))
    outcome = loop.run_or_resume(SPEC)
    assert outcome.stop.reason is StopReason.GOAL_MET, outcome.stop.message
    assert len(shop.order_requests()) == 1
    events = [e for e in loop.audit("shop", "restock") if e.type == "loop.reconciled"]
    assert [e.data["source"] for e in events] == ["confirmer"]
    stores.close()


def test_a_timeout_after_the_write_was_sent_stops_and_is_never_retried(
    shop: Shop, tmp_path: Path
) -> None:
    """A WRITE that timed out after sending stops the run outcome_unknown; resuming without a
    settlement does not send it again."""
    shop.mode = "slow"
    shop.delay = 1.0
    path = tmp_path / "keelgate.db"
    loop, stores = _loop(path, shop, ScriptedModel(SCRIPT), timeout=0.3)
    outcome = loop.run_or_resume(SPEC)
    assert outcome.stop.reason is StopReason.OUTCOME_UNKNOWN and outcome.resumable
    again = loop.run_or_resume(SPEC)
    assert again.stop.reason is StopReason.OUTCOME_UNKNOWN
    assert len(shop.order_requests()) == 1
    stores.close()


def test_schema_invalid_arguments_reach_the_model_as_a_tool_error(
    shop: Shop, tmp_path: Path
) -> None:
    """The model's bad arguments are refused before sending; the model sees why and can fix
    them; the shop gets exactly the corrected order."""
    seen: list[dict[str, Any]] = []

    def model(request: dict[str, Any]) -> dict[str, Any]:
        seen.append(request)
        if request["phase"] == "verify":
            return {"verdict": "accept"}
        return [
            {"actions": [{"tool": "place_order", "args": {"sku": "A1", "qty": "lots"}}]},
            {"actions": [{"tool": "place_order", "args": {"sku": "A1", "qty": 20}}]},
            {"done": True, "answer": "ordered"},
        ][request["call"]]

    loop, stores = _loop(tmp_path / "keelgate.db", shop, PythonModel(model))
    outcome = loop.run_or_resume(SPEC)
    assert outcome.stop.reason is StopReason.GOAL_MET
    second_plan = [r for r in seen if r["phase"] == "plan"][1]
    first = second_plan["history"][0]["actions"][0]
    assert first["status"] == "error"
    assert "args.qty: 'lots' is not of type 'integer'" in first["error"]
    assert [json.loads(r.body) for r in shop.order_requests()] == [{"sku": "A1", "qty": 20}]
    stores.close()
