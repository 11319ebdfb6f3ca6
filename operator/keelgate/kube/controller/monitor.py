"""The monitor reconciler: a monitor's AgentRun schedules ticks and runs nothing itself.

At each due time of ``spec.schedule`` (cron, UTC) it creates a child AgentRun ``<name>.tick-<n>``,
owned by the monitor, with the monitor's spec; each tick is then driven like any run. A tick
still running or waiting for a person holds the next one back (that schedule is skipped, and the
monitor's message says so), so a fresh tick never repeats a WRITE whose outcome is unknown.
Finished ticks are kept as a CronJob keeps Jobs (the store keeps every tick's trail). This module
must never create two ticks for one due time (names are numbered from the newest tick known).
"""

from __future__ import annotations

import datetime as dt

from keelgate.core.monitor import next_due, tick_number, tick_run_name
from keelgate.core.types import StopReason
from keelgate.kube import resources
from keelgate.kube.api_failures import Conflict
from keelgate.kube.controller.context import ControllerContext
from keelgate.kube.controller.outcomes import REST, Requeue, Result
from keelgate.kube.controller.ports import JSON
from keelgate.kube.controller.run_status import RunStatusWriter
from keelgate.kube.naming import MONITOR_LABEL, label_value
from keelgate.kube.status import condition
from keelgate.kube.times import iso, now, parse_time
from keelgate.manifest import AgentRunSpec

# A tick stopped here waits for a person: the monitor holds its next tick back.
_WAITING = frozenset({StopReason.OUTCOME_UNKNOWN.value, StopReason.AWAITING_APPROVAL.value})


class MonitorReconciler:
    def __init__(self, context: ControllerContext) -> None:
        self._context = context
        self._status = RunStatusWriter(context)

    def reconcile(self, run: JSON, spec: AgentRunSpec) -> Result:
        """Create the tick that is due (unless the latest holds it back), trim the finished
        ticks, write the monitor's status; look again at the next due time."""
        context = self._context
        meta = run["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        current = run.get("status") or {}
        ticks = self._ticks(run)
        self._trim_history(spec, namespace, ticks)
        latest_number = max(
            [tick_number(name, str(current.get("lastTick", ""))) or 0, *(n for n, _ in ticks)]
        )
        latest = ticks[-1][1] if ticks and ticks[-1][0] == latest_number else None
        last = parse_time(current.get("lastScheduleTime")) or parse_time(
            meta.get("creationTimestamp")
        )
        moment = dt.datetime.fromtimestamp(context.clock(), dt.UTC)
        due = next_due(spec.schedule, after=last or moment)
        desired: JSON = {}
        held = _holds_back(latest)
        if not spec.suspend and due <= moment:
            if held:
                desired["lastScheduleTime"] = iso(moment)  # this schedule is skipped
            else:
                tick_name = tick_run_name(name, latest_number + 1)
                try:
                    created = context.api.create_object(
                        "AgentRun", namespace, resources.tick(run, tick_name)
                    )
                    context.cache.put("AgentRun", created)
                except Conflict:
                    pass
                desired["lastTick"] = tick_name
                desired["lastScheduleTime"] = iso(moment)
                context.events.normal(run, "TickCreated", f"created tick {tick_name}")
            due = next_due(spec.schedule, after=moment)
        generation = int(meta.get("generation") or 1)
        phase = "Pending" if spec.suspend else "Running"
        if spec.suspend:
            message = "suspended (spec.suspend is true)"
        elif held:
            message = f"next tick held back: {held}"
        else:
            message = f"next tick at {iso(due)}"
        # A monitor is ready while it schedules; it never reconciles or stalls itself.
        shown = (
            ("Ready", "True", "Scheduling"),
            ("Reconciling", "False", phase),
            ("Stalled", "False", "NotStalled"),
        )
        at = now()
        desired.update(
            {
                "phase": phase,
                "observedGeneration": generation,
                "message": message,
                "conditions": [
                    condition(current, *values, generation=generation, now=at) for values in shown
                ],
            }
        )
        self._status.patch(run, desired)
        return REST if spec.suspend else Requeue(max(0.5, due.timestamp() - context.clock()))

    def _ticks(self, run: JSON) -> list[tuple[int, JSON]]:
        """The monitor's ticks the cache holds, by number, oldest first."""
        meta = run["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        labelled = self._context.cache.select(
            "AgentRun",
            namespace,
            lambda body: body["metadata"].get("labels", {}).get(MONITOR_LABEL) == label_value(name),
        )
        return sorted(
            (
                (number, body)
                for body in labelled
                if resources.owned_by(body, uid)
                and (number := tick_number(name, body["metadata"]["name"])) is not None
            ),
            key=lambda pair: pair[0],
        )

    def _trim_history(
        self, spec: AgentRunSpec, namespace: str, ticks: list[tuple[int, JSON]]
    ) -> None:
        """Keep the newest finished ticks as a CronJob keeps its Jobs; the store keeps every
        tick's checkpoint and audit trail."""
        succeeded = [b for _, b in ticks if (b.get("status") or {}).get("phase") == "Succeeded"]
        failed = [b for _, b in ticks if (b.get("status") or {}).get("phase") == "Failed"]
        for bodies, keep in (
            (succeeded, spec.successful_ticks_history_limit),
            (failed, spec.failed_ticks_history_limit),
        ):
            for body in bodies[: max(0, len(bodies) - keep)]:
                meta = body["metadata"]
                self._context.api.delete_object(
                    "AgentRun", namespace, meta["name"], uid=meta["uid"]
                )


def _holds_back(latest: JSON | None) -> str:
    """Why the latest tick keeps the next one from starting ('' if it does not)."""
    if latest is None:
        return ""
    tick_status = latest.get("status") or {}
    name = latest["metadata"]["name"]
    phase = tick_status.get("phase", "Pending")
    if phase in ("Pending", "Running"):
        return f"{name} is still {phase.lower()}"
    reason = tick_status.get("stopReason", "")
    if phase == "Stopped" and reason in _WAITING:
        return f"{name} waits for a person ({reason})"
    return ""
