"""A downstream system of record that counts every change, and short scripted runs that change it.

The scenarios that prove a WRITE ran once (or never) count from outside Keelgate: ``Ledger``
records each change by idempotency key, as the real system would see it, and
``LedgerConfirmer`` is trusted code asking it whether an unknown WRITE took effect. It must
never deduplicate or settle anything on Keelgate's behalf: it only records and answers.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from keelgate.adapters.models.python import PythonModel
from keelgate.adapters.tools.python import PythonTool
from keelgate.core.protocols import Stores
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import SideEffect, UnknownAction
from keelgate.stores import open_stores

REVIEW_SPEC = LoopSpec("shop", "review", "restock A1", budget=Budget(max_iterations=6))
ROUND2_SPEC = LoopSpec("shop", "round2", "restock A1", budget=Budget(max_iterations=6))
A1_ORDER: dict[str, Any] = {"sku": "A1", "qty": 5}


def scripted(plans: Sequence[object]) -> PythonModel:
    """A model answering the n-th planning call with ``plans[n]`` and accepting every verify."""

    def answer(request: dict[str, Any]) -> Mapping[str, Any]:
        if request["phase"] == "verify":
            return {"verdict": "accept"}
        return cast(Mapping[str, Any], plans[request["call"]])

    return PythonModel(answer, name="review")


def sqlite_stores(path: Path) -> Stores:
    return open_stores(f"sqlite:///{path}")


class Ledger:
    """The downstream system of record: every change that really happened, by key."""

    def __init__(self) -> None:
        self.changes: Counter[str] = Counter()
        self.lock = threading.Lock()

    def record(self, key: str | None) -> None:
        with self.lock:
            self.changes[str(key)] += 1

    def total(self) -> int:
        with self.lock:
            return sum(self.changes.values())


class LedgerConfirmer:
    """Trusted code asking the system of record: True if the change is there, False if not."""

    name = "ledger"

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.asked = 0

    def confirm(
        self, tenant: str, run: str, action: UnknownAction, args: Mapping[str, Any]
    ) -> bool | None:
        self.asked += 1
        with self.ledger.lock:
            return self.ledger.changes[action.idempotency_key] > 0


def place_order_tool(ledger: Ledger, *, requires_approval: bool = False) -> PythonTool:
    def place(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        ledger.record(idempotency_key)
        return {"placed": args["qty"]}

    return PythonTool("place_order", place, SideEffect.WRITE, requires_approval=requires_approval)
