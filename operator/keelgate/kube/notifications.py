"""What the operator tells the outside world (as CloudEvents), derived from the objects it writes.

Why it exists: a person should be told when a decision starts waiting for them, is made or expires,
and when a run stops or finishes. Each of these is a fact the cluster already holds durably, in what
the operator wrote: a Reconciliation or Approval created (a decision waits), its status ``Settled``
with ``verdict``, ``settledBy`` and ``source`` (a decision made), an AgentRun's status at rest
(``phase``, ``stopReason``). So a notification is derived from an object's body, not recorded beside
it: the same body gives the same notifications, with the same ``id``, in any process, after any
restart and on any leader, and a receiver can drop a notification it has seen.

Each notification's ``id`` is a hash of the durable fields that make its transition distinct (the
object's uid, and for a run's stop its phase, stop reason, step and the time its ``Succeeded``
condition last moved); its ``time`` is the record's own (``creationTimestamp``, ``settledAt``, the
conditions' transition times), which a new leader compares with how far the last one had delivered
(``keelgate.kube.runtime.notifier``).

This module is pure: it reads bodies and never talks to a cluster or a store. It must never put a
tool's argument or a secret into a notification: the words it copies (a stop's message) go through
the redactor, and arguments are added (redacted) only by a sink that asks for them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from keelgate.core.redaction import redact_text
from keelgate.kube.naming import action_object_name
from keelgate.kube.times import parse_time
from keelgate.manifest import notifications as types

JSON = dict[str, Any]

#: The kinds whose bodies hold notifications.
KINDS = ("AgentRun", "Reconciliation", "Approval")
#: A record's time on the API server's clock (a creationTimestamp); others are the operator's.
SERVER_CLOCK = "server"
OPERATOR_CLOCK = "operator"

_AT_REST = {
    "Stopped": types.RUN_STOPPED,
    "Succeeded": types.RUN_SUCCEEDED,
    "Failed": types.RUN_FAILED,
}


@dataclass(frozen=True)
class Notification:
    """One event to tell: a CloudEvent's attributes and data, without the operator's name
    (``source`` is ``/<operator>`` + ``path``) and without any tool's arguments."""

    type: str
    id: str
    path: str  # /namespaces/<ns>/agentruns/<run>
    subject: str  # <plural>/<name> of the object it is about
    time: float  # POSIX seconds, from the record
    clock: str  # whose clock ``time`` is on (SERVER_CLOCK or OPERATOR_CLOCK)
    data: Mapping[str, Any]
    #: The run and action whose arguments a sink with ``includeArguments`` may add ("": none).
    namespace: str = ""
    run: str = ""
    action: str = ""
    #: Where the body came from: (kind, namespace, name, uid).
    about: tuple[str, str, str, str] = field(default=("", "", "", ""))


def notification_id(*parts: object) -> str:
    """A stable id from durable fields: the same parts give the same id in any process."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()
    return digest[:32]


def run_path(namespace: str, run: str) -> str:
    return f"/namespaces/{namespace}/agentruns/{run}"


def _seconds(text: Any) -> float | None:
    moment = parse_time(str(text)) if text else None
    return None if moment is None else moment.timestamp()


def notifications_of(kind: str, body: Mapping[str, Any]) -> list[Notification]:
    """Every notification ``body`` (an AgentRun, Reconciliation or Approval) holds now, in the order
    they happened. Cheap for a body that holds none (a run under way)."""
    if kind == "AgentRun":
        return _run_notifications(body)
    if kind in ("Reconciliation", "Approval"):
        return _decision_notifications(kind, body)
    return []


def _run_notifications(body: Mapping[str, Any]) -> list[Notification]:
    status = body.get("status") or {}
    event_type = _AT_REST.get(str(status.get("phase") or ""))
    if event_type is None:
        return []
    meta = body.get("metadata") or {}
    namespace, name, uid = (
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        meta.get("uid"),
    )
    conditions = {str(c.get("type")): c for c in status.get("conditions") or []}
    succeeded = conditions.get("Succeeded") or {}
    times = [_seconds(c.get("lastTransitionTime")) for c in conditions.values()]
    known = [t for t in times if t is not None]
    if not uid or not known:
        return []  # not a status the operator wrote
    step = status.get("step") or {}
    stop_reason = str(status.get("stopReason") or "")
    if not stop_reason and succeeded.get("reason") == "Stalled":
        stop_reason = "stalled"
    phase = str(status["phase"])
    waiting = [
        {
            "kind": "Reconciliation",
            "name": action_object_name(name, str(u.get("action")), str(u.get("tool"))),
            "action": u.get("action"),
            "tool": u.get("tool"),
            **({"notExecutedAfter": u["notExecutedAfter"]} if u.get("notExecutedAfter") else {}),
        }
        for u in status.get("unknownActions") or []
    ] + [
        {
            "kind": "Approval",
            "name": action_object_name(
                name, str(p.get("action")), str(p.get("tool")), round=int(p.get("round") or 1)
            ),
            "action": p.get("action"),
            "tool": p.get("tool"),
        }
        for p in status.get("pendingApprovals") or []
    ]
    usage = status.get("usage") or {}
    data: JSON = {
        "namespace": namespace,
        "run": name,
        "phase": phase,
        "stopReason": stop_reason,
        "resumable": bool(status.get("resumable")),
        # A success's message is the model's answer, which may quote anything the run saw: it
        # stays in the run's status. A stop's is the operator's or the loop's words, redacted.
        "message": "" if phase == "Succeeded" else redact_text(str(status.get("message") or "")),
        "iteration": int(status.get("iteration") or 0),
        "usage": {k: usage[k] for k in ("inputTokens", "outputTokens", "dollars") if k in usage},
        "waitingFor": waiting,
    }
    return [
        Notification(
            type=event_type,
            id=notification_id(
                "run",
                uid,
                phase,
                stop_reason,
                step.get("number", ""),
                step.get("attempt", ""),
                succeeded.get("lastTransitionTime", ""),
            ),
            path=run_path(namespace, name),
            subject=f"agentruns/{name}",
            time=max(known),
            clock=OPERATOR_CLOCK,
            data=data,
            namespace=namespace,
            run=name,
            about=("AgentRun", namespace, name, str(uid)),
        )
    ]


def _decision_notifications(kind: str, body: Mapping[str, Any]) -> list[Notification]:
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    uid = meta.get("uid")
    created = _seconds(meta.get("creationTimestamp"))
    if not uid or created is None:
        return []
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    run, action = str(spec.get("runName", "")), str(spec.get("action", ""))
    plural = "reconciliations" if kind == "Reconciliation" else "approvals"
    about = (kind, namespace, name, str(uid))
    base: JSON = {
        "namespace": namespace,
        "run": run,
        "name": name,
        "action": action,
        "tool": str(spec.get("tool", "")),
    }
    if kind == "Reconciliation":
        base["idempotencyKey"] = str(spec.get("idempotencyKey", ""))

    def notification(
        event_type: str, at: float, clock: str, data: JSON, *parts: object
    ) -> Notification:
        return Notification(
            type=event_type,
            id=notification_id(kind, uid, *parts),
            path=run_path(namespace, run),
            subject=f"{plural}/{name}",
            time=at,
            clock=clock,
            data=data,
            namespace=namespace,
            run=run,
            action=action,
            about=about,
        )

    found: list[Notification] = []
    if not status.get("phase"):
        return found  # just created: shown Pending (or Settled, by a confirmer) a moment later
    settled = status.get("phase") == "Settled"
    source = str(status.get("source") or "")
    # A settlement a step pod's confirmer made is shown already Settled: nobody was asked.
    if not (settled and source == "confirmer"):
        requested = (
            types.RECONCILIATION_REQUESTED
            if kind == "Reconciliation"
            else (types.APPROVAL_REQUESTED)
        )
        found.append(notification(requested, created, SERVER_CLOCK, base, "requested"))
    if settled and status.get("verdict") == "expired":
        # Nobody decided: its approvals stopped counting (told as approval.expired when they
        # did), and the action is asked afresh on the round's Approval, whose own request is.
        return found
    if settled:
        verdict, by = str(status.get("verdict") or ""), str(status.get("settledBy") or "")
        at = _seconds(status.get("settledAt")) or created
        decided: JSON = {**base, "verdict": verdict, "by": by, "decidedAt": status.get("settledAt")}
        if kind == "Reconciliation":
            decided["source"] = source or "human"
            event_type = types.RECONCILIATION_SETTLED
        else:
            event_type = types.APPROVAL_APPROVED if verdict == "approved" else types.APPROVAL_DENIED
        # settledAt is written once per decision: a later decision of the same object (asked
        # again) is another notification.
        found.append(
            notification(
                event_type,
                at,
                OPERATOR_CLOCK,
                decided,
                "decided",
                verdict,
                by,
                status.get("settledAt", ""),
            )
        )
    return found


def approval_expired(
    approval: Mapping[str, Any],
    *,
    approved_by: Sequence[str],
    approved_at: str,
    expired_at: str,
    expires_after_seconds: float,
) -> Notification:
    """The notification that an approval given at ``approved_at`` by ``approved_by`` was too old
    when its WRITE was to run (``expiresAfter`` on the tool's rule) and is asked for again.

    ``approval`` is the Approval object's body; ``approved_at`` is the decision's time as the store
    records it, so the notification has the same ``id`` however often it is told (and a later expiry
    of a later approval another one); ``expired_at`` (a metav1.Time, on the operator's clock) is
    when the operator found it expired and asked again, as recorded with the new ask. Sent with
    ``ControllerContext.notify``."""
    meta = approval.get("metadata") or {}
    spec = approval.get("spec") or {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    run, action = str(spec.get("runName", "")), str(spec.get("action", ""))
    uid = str(meta.get("uid", ""))
    at = _seconds(expired_at)
    return Notification(
        type=types.APPROVAL_EXPIRED,
        id=notification_id("Approval", uid, "expired", approved_at, *approved_by),
        path=run_path(namespace, run),
        subject=f"approvals/{name}",
        time=0.0 if at is None else at,
        clock=OPERATOR_CLOCK,
        data={
            "namespace": namespace,
            "run": run,
            "name": name,
            "action": action,
            "tool": str(spec.get("tool", "")),
            "approvedBy": list(approved_by),
            "approvedAt": approved_at,
            "expiresAfterSeconds": expires_after_seconds,
            "expiredAt": expired_at,
        },
        namespace=namespace,
        run=run,
        action=action,
        about=("Approval", namespace, name, uid),
    )
