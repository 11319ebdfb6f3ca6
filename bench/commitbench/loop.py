"""The loop under test, and what one steady iteration of it writes (the baseline's payloads).

Why it exists: both sides of the benchmark must do the same work. The loop side is a real
``Loop`` with a zero-latency model planning one WRITE per call and a tool that only returns; the
raw side replays, byte for byte, the checkpoints and audit rows a calibration run of that loop
wrote. It must never change what an iteration does between the two sides.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from keelgate.adapters.tools.python import PythonTool
from keelgate.core.audit import AuditDraft, seal
from keelgate.core.loop import Loop
from keelgate.core.model import ModelReply, ModelRequest, PlannedCall
from keelgate.core.protocols import Completion, Stores
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import KeyRecord, SideEffect
from keelgate.errors import RunNotFound
from keelgate.stores.memory import MemoryStore

TENANT = "bench"
TOOL = "write"


class StampedModel:
    """A zero-latency model planning one WRITE per call; it notes when each plan is asked for.

    The time between two planning calls is one whole iteration (plan checkpoint, claim, tool,
    completion, action, observe and verify checkpoints, the verify call), free of the run's
    start and stop, so per-iteration figures exclude them.
    """

    def __init__(self, probe: Callable[[], None] | None = None) -> None:
        self.name = "bench"
        self.stamps: list[float] = []
        self.cpu: list[float] = []
        self.probe = probe

    def call(self, request: ModelRequest) -> ModelReply:
        if request.phase == "plan":
            if self.probe is not None:
                self.probe()
            self.stamps.append(time.perf_counter())
            self.cpu.append(time.process_time())
        if request.phase == "verify":
            return ModelReply(verdict="accept")
        # Arguments (and so idempotency keys) differ every iteration, as real WRITEs would.
        return ModelReply(actions=(PlannedCall(TOOL, {"n": request.call}),))


def do_nothing(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
    return {"ok": True}


def write_tool() -> PythonTool:
    return PythonTool(TOOL, do_nothing, SideEffect.WRITE, description="returns at once")


def drive(store: Any, run: str, iterations: int, model: StampedModel) -> None:
    """Run (or resume) ``run`` until it has done ``iterations`` more iterations."""
    loop = Loop(stores=Stores.of(store), model=model, tools=[write_tool()])
    done = 0
    with contextlib.suppress(RunNotFound):
        done = loop.state(TENANT, run).iteration
    spec = LoopSpec(TENANT, run, "benchmark", budget=Budget(max_iterations=done + iterations))
    outcome = loop.run_or_resume(spec)
    if outcome.iteration != done + iterations:
        raise SystemExit(f"bench: the loop stopped early: {outcome.to_json()}")


def per_iteration(stamps: Sequence[float]) -> float:
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


@dataclass(frozen=True)
class Payload:
    """What one steady-state loop iteration writes, as the stores receive it."""

    checkpoints: tuple[str, str, str]  # plan, action with observation, verify: compact JSON
    events: tuple[tuple[Mapping[str, Any], ...], ...]  # audit rows per checkpoint
    claim_events: tuple[Mapping[str, Any], ...]  # audit rows committed with the key claim
    result: str  # the completed key's stored result

    @property
    def checkpoint_bytes(self) -> int:
        return sum(len(c.encode()) for c in self.checkpoints)


class _Recorder(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.saves: list[tuple[dict[str, Any], tuple[AuditDraft, ...]]] = []
        self.claims: list[AuditDraft | None] = []
        self.results: list[Any] = []

    def claim(
        self,
        tenant: str,
        key: str,
        *,
        run: str,
        action: str,
        tool: str,
        event: AuditDraft | None = None,
        deadline_in: float | None = None,
    ) -> KeyRecord | None:
        self.claims.append(event)
        return super().claim(
            tenant, key, run=run, action=action, tool=tool, event=event, deadline_in=deadline_in
        )

    def save_with_events(
        self,
        tenant: str,
        run: str,
        seq: int,
        state: Mapping[str, Any],
        drafts: Sequence[AuditDraft],
    ) -> None:
        self.saves.append((dict(state), tuple(drafts)))
        super().save_with_events(tenant, run, seq, state, drafts)

    def save_completing(
        self,
        tenant: str,
        run: str,
        seq: int,
        state: Mapping[str, Any],
        drafts: Sequence[AuditDraft],
        completions: Sequence[Completion],
    ) -> tuple[str, ...]:
        if completions:  # without any it is save_with_events, recorded there
            self.saves.append((dict(state), tuple(drafts)))
            self.results.extend(c.result for c in completions)
        return super().save_completing(tenant, run, seq, state, drafts, completions)


def calibrate(warm: int = 40) -> Payload:
    """Run the loop past its history window in memory and keep the last iteration's writes."""
    recorder = _Recorder()
    drive(recorder, "calibrate", warm, StampedModel())
    # The run's last iteration: plan, action with its observation (and the key's completion),
    # verify, then the max_iterations stop.
    last = recorder.saves[-4:-1]
    steps = [state["step"] for state, _ in last]
    if steps != ["act", "verify", "plan"]:
        raise SystemExit(f"bench: unexpected checkpoint sequence {steps}")
    head = None

    def sealed(drafts: Sequence[AuditDraft]) -> tuple[Mapping[str, Any], ...]:
        nonlocal head
        rows = []
        for draft in drafts:
            head = seal(TENANT, "raw", head, draft)
            # Serialised here, once: the baseline's timed loop only issues statements.
            rows.append({**head.to_json(), "data_text": json.dumps(dict(head.data))})
        return tuple(rows)

    # In commit order: the plan checkpoint, the claim, then the other checkpoints.
    plan_events = sealed(last[0][1])
    claimed = recorder.claims[-1]
    claim_events = sealed([claimed] if claimed is not None else [])
    events = (plan_events, *(sealed(drafts) for _, drafts in last[1:]))
    texts = tuple(json.dumps(s, separators=(",", ":")) for s, _ in last)
    return Payload(
        (texts[0], texts[1], texts[2]),
        events,
        claim_events,
        json.dumps(recorder.results[-1]),
    )


def describe_baseline(payload: Payload) -> list[str]:
    """The baseline's transactions, one line each, with the audit rows each carries."""

    def rows(events: Sequence[Mapping[str, Any]]) -> str:
        return " + " + ", ".join(str(e["type"]) for e in events) + " row(s)" if events else ""

    steps = [
        f"write-ahead plan: checkpoint upsert{rows(payload.events[0])}",
        f"claim: key insert (in flight){rows(payload.claim_events)}",
        "completion, action and observation: key update (completed, with its result) + "
        f"checkpoint upsert{rows(payload.events[1])}",
        f"verify checkpoint: checkpoint upsert{rows(payload.events[2])}",
    ]
    return [f"  ({n}) {step}" for n, step in enumerate(steps, start=1)]
