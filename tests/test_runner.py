"""The in-process runner over real SQLite files: manifests in, outcomes and side effects out.

Tools and the python model live in ``tests/support_tools/kg_runner_tools.py``; every call they
receive is appended to a ledger file, so the tests count what really ran. The HTTP test talks to a
real server on 127.0.0.1.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from keelgate.core.audit import verify
from keelgate.core.loop import Loop
from keelgate.core.protocols import LoopRunner
from keelgate.core.spec import LoopSpec, Price
from keelgate.core.types import RunPhase, StopReason
from keelgate.errors import InputError
from keelgate.manifest import load_agentrun
from keelgate.runners import LocalRunner, build_loop
from keelgate.stores import open_stores
from keelgate.testing.deadlines import pass_deadlines

DATA = Path(__file__).parent / "data"
SUPPORT = Path(__file__).parent / "support_tools"


@dataclass(frozen=True)
class Ledger:
    path: Path

    def entries(self) -> list[dict[str, Any]]:
        lines = self.path.read_text().splitlines()
        return [json.loads(line) for line in lines if line]

    def calls(self, tool: str) -> list[dict[str, Any]]:
        return [e for e in self.entries() if e.get("tool") == tool]

    def requests(self) -> list[dict[str, Any]]:
        return [e["model"] for e in self.entries() if "model" in e]


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    monkeypatch.syspath_prepend(str(SUPPORT))
    path = tmp_path / "ledger.jsonl"
    path.touch()
    monkeypatch.setenv("KG_RUNNER_LEDGER", str(path))
    return Ledger(path)


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/keelgate.db"


def manifest(name: str, **changes: Any) -> str:
    """A manifest from tests/data, with top-level spec fields replaced."""
    data = yaml.safe_load((DATA / name).read_text())
    data["spec"].update(changes)
    return yaml.safe_dump(data, sort_keys=False)


def spec_of(text_or_file: str | Path) -> LoopSpec:
    return load_agentrun(text_or_file).to_loop_spec()


def history(store: str, tenant: str, run: str) -> list[dict[str, Any]]:
    stores = open_stores(store)
    try:
        return [dict(h) for h in Loop(stores=stores).state(tenant, run).history]
    finally:
        stores.close()


def test_a_scripted_manifest_with_python_tools_runs_to_goal_met(ledger: Ledger, store: str) -> None:
    """A manifest with a scripted model and python tools reaches goal_met on a SQLite file; the
    WRITE ran once with its idempotency key, dollars follow spec.pricing exactly, and running the
    same manifest again runs nothing twice."""
    runner: LoopRunner = LocalRunner(store=store)
    spec = spec_of(DATA / "runner-task.yaml")
    outcome = runner.run(spec)
    assert (outcome.stop.reason, outcome.phase) == (StopReason.GOAL_MET, RunPhase.SUCCEEDED)
    assert (outcome.run, outcome.tenant, outcome.answer) == ("restock", "shop", "ordered 20")
    assert outcome.iteration == 3
    assert [c["args"] for c in ledger.calls("get_inventory")] == [{"sku": "A1"}]
    orders = ledger.calls("place_order")
    assert [o["args"] for o in orders] == [{"sku": "A1", "qty": 20}]
    assert orders[0]["key"].startswith("kg-")
    # 4000 input and 600 output tokens at $0.40 and $1.60 per million.
    assert outcome.usage.dollars == Decimal("0.00256")

    again = LocalRunner(store=store).run(spec)
    assert again.stop.reason is StopReason.GOAL_MET
    assert len(ledger.entries()) == 2
    stores = open_stores(store)
    try:
        events = Loop(stores=stores).audit("shop", "restock")
        assert verify("shop", "restock", events).ok
        assert [r.run for r in stores.checkpoints.runs("shop")] == ["restock"]
    finally:
        stores.close()


def test_a_verification_loop_refuses_a_write_and_the_tool_never_runs(
    ledger: Ledger, store: str
) -> None:
    """A verification loop whose script asks for a WRITE gets side_effect_not_permitted for it;
    the READ beside it runs, the WRITE's function is never called."""
    outcome = LocalRunner(store=store).run(spec_of(DATA / "runner-verification.yaml"))
    assert outcome.stop.reason is StopReason.GOAL_MET
    assert len(ledger.calls("get_inventory")) == 1
    assert ledger.calls("place_order") == []
    seen = history(store, "shop", "audit-stock")[0]["actions"]
    refused = next(a for a in seen if a["tool"] == "place_order")
    assert refused["status"] == "refused"
    assert refused["error"].startswith("side_effect_not_permitted")


def test_each_monitor_tick_is_its_own_run_with_its_own_checkpoint(
    ledger: Ledger, store: str
) -> None:
    """A monitor produces runs <name>.tick-1, .tick-2 ...: each with its own checkpoint and audit
    chain; resuming a tick by name continues that tick and starts no new one."""
    spec = spec_of(DATA / "runner-monitor.yaml")
    runner = LocalRunner(store=store)
    first = runner.tick(spec)
    second = runner.tick(spec)
    third = runner.run(spec)  # run() on the monitor itself runs its next tick
    assert [o.run for o in (first, second, third)] == [
        "stock-watch.tick-1",
        "stock-watch.tick-2",
        "stock-watch.tick-3",
    ]
    assert all(o.stop.reason is StopReason.GOAL_MET and o.iteration == 2 for o in (first, third))
    assert len(ledger.calls("get_inventory")) == 3

    stores = open_stores(store)
    try:
        refs = stores.checkpoints.runs("shop")
        assert sorted(r.run for r in refs) == [o.run for o in (first, second, third)]
        for ref in refs:
            checkpoint = stores.checkpoints.load("shop", ref.run)
            assert checkpoint is not None and checkpoint.state["run"] == ref.run
            events = stores.audit.events("shop", ref.run)
            assert events[0].type == "loop.started"
            assert verify("shop", ref.run, events).ok
    finally:
        stores.close()

    resumed = runner.run(replace(spec, run="stock-watch.tick-1"))
    assert (resumed.run, resumed.stop.reason) == ("stock-watch.tick-1", StopReason.GOAL_MET)
    assert len(ledger.calls("get_inventory")) == 3


def test_a_tick_with_an_unknown_write_is_finished_before_a_new_tick_starts(
    ledger: Ledger, store: str
) -> None:
    """While a tick's WRITE has an unknown outcome, ticking again starts no new tick (a new tick
    could repeat the WRITE); once reconciled, the same tick finishes, then tick 2 starts."""
    text = manifest(
        "runner-monitor.yaml",
        allowedSideEffects=["READ", "WRITE"],
        tools=[
            {
                "name": "restock",
                "sideEffect": "WRITE",
                "python": {"callable": "kg_runner_tools:lost_write"},
            }
        ],
        model={
            "provider": "scripted",
            "script": [
                {"actions": [{"tool": "restock", "args": {"sku": "A1", "qty": 5}}]},
                {"done": True, "answer": "restocked"},
            ],
        },
    )
    spec = spec_of(text)
    runner = LocalRunner(store=store)
    first = runner.tick(spec)
    assert (first.run, first.stop.reason) == ("stock-watch.tick-1", StopReason.OUTCOME_UNKNOWN)
    again = runner.tick(spec)
    assert (again.run, again.stop.reason) == ("stock-watch.tick-1", StopReason.OUTCOME_UNKNOWN)
    assert len(ledger.calls("lost_write")) == 1

    stores = open_stores(store)
    try:
        assert [r.run for r in stores.checkpoints.runs("shop")] == ["stock-watch.tick-1"]
        pass_deadlines(stores)  # "not executed" waits for the call's write deadline
        Loop(stores=stores).reconcile(
            "shop", "stock-watch.tick-1", "1:0", executed=False, by="alice"
        )
    finally:
        stores.close()
    finished = runner.tick(spec)
    assert (finished.run, finished.stop.reason) == ("stock-watch.tick-1", StopReason.GOAL_MET)
    assert len(ledger.calls("lost_write")) == 1

    fresh = runner.tick(spec)
    assert fresh.run == "stock-watch.tick-2"
    keys = [c["key"] for c in ledger.calls("lost_write")]
    assert len(keys) == 2 and keys[0] != keys[1]


def test_the_python_model_receives_phase_goal_iteration_history_and_tools(
    ledger: Ledger, store: str
) -> None:
    """provider python: the callable gets phase, goal, iteration, history and tools; its answers
    drive the run and the usage it reports is counted."""
    outcome = LocalRunner(store=store).run(spec_of(DATA / "runner-python-model.yaml"))
    assert (outcome.stop.reason, outcome.answer) == (StopReason.GOAL_MET, "ordered 7")
    assert (outcome.tenant, outcome.iteration) == ("default", 3)
    requests = ledger.requests()
    plans = [r for r in requests if r["phase"] == "plan"]
    verifies = [r for r in requests if r["phase"] == "verify"]
    assert [p["iteration"] for p in plans] == [1, 2, 3]
    assert [v["iteration"] for v in verifies] == [1, 2, 3]
    first = plans[0]
    assert first["goal"] == "Restock SKU A1"
    assert first["history"] == []
    assert first["tools"] == [
        {
            "name": "get_inventory",
            "description": "How many of a SKU are left",
            "sideEffect": "READ",
            "inputSchema": {
                "type": "object",
                "properties": {"sku": {"type": "string"}},
                "required": ["sku"],
            },
        },
        {
            "name": "place_order",
            "description": "",
            "sideEffect": "WRITE",
            "inputSchema": {"type": "object"},
        },
    ]
    seen = plans[1]["history"][0]["actions"][0]
    assert (seen["tool"], seen["status"], seen["output"]) == (
        "get_inventory",
        "ok",
        {"sku": "A1", "count": 3},
    )
    assert [c["args"] for c in ledger.calls("place_order")] == [{"sku": "A1", "qty": 7}]
    assert (outcome.usage.input_tokens, outcome.usage.output_tokens) == (50 + 3 * 5, 10 + 3 * 1)


def test_arguments_that_fail_the_input_schema_never_reach_the_tool(
    ledger: Ledger, store: str
) -> None:
    """A planned WRITE whose arguments fail its inputSchema is a tool error the model sees; the
    function is never called."""
    text = manifest(
        "runner-task.yaml",
        model={
            "provider": "scripted",
            "name": "demo",
            "script": [
                {"actions": [{"tool": "place_order", "args": {"sku": "A1", "qty": "many"}}]},
                {"done": True, "answer": "gave up"},
            ],
        },
    )
    outcome = LocalRunner(store=store).run(spec_of(text))
    assert outcome.stop.reason is StopReason.GOAL_MET
    assert ledger.calls("place_order") == []
    seen = history(store, "shop", "restock")[0]["actions"][0]
    assert seen["status"] == "error"
    assert "qty" in seen["error"]


def test_a_dollar_budget_without_prices_stops_before_any_model_call(
    ledger: Ledger, store: str
) -> None:
    """Without spec.pricing a dollar budget cannot be metered: cost_unknown, nothing runs."""
    data = yaml.safe_load((DATA / "runner-task.yaml").read_text())
    del data["spec"]["pricing"]
    outcome = LocalRunner(store=store).run(spec_of(yaml.safe_dump(data)))
    assert outcome.stop.reason is StopReason.COST_UNKNOWN
    assert outcome.resumable
    assert ledger.entries() == []


def test_the_built_loop_carries_prices_and_the_output_cap(ledger: Ledger, store: str) -> None:
    """spec.pricing is booked under the model's name, and maxOutputTokens caps each call."""
    spec = spec_of(DATA / "runner-task.yaml")
    stores = open_stores(store)
    try:
        loop = build_loop(spec, stores)
    finally:
        stores.close()
    assert loop.max_output_tokens == 256
    assert loop.price_model == "demo"
    assert loop.pricing == {"demo": Price(Decimal("0.40"), Decimal("1.60"))}


@pytest.mark.parametrize(
    ("path", "value", "field", "words"),
    [
        (
            ["tools", 0, "python", "callable"],
            "kg_no_such_module:get",
            "spec.tools[0].python.callable",
            "cannot import 'kg_no_such_module'",
        ),
        (
            ["tools", 1, "python", "callable"],
            "kg_runner_tools:no_key",
            "spec.tools[1].python.callable",
            "must be callable as fn(args: dict, *, idempotency_key: str | None)",
        ),
        (
            ["tools", 1, "python", "callable"],
            "kg_runner_tools:missing",
            "spec.tools[1].python.callable",
            "has no attribute 'missing'",
        ),
        (["suspend"], True, "spec.suspend", "the run is suspended"),
        (
            ["tools", 1, "http"],
            {"url": "http://127.0.0.1:9/orders", "method": "POST", "body": {"a": 1}},
            "spec.tools[1].http.body",
            "not supported yet",
        ),
    ],
)
def test_bad_input_is_refused_before_any_store_is_opened(
    ledger: Ledger, tmp_path: Path, store: str, path: list[Any], value: Any, field: str, words: str
) -> None:
    """A manifest that cannot be built fails with one line naming the field, and the store file
    is never created: bad input cannot touch saved state."""
    data = yaml.safe_load((DATA / "runner-task.yaml").read_text())
    target = data["spec"]
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    if path[-1] == "http":
        del target["python"]
    spec = spec_of(yaml.safe_dump(data))
    with pytest.raises(InputError) as caught:
        LocalRunner(store=store).run(spec)
    assert caught.value.field == field
    assert words in caught.value.reason
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "keelgate.db").exists()
    assert ledger.entries() == []


class _Shop(BaseHTTPRequestHandler):
    """A downstream inventory and order service that remembers every request it served."""

    seen: list[dict[str, Any]]

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.seen.append({"method": "GET", "path": self.path, "key": None, "body": None})
        self._answer(200, {"sku": self.path.rsplit("/", 1)[-1], "count": 3})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"null")
        key = self.headers.get("Idempotency-Key")
        self.seen.append({"method": "POST", "path": self.path, "key": key, "body": body})
        self._answer(201, {"order": "o-1"})

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def shop() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []
    handler = type("Shop", (_Shop,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_http_tools_from_the_manifest_call_a_real_service(
    ledger: Ledger, store: str, shop: tuple[str, list[dict[str, Any]]]
) -> None:
    """http tools are built from the manifest: the READ is a GET with the SKU in the URL, the
    WRITE a POST of the arguments carrying Idempotency-Key; a second run sends nothing."""
    base, seen = shop
    data = yaml.safe_load((DATA / "runner-task.yaml").read_text())
    tools = data["spec"]["tools"]
    del tools[0]["python"], tools[1]["python"]
    tools[0]["http"] = {"url": base + "/items/{sku}", "method": "GET"}
    tools[1]["http"] = {"url": base + "/orders", "method": "POST"}
    spec = spec_of(yaml.safe_dump(data))
    outcome = LocalRunner(store=store).run(spec)
    assert outcome.stop.reason is StopReason.GOAL_MET
    assert [(s["method"], s["path"]) for s in seen] == [("GET", "/items/A1"), ("POST", "/orders")]
    post = seen[1]
    assert post["body"] == {"sku": "A1", "qty": 20}
    assert post["key"] is not None and post["key"].startswith("kg-")
    assert LocalRunner(store=store).run(spec).stop.reason is StopReason.GOAL_MET
    assert len(seen) == 2


def test_the_store_password_is_never_saved_or_logged(
    pg_url: str, ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    """The store URL is the runner's setting, not part of the run: a password in it never lands
    in a checkpoint, a recorded spec, the audit chain or a log line (the test server trusts
    loopback, so any password connects)."""
    secret = "Pw-never-stored-7Q"
    user, host = pg_url.split("://", 1)[1].split("@", 1)
    url = f"postgresql://{user}:{secret}@{host}"
    caplog.set_level("DEBUG")
    outcome = LocalRunner(store=url).run(spec_of(DATA / "runner-task.yaml"))
    assert outcome.stop.reason is StopReason.GOAL_MET
    with psycopg.connect(pg_url) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE 'keelgate_%'"
            ).fetchall()
        ]
        dumped = "".join(
            str(conn.execute(f"SELECT * FROM {table}").fetchall())  # our own table names
            for table in tables
        )
    assert "keelgate_checkpoints" in tables and dumped
    assert secret not in dumped
    assert secret not in caplog.text
