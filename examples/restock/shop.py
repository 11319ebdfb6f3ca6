"""A tiny shop for the restock example: the downstream system the agent's tools change.

Its order book is an append-only file, fsynced, so it is the truth after any crash. It does not
deduplicate orders on its own: in the demo, Keelgate alone keeps the order from being placed twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import keelgate.testing


def _dir() -> Path:
    path = Path(os.environ.get("SHOP_DIR", ".keelgate/shop"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def orders() -> list[dict[str, Any]]:
    """Every order the shop has received, oldest first."""
    book = _dir() / "orders.jsonl"
    if not book.exists():
        return []
    return [json.loads(line) for line in book.read_text().splitlines() if line.strip()]


def get_inventory(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
    ordered = sum(o["qty"] for o in orders() if o["sku"] == args["sku"])
    return {"sku": args["sku"], "inStock": 3, "onOrder": ordered}


def place_order(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
    if int(args.get("qty", 0)) <= 0:
        raise keelgate.ToolError("qty must be positive")
    order = {"sku": args["sku"], "qty": int(args["qty"]), "idempotencyKey": idempotency_key}
    with open(_dir() / "orders.jsonl", "a") as book:
        book.write(json.dumps(order) + "\n")
        book.flush()
        os.fsync(book.fileno())
    keelgate.testing.failpoint("mid_tool")
    return {"orderId": len(orders()), "sku": order["sku"], "qty": order["qty"]}
