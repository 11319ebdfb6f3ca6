"""The audit chain: append-only, hash-chained events per run.

Each event's hash covers the previous event's hash, so an edited or removed event breaks the chain
and ``verify`` says where. Stores only persist what ``seal`` returns; the hashing lives here so that
every backend chains identically. Events carry who and what, never tool arguments or secrets.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from keelgate.core.types import canonical_json
from keelgate.core.values import JsonValue

GENESIS = "0" * 64


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class AuditDraft(JsonValue):
    """An event not yet on the chain. ``key``, when set, makes appending it idempotent."""

    type: str
    data: Mapping[str, Any]
    actor: str = "keelgate"
    at: str = field(default_factory=utc_now)
    key: str | None = None


@dataclass(frozen=True)
class AuditEvent(JsonValue):
    """An event on the chain."""

    seq: int
    type: str
    actor: str
    at: str
    data: Mapping[str, Any]
    key: str | None
    prev: str
    hash: str


def _digest(tenant: str, run: str, seq: int, prev: str, draft: AuditDraft) -> str:
    body = canonical_json(
        [tenant, run, seq, prev, draft.type, draft.actor, draft.at, dict(draft.data), draft.key]
    )
    return hashlib.sha256(body.encode()).hexdigest()


def seal(tenant: str, run: str, head: AuditEvent | None, draft: AuditDraft) -> AuditEvent:
    """Put ``draft`` on the chain after ``head`` (None for the first event of a run)."""
    seq = 1 if head is None else head.seq + 1
    prev = GENESIS if head is None else head.hash
    return AuditEvent(
        seq,
        draft.type,
        draft.actor,
        draft.at,
        dict(draft.data),
        draft.key,
        prev,
        _digest(tenant, run, seq, prev, draft),
    )


@dataclass(frozen=True)
class ChainReport:
    ok: bool
    events: int
    problems: tuple[str, ...] = ()


def verify(
    tenant: str,
    run: str,
    events: Sequence[AuditEvent],
    *,
    anchor: str | None = None,
    pending: Collection[str] = (),
) -> ChainReport:
    """Check every link: sequence without gaps, each ``prev`` the hash before, each hash right.

    Links alone cannot show that the newest events were cut off. ``anchor`` is the key of the
    last event the run's checkpoint says it wrote (``pending``: keys still in its outbox, not
    yet appended); if the chain lacks it, events were removed from its end.
    """
    problems: list[str] = []
    prev = GENESIS
    for expected, event in enumerate(events, start=1):
        if event.seq != expected:
            problems.append(f"event {expected} is missing (found {event.seq} in its place)")
            break
        if event.prev != prev:
            problems.append(f"event {event.seq} does not follow event {event.seq - 1}")
        draft = AuditDraft(event.type, event.data, event.actor, event.at, event.key)
        if _digest(tenant, run, event.seq, event.prev, draft) != event.hash:
            problems.append(f"event {event.seq} ({event.type}) was altered")
        prev = event.hash
    if anchor is not None and anchor not in pending and all(e.key != anchor for e in events):
        problems.append(
            f"events were removed from the end: the checkpoint's last event ({anchor}) is missing"
        )
    return ChainReport(not problems, len(events), tuple(problems))
