"""Keelgate: run AI agent loops durably and safely.

A WRITE never runs twice and never runs unapproved, whatever dies and whenever; not knowing is a
reason to stop, never to retry. This module is the public facade: it re-exports the API and holds
no logic of its own.

The re-exports are lazy (a module ``__getattr__``): every ``keelgate.*`` module, a step pod's
program among them, imports this package first, and a step must not pay for the loop, the
audit chain and pydantic's models before it has read its checkpoint. ``from keelgate import X``
imports X's module on first use and behaves exactly as an eager import would. This module must
never import anything at its top but ``typing`` and ``keelgate._lazy``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keelgate._lazy import lazy_exports

if TYPE_CHECKING:  # what type checkers and IDEs see: the same names, imported eagerly
    from keelgate.core.audit import AuditDraft, AuditEvent, ChainReport
    from keelgate.core.audit import verify as verify_audit
    from keelgate.core.fence import DeadlinePassed, WriteDeadline, about_to_send, fenced
    from keelgate.core.fence import current as write_deadline
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
        SettleTooEarly,
        StaleCheckpoint,
        StoreError,
        StoreUnavailable,
        ToolError,
    )
    from keelgate.stores import open_stores

# Each public name: (the module that defines it, its name there).
_WHERE: dict[str, tuple[str, str]] = {
    **{name: ("keelgate.core.audit", name) for name in ("AuditDraft", "AuditEvent", "ChainReport")},
    "verify_audit": ("keelgate.core.audit", "verify"),
    **{
        name: ("keelgate.core.fence", name)
        for name in ("DeadlinePassed", "WriteDeadline", "about_to_send", "fenced")
    },
    "write_deadline": ("keelgate.core.fence", "current"),
    "SIDE_EFFECT_NOT_PERMITTED": ("keelgate.core.gateway", "SIDE_EFFECT_NOT_PERMITTED"),
    "Loop": ("keelgate.core.loop", "Loop"),
    **{
        name: ("keelgate.core.model", name)
        for name in ("Model", "ModelReply", "ModelRequest", "PlannedCall", "ToolInfo")
    },
    **{
        name: ("keelgate.core.protocols", name)
        for name in (
            "AuditLog",
            "Checkpoint",
            "CheckpointStore",
            "Confirmer",
            "IdempotencyStore",
            "LoopRunner",
            "RunRef",
            "Stores",
            "Tool",
        )
    },
    **{name: ("keelgate.core.spec", name) for name in ("Budget", "LoopSpec", "Price")},
    **{
        name: ("keelgate.core.types", name)
        for name in (
            "KeyRecord",
            "KeyState",
            "LoopKind",
            "Outcome",
            "RunPhase",
            "SideEffect",
            "Stop",
            "StopReason",
            "UnknownAction",
            "Usage",
        )
    },
    **{
        name: ("keelgate.errors", name)
        for name in (
            "InputError",
            "KeelgateError",
            "ModelError",
            "ModelUnavailable",
            "OutcomeUncertain",
            "RunBusy",
            "RunNotFound",
            "SettleError",
            "SettleTooEarly",
            "StaleCheckpoint",
            "StoreError",
            "StoreUnavailable",
            "ToolError",
        )
    },
    "open_stores": ("keelgate.stores", "open_stores"),
}

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
    "DeadlinePassed",
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
    "SettleTooEarly",
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
    "WriteDeadline",
    "about_to_send",
    "fenced",
    "open_stores",
    "verify_audit",
    "write_deadline",
]


__getattr__, __dir__ = lazy_exports(__name__, globals(), _WHERE, __all__)
