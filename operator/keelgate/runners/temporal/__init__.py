"""The Temporal runner: a run as a workflow, each stretch of it as an activity (ADR-0004).

Users who already run Temporal get their agent loop inside a workflow, with Temporal's retries
and its history, without giving up Keelgate's promise: a retried activity resumes from the
checkpoint and never repeats a WRITE (see ``activities``). The parts:

- ``wire``: the names and the plain data that cross the wire.
- ``workflow``: ``RunWorkflow`` (``keelgate.run``), deterministic, in Temporal's sandbox.
- ``activities``: ``Activities``, what a worker runs against its store.
- ``client``: ``TemporalRunner``, the ``LoopRunner`` seam over the same ``LoopSpec``.
- ``worker``: ``serve``, a worker process (``keelgate temporal-worker``).

Importing this package imports the Temporal SDK (the CLI reports a missing extra that way). It
must never be imported by the core, the stores, the adapters, the operator or a step pod (the
import-linter contracts say so), never put a store URL into a workflow's input, never retry a
decision that was refused, and never interrupt a loop mid-call.
"""

from __future__ import annotations

from keelgate.runners.temporal.activities import Activities
from keelgate.runners.temporal.client import Stopped, TemporalRunner, stop_outcome
from keelgate.runners.temporal.wire import (
    APPROVE,
    DRIVE,
    NEEDS_EXTRA,
    RAISE_BUDGET,
    RECONCILE,
    WORKFLOW,
    ApproveRequest,
    DriveRequest,
    ReconcileRequest,
    ResumeRequest,
    RunRequest,
    Settings,
    WaitRequest,
    outcome_from_wire,
    outcome_to_wire,
    workflow_id,
)
from keelgate.runners.temporal.worker import serve, serve_forever
from keelgate.runners.temporal.workflow import RunWorkflow

__all__ = [
    "APPROVE",
    "DRIVE",
    "NEEDS_EXTRA",
    "RAISE_BUDGET",
    "RECONCILE",
    "WORKFLOW",
    "Activities",
    "ApproveRequest",
    "DriveRequest",
    "ReconcileRequest",
    "ResumeRequest",
    "RunRequest",
    "RunWorkflow",
    "Settings",
    "Stopped",
    "TemporalRunner",
    "WaitRequest",
    "outcome_from_wire",
    "outcome_to_wire",
    "serve",
    "serve_forever",
    "stop_outcome",
    "workflow_id",
]
