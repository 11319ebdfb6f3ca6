"""A tool's output the checkpoint cannot hold as given: a NaN from an HTTP service, a datetime from
a python WRITE.

Why it exists: every result is saved and may be replayed, so it must be JSON a store can hold. An
output that is not is made so (NaN becomes null, a datetime its text): the run goes on, and a
WRITE that succeeded is recorded as succeeded, never left for a person to reconcile. The tests
use a real HTTP server on loopback and real SQLite files.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from fakes.loopback import Answer, LoopbackServer, Received
from keelgate.adapters.tools.http import HttpTool
from keelgate.adapters.tools.python import PythonTool
from keelgate.core.loop import Loop
from keelgate.core.protocols import Tool
from keelgate.core.types import SideEffect, StopReason
from support.ledger import A1_ORDER, REVIEW_SPEC, Ledger, scripted, sqlite_stores


class NanService(LoopbackServer):
    """A Python service that answers with ``json.dumps`` defaults: NaN is written as ``NaN``."""

    def respond(self, received: Received) -> Answer:
        return Answer(body={"sku": "A1", "fill_ratio": float("nan")})


@pytest.fixture
def nan_service() -> Iterator[NanService]:
    service = NanService().start()
    assert isinstance(service, NanService)
    yield service
    service.stop()


def test_a_nan_in_a_read_output_does_not_wedge_the_run(
    tmp_path: Path, nan_service: NanService
) -> None:
    """An HTTP READ answers ``{"fill_ratio": NaN}`` (what Python's json module writes). The run
    must go on (or stop with a reason), not raise a traceback at every resume."""
    stats = HttpTool("stats", url=f"{nan_service.url}/stats/A1")
    plans = [{"actions": [{"tool": "stats", "args": {}}]}, {"done": True, "answer": "ok"}]
    stores = sqlite_stores(tmp_path / "kg.db")
    try:
        loop = Loop(stores=stores, model=scripted(plans), tools=[stats])
        outcome = loop.run_or_resume(REVIEW_SPEC)
        assert outcome.stop.reason is StopReason.GOAL_MET
    finally:
        stats.close()
        stores.close()


def test_a_write_whose_output_is_not_json_is_recorded_not_raised(tmp_path: Path) -> None:
    """A python WRITE returns a ``datetime`` (the order's timestamp). The order was placed and
    Keelgate saw it succeed: no traceback, and no person should have to reconcile it."""
    db = tmp_path / "kg.db"
    ledger = Ledger()

    def place(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        ledger.record(idempotency_key)
        return {"placed_at": datetime.datetime(2026, 10, 5, 12, 0, tzinfo=datetime.UTC)}

    tools: list[Tool] = [PythonTool("place_order", place, SideEffect.WRITE)]
    plans = [{"actions": [{"tool": "place_order", "args": A1_ORDER}]}, {"done": True}]
    stores = sqlite_stores(db)
    try:
        Loop(stores=stores, model=scripted(plans), tools=tools).run_or_resume(REVIEW_SPEC)
    finally:
        stores.close()
    stores = sqlite_stores(db)
    try:
        outcome = Loop(stores=stores, model=scripted(plans), tools=tools).run_or_resume(REVIEW_SPEC)
        assert outcome.stop.reason is StopReason.GOAL_MET
        assert ledger.total() == 1
    finally:
        stores.close()
