"""The WRITE of bench/temporal_vs_inprocess.py: a ``python`` tool that only returns, so the
figures are Keelgate's and Temporal's, not the tool's. Imported by the bench and its worker."""

from __future__ import annotations

from typing import Any


def write(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
    return {"ok": True}
