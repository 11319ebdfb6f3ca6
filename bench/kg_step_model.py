"""The model and the WRITE of bench/step_start.py, imported by the ``keelgate step`` processes
it starts (``python`` provider and tool, so the figures hold no SDK and no network).

With ``KG_STEP_MARK`` set, the model's first call is the end of the measured start-up: it writes
``time.monotonic_ns()`` (the clock every process on the machine shares) to that file and ends
the process at once, before any plan is saved, so the run is left as it was and the next start
meets the same checkpoint. Without it, the model plans one WRITE, then says the goal is met:
what the bench uses to prepare its runs. It must never do anything else.
"""

from __future__ import annotations

import os
import time
from typing import Any


def plan(request: dict[str, Any]) -> dict[str, Any]:
    mark = os.environ.get("KG_STEP_MARK")
    if mark:
        with open(mark, "w", encoding="utf-8") as out:
            out.write(str(time.monotonic_ns()))
        os._exit(0)  # nothing after the checkpoint read is part of the start-up measured
    if request["phase"] == "verify":
        return {"verdict": "accept"}
    if not request["history"]:
        return {"actions": [{"tool": "write", "args": {"n": 1}}]}
    return {"done": True, "answer": "done"}


def write(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
    return {"ok": True}
