"""Writing a run's checkpoints: each the next in sequence, with the active time since the last
and the audit events it carries.

Why it exists: a checkpoint and the events that say how the run got there must never part. With
stores that commit both together (``Capabilities.checkpoint_with_events``) they do; otherwise
the events ride in the checkpoint's outbox and are appended right after it, and a resume appends
them again (appending is idempotent by event key). This module must never write a checkpoint
without its events, nor count as active the time a run spends stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from keelgate.core.audit import AuditDraft
from keelgate.core.protocols import CheckpointLog, Completion, Stores
from keelgate.core.state import RunState
from keelgate.core.types import (
    LateResult,
    PendingApproval,
    Stop,
    StopReason,
    UnknownAction,
    Usage,
)
from keelgate.errors import StaleCheckpoint

log = logging.getLogger("keelgate.loop")

# How often a late result's checkpoint is tried against a run another process keeps moving on.
LATE_ATTEMPTS = 5


def persist(
    stores: Stores, state: RunState, outbox: Sequence[AuditDraft], *, joint: CheckpointLog | None
) -> RunState:
    """Write ``state`` (its seq already the next one) with the audit events it carries.
    ``joint`` is ``stores.joint``, asked once by the caller (it checks a protocol: slow to ask
    at every checkpoint).

    With one backend for both, checkpoint and events commit together; otherwise the events ride
    in the checkpoint's outbox and are appended after it, so a crash in between re-appends them
    on resume (appending is idempotent by event key). The checkpoint records the last event's
    key, the anchor that lets verify see events cut off the chain's end.
    """
    state = _anchored(state, outbox)
    if joint is not None:
        joint.save_with_events(state.tenant, state.run, state.seq, state.to_json(), outbox)
        return state
    stores.checkpoints.save(
        state.tenant, state.run, state.seq, state.but(outbox=tuple(outbox)).to_json()
    )
    if outbox:
        stores.audit.append(state.tenant, state.run, outbox)
    return state


def _anchored(state: RunState, outbox: Sequence[AuditDraft]) -> RunState:
    tail = next((d.key for d in reversed(outbox) if d.key), state.audit_tail)
    return state.but(outbox=(), audit_tail=tail)


class Checkpointer:
    """The checkpoints of one session (one call of ``run_or_resume``).

    ``pending`` collects the events emitted between two checkpoints (the gateway's: an action
    started, a settlement); the next checkpoint carries them. Active time is counted from the
    last checkpoint (``mark``), so time stopped between sessions never counts.
    """

    def __init__(
        self, stores: Stores, clock: Callable[[], float], *, tenant: str = "", run: str = ""
    ) -> None:
        self.stores = stores
        self.run_id = (tenant, run)
        self.joint = stores.joint  # declared by the stores (Capabilities.checkpoint_with_events)
        self.completing = stores.completing  # Capabilities.checkpoint_with_completion
        self.clock = clock
        self.mark = clock()
        self.pending: list[AuditDraft] = []

    def active(self, state: RunState) -> float:
        """The run's active seconds now: as checkpointed, plus the time since."""
        return state.usage.active_seconds + (self.clock() - self.mark)

    def save(self, state: RunState, *drafts: AuditDraft) -> RunState:
        """Write the next checkpoint, with the active time since the last one and the audit
        events it carries: the gateway's since then (an action started, a settlement) ride
        along."""
        return persist(self.stores, *self._next(state, drafts), joint=self.joint)

    def save_completing(
        self, state: RunState, *drafts: AuditDraft, completions: Sequence[Completion]
    ) -> tuple[RunState, tuple[str, ...]]:
        """``save``, completing the keys of the WRITEs whose results ``state`` records in the
        same commit (the stores declare they can: ``Capabilities.checkpoint_with_completion``).
        Also returns the keys whose completion did not land (settled meanwhile by someone)."""
        if not completions:
            return self.save(state, *drafts), ()
        assert self.completing is not None, "completions are deferred only to stores taking them"
        state, outbox = self._next(state, drafts)
        state = _anchored(state, outbox)
        missed = self.completing.save_completing(
            state.tenant, state.run, state.seq, state.to_json(), outbox, completions
        )
        return state, missed

    def _next(
        self, state: RunState, drafts: Sequence[AuditDraft]
    ) -> tuple[RunState, tuple[AuditDraft, ...]]:
        now = self.clock()
        active = Usage(active_seconds=now - self.mark)
        self.mark = now
        outbox = (*state.outbox, *self.pending, *drafts)
        self.pending.clear()
        return state.but(seq=state.seq + 1, usage=state.usage.plus(active)), outbox

    def remember_late(self, late: LateResult, draft: AuditDraft) -> None:
        """A call of this run that ended after its session stopped, and after someone else had
        settled its key: the run's latest checkpoint remembers it (``RunState.late``), with its
        ``loop.late_result`` event, so whoever shows the run can say so. Called from the call's
        own thread; the save is a compare-and-set on the latest checkpoint, read again if
        another process moved the run on meanwhile."""
        tenant, run = self.run_id
        for _ in range(LATE_ATTEMPTS):
            checkpoint = self.stores.checkpoints.load(tenant, run)
            if checkpoint is None:
                break
            state = RunState.from_json(checkpoint.state).but(seq=checkpoint.seq)
            try:
                persist(
                    self.stores,
                    state.but(seq=state.seq + 1).with_late([late]),
                    (*state.outbox, draft),
                    joint=self.joint,
                )
                return
            except StaleCheckpoint:
                continue
        self.stores.audit.append(tenant, run, [draft])  # at least the chain says it

    def stop(
        self,
        state: RunState,
        reason: StopReason,
        message: str = "",
        *,
        resumable: bool | None = None,
        unknown: tuple[UnknownAction, ...] = (),
        pending: tuple[PendingApproval, ...] = (),
        **changes: Any,
    ) -> RunState:
        stop = Stop(reason, message, resumable)
        draft = AuditDraft(
            "loop.stopped",
            {
                "reason": reason.value,
                "resumable": stop.is_resumable,
                "iteration": state.iteration,
                "step": changes.get("step", state.step).value,
                **({"unknownActions": [u.action for u in unknown]} if unknown else {}),
            },
            key=f"stopped:{state.seq + 1}",
        )
        if message:
            log.info("%s/%s stopped: %s (%s)", state.tenant, state.run, reason.value, message)
        return self.save(state.but(stop=stop, unknown=unknown, pending=pending, **changes), draft)
