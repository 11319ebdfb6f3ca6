"""A worker process for the real-death crash tests: ``python -m crashkit.worker JOB``.

It builds the loop over a store URL and the downstream journal, then either runs the run once
(``run``) or drives it until it stops for good, settling unknown outcomes truthfully from the
journal (``drive``). Failpoints come only from ``KEELGATE_FAILPOINTS``, so an armed one ends this
process with ``os._exit(137)`` and nothing flushed. The last stdout line is a JSON report. It must
never catch a crash or settle an outcome by anything but what the journal says happened.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from crashkit.rig import Rig, drive, url_opener
from crashkit.scripts import RESTOCK
from crashkit.world import Journal, World
from keelgate.core import failpoints
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import ApprovalRule, Outcome
from keelgate.errors import RunBusy, StaleCheckpoint


def _report(outcome: Outcome, keys: dict[str, str]) -> dict[str, Any]:
    data = outcome.to_json()
    return {
        "stopReason": data["stopReason"],
        "unknownActions": data["unknownActions"],
        "answer": data["answer"],
        "pendingApprovals": [
            {**p, "idempotencyKey": keys.get(p["action"], "")} for p in data["pendingApprovals"]
        ],
    }


def main(argv: list[str]) -> int:
    job = json.loads(argv[0])
    if failpoints.environment_error is not None:
        print(failpoints.environment_error, file=sys.stderr)
        return 2
    required = int(job.get("required", 0))
    world = World(
        Journal(job["journal"]),
        effect=job.get("effect", "before"),
        hold=job.get("hold", ""),
        hold_tool=job.get("hold_tool", ""),
        # "required": every place_order needs that many people's approval.
        rules={"place_order": ApprovalRule(required=required)} if required else {},
    )
    spec = LoopSpec(job["tenant"], job["run"], "restock", budget=Budget(max_iterations=10))
    rig = Rig(url_opener(job["store"]), world, RESTOCK, confirm=bool(job.get("confirm")))
    settled: list[tuple[str, bool]] = []
    outcomes: list[Outcome] = []
    try:
        if job["mode"] == "run":
            outcomes = [rig.loop.run_or_resume(spec)]
        elif job["mode"] == "approve":  # one person's approval, in a process of its own
            rig.loop.approve(spec.tenant, spec.run, job["action"], approved=True, by=job["by"])
        else:
            outcomes, settled = drive(rig, spec)
        state = rig.loop.state(spec.tenant, spec.run) if outcomes else None
        keys = {a.id: a.key for a in state.plan.actions} if state and state.plan else {}
    except (RunBusy, StaleCheckpoint) as lost:
        # Another live process drives this run: this one must stop without acting.
        print(json.dumps({"outcomes": [], "settled": [], "lost": type(lost).__name__}))
        return 0
    finally:
        rig.die()
    print(json.dumps({"outcomes": [_report(o, keys) for o in outcomes], "settled": settled}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
