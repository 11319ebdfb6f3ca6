"""Tools and a model for tests/test_runner.py, named in manifests as ``kg_runner_tools:...``.

Every call is appended as one JSON line to the file named by KG_RUNNER_LEDGER, so a test can
count what really ran (and with which idempotency key) from outside the loop.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def _record(entry: dict[str, Any]) -> None:
    with open(os.environ["KG_RUNNER_LEDGER"], "a", encoding="utf-8") as ledger:
        ledger.write(json.dumps(entry, sort_keys=True) + "\n")


def get_inventory(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
    _record({"tool": "get_inventory", "args": args, "key": idempotency_key})
    return {"sku": args["sku"], "count": 3}


def place_order(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
    _record({"tool": "place_order", "args": args, "key": idempotency_key})
    return {"order": f"o-{args['sku']}-{args['qty']}"}


def lost_write(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
    """A WRITE whose connection drops after sending: nobody knows whether it took effect."""
    _record({"tool": "lost_write", "args": args, "key": idempotency_key})
    raise ConnectionResetError("connection reset after the request was sent")


def no_key(args: dict[str, Any]) -> dict[str, Any]:
    """Wrong signature: cannot take the idempotency key."""
    return args


def planner(request: dict[str, Any]) -> dict[str, Any]:
    """A python-provider model: records each request, checks stock, then orders, then stops."""
    _record({"model": request})
    if request["phase"] == "verify":
        return {"verdict": "accept", "usage": {"inputTokens": 5, "outputTokens": 1}}
    done = [h for h in request["history"] if "actions" in h]
    if not done:
        return {"actions": [{"tool": "get_inventory", "args": {"sku": "A1"}}]}
    if len(done) == 1:
        return {
            "actions": [{"tool": "place_order", "args": {"sku": "A1", "qty": 7}}],
            "usage": {"inputTokens": 50, "outputTokens": 10},
        }
    return {"done": True, "answer": "ordered 7"}


def slow_pay(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
    """A WRITE that blocks until the file named by KG_PAY_GATE exists (at most 30 s), then
    pays: it passes any short timeout and keeps running in its worker thread."""
    gate = os.environ["KG_PAY_GATE"]
    for _ in range(3000):
        if os.path.exists(gate):
            break
        time.sleep(0.01)
    _record({"tool": "pay", "args": args, "key": idempotency_key})
    return {"paid": args["amount"]}


def careful_pay(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
    """A WRITE that sends itself, as a careful tool does: it says it is about to send (the file
    KG_PAY_READY), waits for KG_PAY_GATE (a held-up process: the test stops it here), then
    checks its write deadline right before it pays (``keelgate.write_deadline()``)."""
    import keelgate

    Path(os.environ["KG_PAY_READY"]).write_text(str(os.getpid()))
    gate = os.environ["KG_PAY_GATE"]
    for _ in range(6000):
        if os.path.exists(gate):
            break
        time.sleep(0.01)
    deadline = keelgate.write_deadline()
    assert deadline is not None, "a WRITE always runs under a deadline"
    deadline.check()  # raises DeadlinePassed: nothing is sent
    _record({"tool": "pay", "args": args, "key": idempotency_key})
    return {"paid": args["amount"]}


def composite_pay(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
    """A WRITE of two requests through Keelgate's HTTP tool: charge the card, then send the
    receipt, at the payment service KG_PAYMENTS_URL. The ``mid_tool`` failpoint lies between
    the two."""
    from keelgate.adapters.tools.http import HttpTool
    from keelgate.core.types import SideEffect
    from keelgate.testing import failpoint

    base = os.environ["KG_PAYMENTS_URL"]
    for path in ("charge", "notify"):
        tool = HttpTool(path, url=f"{base}/{path}", method="POST", side_effect=SideEffect.WRITE)
        tool.invoke(args, idempotency_key=idempotency_key)
        if path == "charge":
            failpoint("mid_tool")
    return {"paid": args["cents"]}
