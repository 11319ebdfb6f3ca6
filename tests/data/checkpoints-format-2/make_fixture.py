"""Writes checkpoints of format 2 as the code before derived serialisation stored them.

Why it exists: the core's values lost their hand-written ``to_json`` for one definition per
shape (``keelgate.core.json_codec``); what a store holds must not change by a byte for it. The
files here are checkpoint texts a SQLite store held after runs that stopped in every way a
checkpoint can show (awaiting approval, an unknown outcome, a dollar budget, goal met after a
denial and a rejection, an outbox of events for stores that cannot commit them together);
``tests/test_json_codec.py`` reads each with today's code and writes it back byte for byte. Run it
only with that code on the path (the parent of the commit that added this folder, the last with
hand-written JSON), never with today's (the fixture would then prove nothing)::

    added=$(git log --diff-filter=A --format=%H -- tests/data/checkpoints-format-2/make_fixture.py)
    git worktree add /tmp/kg-prev "$added^"
    PYTHONPATH=/tmp/kg-prev/operator .venv/bin/python \\
        tests/data/checkpoints-format-2/make_fixture.py

It writes one ``<run>.json`` per run: the ``state`` column of ``keelgate_checkpoints``, as is.
"""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

from keelgate.adapters.models.python import PythonModel
from keelgate.adapters.tools.python import PythonTool
from keelgate.core.loop import Loop
from keelgate.core.protocols import Capabilities, Stores
from keelgate.core.spec import Budget, LoopSpec, Price
from keelgate.core.types import LoopKind, SideEffect
from keelgate.errors import OutcomeUncertain
from keelgate.stores.sqlite import SQLiteStore

HERE = Path(__file__).resolve().parent
ORDER = {"sku": "A1", "qty": 20, "note": "gate code 4417"}
MANIFEST = {"goal": "restock", "model": {"provider": "python", "callable": "shop:model"}}


def model(script: list[Mapping[str, Any]]) -> PythonModel:
    def answer(request: dict[str, Any]) -> Mapping[str, Any]:
        entry = script[min(request["call"], len(script) - 1)]
        if request["phase"] == "verify":
            return {"verdict": entry.get("verdict", "accept"), "reason": entry.get("reason", "")}
        return entry

    return PythonModel(answer, name="shop-model")


def look(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
    return {"sku": args["sku"], "inStock": 3, "log": "x" * 5000}  # above the history's cap


def order(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
    return {"ordered": args["qty"], "total": 12.5}


def uncertain(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
    raise OutcomeUncertain("no answer within 30s")


READ = {"tool": "look", "args": {"sku": "A1"}}
WRITE = {"tool": "order", "args": ORDER}
USAGE = {"inputTokens": 1200, "outputTokens": 345}


def runs(directory: Path) -> None:
    store = SQLiteStore(directory / "keelgate.db")
    joint = Stores.of(store)
    apart = Stores(store, store, store, None, Capabilities())  # events ride in the outbox
    gated = [
        PythonTool("look", look),
        PythonTool("order", order, SideEffect.WRITE, requires_approval=True),
    ]
    try:
        Loop(
            stores=joint,
            model=model([{"actions": [READ], "usage": USAGE}, {"actions": [WRITE]}]),
            tools=gated,
        ).run_or_resume(
            LoopSpec(
                "shop",
                "approval",
                "restock A1",
                budget=Budget(max_iterations=5, timeout_seconds=60),
                manifest=MANIFEST,
                source_dir="/srv/shop",
            )
        )
        Loop(
            stores=joint,
            model=model([{"actions": [WRITE]}]),
            tools=[PythonTool("order", uncertain, SideEffect.WRITE)],
        ).run_or_resume(LoopSpec("shop", "unknown", "restock A1"))
        Loop(
            stores=joint,
            model=model(
                [{"actions": [READ], "usage": {"inputTokens": 0, "outputTokens": 300_000}}]
            ),
            tools=gated,
            pricing={"shop-model": Price(Decimal("1.25"), Decimal("10"))},
        ).run_or_resume(
            LoopSpec("shop", "dollars", "restock A1", budget=Budget(dollars=Decimal("2.50")))
        )
        denied = Loop(
            stores=apart,
            model=model(
                [
                    {"actions": [READ], "verdict": "reject", "reason": "check the order too"},
                    {"actions": [WRITE]},
                    {"done": True, "answer": "A1 restocked, order denied"},
                ]
            ),
            tools=gated,
        )
        spec = LoopSpec(
            "shop",
            "done",
            "restock A1",
            kind=LoopKind.TASK,
            allowed_side_effects=frozenset({SideEffect.WRITE, SideEffect.READ}),
            budget=Budget(tokens=1_000_000, timeout_seconds=90.5, max_verifier_rejections=None),
        )
        denied.run_or_resume(spec)
        denied.approve("shop", "done", "2:0", approved=False, by="alice")
        denied.run_or_resume(spec)
    finally:
        store.close()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        runs(Path(tmp))
        with sqlite3.connect(Path(tmp) / "keelgate.db") as db:
            for run, text in db.execute("SELECT run, state FROM keelgate_checkpoints"):
                (HERE / f"{run}.json").write_text(text, encoding="utf-8")
                print(f"wrote {run}.json ({len(text)} bytes)")


if __name__ == "__main__":
    main()
