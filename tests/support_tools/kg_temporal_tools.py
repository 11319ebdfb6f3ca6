"""A model, a WRITE and a confirmer for tests/test_temporal.py, named in manifests as
``kg_temporal_tools:...`` and loaded by separate worker processes.

Everything that happens is appended to the JSON-lines journal named by KG_TEMPORAL_LEDGER, one
``write`` per line and fsynced before the tool goes on, so a test counts from outside every
model call and every order placed, across ``os._exit(137)`` deaths of the workers. The order's
effect lands before the ``mid_tool`` failpoint, so a death there leaves it done. Nothing here
deduplicates by idempotency key: if Keelgate ordered twice, the journal says two.
"""

from __future__ import annotations

import json
import os
from typing import Any

from keelgate.testing import failpoint


def _record(kind: str, **fields: Any) -> None:
    line = (json.dumps({"kind": kind, **fields}, sort_keys=True) + "\n").encode()
    fd = os.open(os.environ["KG_TEMPORAL_LEDGER"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def entries(path: str, kind: str | None = None) -> list[dict[str, Any]]:
    """The journal's rows (of one kind)."""
    try:
        with open(path, encoding="utf-8") as ledger:
            rows = [json.loads(line) for line in ledger if line.strip()]
    except FileNotFoundError:
        return []
    return [row for row in rows if kind is None or row["kind"] == kind]


def model(request: dict[str, Any]) -> dict[str, Any]:
    """Answers planning call N with entry N of the JSON script in KG_TEMPORAL_SCRIPT; accepts
    every verification. An entry ``{"fail": why}`` makes the call raise (a failed stop)."""
    _record("model", phase=request["phase"], call=request["call"], pid=os.getpid())
    if request["phase"] == "verify":
        return {"verdict": "accept"}
    script = json.loads(os.environ["KG_TEMPORAL_SCRIPT"])
    entry = dict(script[request["call"]])
    if "fail" in entry:
        raise RuntimeError(entry["fail"])
    return entry


def place_order(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
    """The WRITE: the order lands downstream, then the ``mid_tool`` window."""
    _record("order", key=idempotency_key, sku=args.get("sku"), pid=os.getpid())
    failpoint("mid_tool")
    return {"order": f"o-{args.get('sku')}"}


class LedgerConfirmer:
    """Trusted harness code asking the system of record (the journal) whether a WRITE landed."""

    name = "ledger"

    def confirm(self, tenant: str, run: str, action: Any, args: Any) -> bool | None:
        placed = [
            row
            for row in entries(os.environ["KG_TEMPORAL_LEDGER"], "order")
            if row["key"] == action.idempotency_key
        ]
        return len(placed) == 1


def ledger() -> LedgerConfirmer:
    """The confirmer as ``--confirmer kg_temporal_tools:ledger`` names it (a factory)."""
    return LedgerConfirmer()
