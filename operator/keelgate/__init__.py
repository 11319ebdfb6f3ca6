"""Keelgate: run AI agent loops durably and safely.

A WRITE never runs twice and never runs unapproved, whatever dies and whenever; not knowing is a
reason to stop, never to retry. This module is the public facade: it re-exports the API and holds
no logic of its own.
"""

from keelgate.core.audit import AuditDraft, AuditEvent, ChainReport
from keelgate.core.audit import verify as verify_audit
from keelgate.core.gateway import SIDE_EFFECT_NOT_PERMITTED
from keelgate.core.loop import Loop
from keelgate.core.model import Model, ModelReply, ModelRequest, PlannedCall, ToolInfo
from keelgate.core.protocols import (
    AuditLog,
    Checkpoint,
    CheckpointStore,
    Confirmer,
    IdempotencyStore,
    LoopRunner,
    RunRef,
    Stores,
    Tool,
)
from keelgate.core.spec import Budget, LoopSpec, Price
from keelgate.core.types import (
    KeyRecord,
    KeyState,
    LoopKind,
    Outcome,
    RunPhase,
    SideEffect,
    Stop,
    StopReason,
    UnknownAction,
    Usage,
)
from keelgate.errors import (
    InputError,
    KeelgateError,
    ModelError,
    ModelUnavailable,
    OutcomeUncertain,
    RunBusy,
    RunNotFound,
    SettleError,
    StaleCheckpoint,
    StoreError,
    StoreUnavailable,
    ToolError,
)
from keelgate.stores import open_stores

__all__ = [
    "SIDE_EFFECT_NOT_PERMITTED",
    "AuditDraft",
    "AuditEvent",
    "AuditLog",
    "Budget",
    "ChainReport",
    "Checkpoint",
    "CheckpointStore",
    "Confirmer",
    "IdempotencyStore",
    "InputError",
    "KeelgateError",
    "KeyRecord",
    "KeyState",
    "Loop",
    "LoopKind",
    "LoopRunner",
    "LoopSpec",
    "Model",
    "ModelError",
    "ModelReply",
    "ModelRequest",
    "ModelUnavailable",
    "Outcome",
    "OutcomeUncertain",
    "PlannedCall",
    "Price",
    "RunBusy",
    "RunNotFound",
    "RunPhase",
    "RunRef",
    "SettleError",
    "SideEffect",
    "StaleCheckpoint",
    "Stop",
    "StopReason",
    "StoreError",
    "StoreUnavailable",
    "Stores",
    "Tool",
    "ToolError",
    "ToolInfo",
    "UnknownAction",
    "Usage",
    "open_stores",
    "verify_audit",
]
