"""The audit chain: append-only, hash-chained events per run.

Each event's hash covers the previous event's hash, so an edited or removed event breaks the chain
and ``verify`` says where. Stores only persist what ``seal`` returns; the hashing lives here so that
every backend chains identically. Events carry who and what, never tool arguments or secrets.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from keelgate.core import clocks
from keelgate.core.types import canonical_json
from keelgate.core.values import JsonValue

GENESIS = "0" * 64


def utc_now() -> str:
    moment = datetime.fromtimestamp(clocks.wall(), UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


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


def stored_event(
    seq: int,
    type: str,
    actor: str,
    at: str,
    data: Mapping[str, Any],
    key: str | None,
    prev: str,
    hash: str,
) -> AuditEvent:
    """An event as a store reads it back, equal to ``AuditEvent(...)`` of the same fields.

    Reading a long chain builds one per event, and a frozen dataclass's ``__init__`` sets each
    field through ``object.__setattr__``, several times the cost of the rest of the read. The
    fields are set here as they come; nothing is checked, as ``__init__`` checks nothing either.
    """
    event = object.__new__(AuditEvent)
    event.__dict__.update(
        seq=seq, type=type, actor=actor, at=at, data=data, key=key, prev=prev, hash=hash
    )
    return event


def _digest(tenant: str, run: str, seq: int, prev: str, draft: AuditDraft) -> str:
    return _hash(tenant, run, seq, prev, draft.type, draft.actor, draft.at, draft.data, draft.key)


def _hash(
    tenant: str,
    run: str,
    seq: int,
    prev: str,
    type: str,
    actor: str,
    at: str,
    data: Mapping[str, Any],
    key: str | None,
) -> str:
    body = canonical_json([tenant, run, seq, prev, type, actor, at, dict(data), key])
    return hashlib.sha256(body.encode()).hexdigest()


def event_hash(tenant: str, run: str, event: AuditEvent) -> str:
    """What ``event``'s hash must be, from its fields and its place on ``tenant/run``'s chain."""
    return _hash(
        tenant, run, event.seq, event.prev, event.type, event.actor, event.at, event.data, event.key
    )


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


class ChainCheck:
    """Checks a run's chain one event at a time, in sequence order, so a chain of any length is
    verified without holding it: ``add`` each event as it is read, ``unreadable`` for an event
    the store could not decode, then ``report``.

    ``anchor`` is the key of the last event the run's checkpoint says it wrote (``pending``: keys
    still in its outbox, not yet appended). Links alone cannot show that the newest events were
    cut off; if the chain lacks the anchor, events were removed from its end.
    """

    def __init__(
        self,
        tenant: str,
        run: str,
        *,
        anchor: str | None = None,
        pending: Collection[str] = (),
    ) -> None:
        self.tenant = tenant
        self.run = run
        self.anchor = anchor
        self.pending = pending
        self.count = 0
        self.problems: list[str] = []
        self._prev = GENESIS
        self._gap = False  # a missing event: links past it are not judged
        self._anchored = False

    def _next(self, seq: int, key: str | None) -> bool:
        """Count an event; whether its links are to be checked."""
        self.count += 1
        if key is not None and key == self.anchor:
            self._anchored = True
        if self._gap:
            return False
        if seq != self.count:
            self.problems.append(f"event {self.count} is missing (found {seq} in its place)")
            self._gap = True
            return False
        return True

    def add(self, event: AuditEvent) -> None:
        if not self._next(event.seq, event.key):
            return
        if event.prev != self._prev:
            self.problems.append(f"event {event.seq} does not follow event {event.seq - 1}")
        e = event
        digest = _hash(self.tenant, self.run, e.seq, e.prev, e.type, e.actor, e.at, e.data, e.key)
        if digest != event.hash:
            self.problems.append(f"event {event.seq} ({event.type}) was altered")
        self._prev = event.hash

    def unreadable(self, seq: int, type: str, key: str | None, hash: str) -> None:
        """An event whose stored data cannot be decoded: it was edited, so its hash cannot
        match; the chain is judged on past it, from the hash it claims."""
        if not self._next(seq, key):
            return
        self.problems.append(f"event {seq} ({type}) was altered: its data is not a JSON object")
        self._prev = hash

    def report(self) -> ChainReport:
        problems = list(self.problems)
        anchor = self.anchor
        if anchor is not None and anchor not in self.pending and not self._anchored:
            problems.append(
                f"events were removed from the end: the checkpoint's last event ({anchor}) "
                "is missing"
            )
        return ChainReport(not problems, self.count, tuple(problems))


def verify(
    tenant: str,
    run: str,
    events: Iterable[AuditEvent],
    *,
    anchor: str | None = None,
    pending: Collection[str] = (),
) -> ChainReport:
    """Check every link: sequence without gaps, each ``prev`` the hash before, each hash right;
    and, given the checkpoint's ``anchor``, that no event was cut off the end (``ChainCheck``)."""
    check = ChainCheck(tenant, run, anchor=anchor, pending=pending)
    for event in events:
        check.add(event)
    return check.report()
