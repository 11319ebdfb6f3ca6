"""A run's audit chain as an in-toto Statement, and the offline check of one.

Why it exists: ``keelgate audit --verify`` checks a chain against the store it lives in, and
whoever can write the store can rewrite a whole chain consistently. An auditor outside the
cluster needs the chain in a file, signed by a key the store's writers do not hold, and a check
that needs nothing but that file and the public key. This module builds the Statement (the
predicate type ``PREDICATE_TYPE``, documented in docs/audit.md) and the DSSE pre-authentication
encoding that is signed, and checks a Statement's chain: every event's hash recomputed, every
link, the sequence complete from the run's first event (``loop.started``) to the head the
subject names. Signing and verifying signatures are ``keelgate.adapters.signing``'s; this
module is pure, and must never put anything into a Statement that the audit chain does not
already hold (events carry who and what, never tool arguments or secrets).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from keelgate.core.audit import GENESIS, AuditEvent, decision_refused, hash_holds
from keelgate.core.types import canonical_json

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
#: A chain whose events name their writers (PostgreSQL from migration 6): each event carries
#: ``writer`` and ``writerKind``, and its hash covers them (``keelgate.core.audit``). A verifier
#: of version 1 would read those hashes as altered events, hence the new version.
PREDICATE_TYPE = "https://keelgate.dev/audit-chain/v2"
#: A chain whose store records no writer (SQLite, memory, older events): the first shape, as
#: every release before wrote it.
PREDICATE_TYPE_V1 = "https://keelgate.dev/audit-chain/v1"
PREDICATE_TYPES = (PREDICATE_TYPE, PREDICATE_TYPE_V1)
PAYLOAD_TYPE = "application/vnd.in-toto+json"
#: The first event of every run's chain.
FIRST_EVENT = "loop.started"


def spec_digest(spec: Mapping[str, Any]) -> str:
    """The sha256 of a run's spec, as canonical JSON (what the Statement names it by)."""
    return hashlib.sha256(canonical_json(dict(spec)).encode()).hexdigest()


def statement(
    tenant: str,
    run: str,
    events: Sequence[AuditEvent],
    *,
    spec_sha256: str,
    exported_at: str,
) -> dict[str, Any]:
    """The in-toto Statement of a run's whole chain: its subject is the run, named by its head
    event's hash; its predicate holds every event as the store keeps it."""
    head = events[-1].hash if events else GENESIS
    named = any(event.writer is not None for event in events)
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": f"{tenant}/{run}", "digest": {"sha256": head}}],
        "predicateType": PREDICATE_TYPE if named else PREDICATE_TYPE_V1,
        "predicate": {
            "tenant": tenant,
            "run": run,
            "spec": {"digest": {"sha256": spec_sha256}},
            "exportedAt": exported_at,
            "head": {"seq": events[-1].seq if events else 0, "hash": head},
            "events": [event.to_json() for event in events],
        },
    }


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what a signature covers (the DSSE v1 protocol)."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def check_statement(document: Any) -> list[str]:
    """Every problem of a Statement's chain, one line each naming the event; [] if whole.

    The chain must be complete: events numbered 1, 2, ... without a gap, the first a
    ``loop.started``, each event's hash what its fields give, each ``prev`` the hash before it,
    and the head (and the subject's digest) the last event's hash."""
    if not isinstance(document, Mapping):
        return ["the payload is not a JSON object"]
    if document.get("_type") != STATEMENT_TYPE:
        return [f"the payload is not an in-toto Statement ({STATEMENT_TYPE})"]
    if document.get("predicateType") not in PREDICATE_TYPES:
        return [f"the predicate type is {document.get('predicateType')!r}, not {PREDICATE_TYPE}"]
    predicate = document.get("predicate")
    if not isinstance(predicate, Mapping):
        return ["the Statement has no predicate"]
    tenant, run = predicate.get("tenant"), predicate.get("run")
    raw = predicate.get("events")
    if not isinstance(tenant, str) or not isinstance(run, str) or not isinstance(raw, list):
        return ["the predicate lacks its tenant, run or events"]
    problems: list[str] = []
    events = list(_events(raw, problems))
    if problems:
        return problems
    if not events:
        return ["the chain has no events"]
    problems.extend(_links(tenant, run, events))
    head = events[-1].hash
    claimed = predicate.get("head") or {}
    if claimed.get("hash") != head or claimed.get("seq") != events[-1].seq:
        problems.append(
            f"the head names event {claimed.get('seq')!r} ({str(claimed.get('hash'))[:12]}), "
            f"but the chain ends at event {events[-1].seq} ({head[:12]}): events were removed "
            "from its end, or added"
        )
    subjects = document.get("subject") or []
    digests = [s.get("digest", {}).get("sha256") for s in subjects if isinstance(s, Mapping)]
    if digests != [head]:
        problems.append("the subject's digest is not the chain's head")
    names = [s.get("name") for s in subjects if isinstance(s, Mapping)]
    if names != [f"{tenant}/{run}"]:
        problems.append(f"the subject does not name the run {tenant}/{run}")
    return problems


def _events(raw: Iterable[Any], problems: list[str]) -> Iterable[AuditEvent]:
    for index, item in enumerate(raw, start=1):
        try:
            yield AuditEvent(
                seq=int(item["seq"]),
                type=str(item["type"]),
                actor=str(item["actor"]),
                at=str(item["at"]),
                data=dict(item["data"]),
                key=None if item.get("key") is None else str(item["key"]),
                prev=str(item["prev"]),
                hash=str(item["hash"]),
                writer=None if item.get("writer") is None else str(item["writer"]),
                writer_kind=None if item.get("writerKind") is None else str(item["writerKind"]),
            )
        except (KeyError, TypeError, ValueError):
            problems.append(f"event #{index} of the file is not an audit event")


def _links(tenant: str, run: str, events: Sequence[AuditEvent]) -> Iterable[str]:
    prev = GENESIS
    for expected, event in enumerate(events, start=1):
        where = f"event {event.seq} ({event.type})"
        if event.seq != expected:
            yield f"{where}: expected event {expected} here: events are missing or out of order"
        if expected == 1 and event.type != FIRST_EVENT:
            yield f"{where}: the chain does not start with {FIRST_EVENT}: its start was cut off"
        if event.prev != prev:
            yield f"{where}: does not follow the event before it (prev {event.prev[:12]})"
        if not hash_holds(tenant, run, event):
            yield f"{where}: its content does not match its hash (changed after it was written)"
        refused = decision_refused(event)
        if refused is not None:
            yield refused
        prev = event.hash


#: The operator's signature over a run's chain head, put on the chain itself as an event.
HEAD_EVENT = "audit.head_signed"
HEAD_PREDICATE_TYPE = "https://keelgate.dev/audit-head/v1"


def head_statement(tenant: str, run: str, seq: int, head: str, *, signed_at: str) -> dict[str, Any]:
    """The Statement the operator signs when a run stops: "the chain of tenant/run was this,
    up to event ``seq`` whose hash is ``head``". Each event's hash covers every event before
    it, so a later rewrite of any of them no longer leads to this head."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": f"{tenant}/{run}", "digest": {"sha256": head}}],
        "predicateType": HEAD_PREDICATE_TYPE,
        "predicate": {
            "tenant": tenant,
            "run": run,
            "head": {"seq": seq, "hash": head},
            "signedAt": signed_at,
        },
    }


def check_signed_head(
    tenant: str, run: str, signed: Mapping[str, Any], hashes: Mapping[int, str]
) -> list[str]:
    """Problems of one signed head (the Statement its envelope carried, already verified under
    the key) against the chain as the store has it (``hashes``: seq -> hash)."""
    where = "a signed head"
    if signed.get("predicateType") != HEAD_PREDICATE_TYPE:
        return [f"{where} is not a Keelgate head Statement"]
    predicate = signed.get("predicate") or {}
    head = predicate.get("head") or {}
    seq, digest = head.get("seq"), head.get("hash")
    if predicate.get("tenant") != tenant or predicate.get("run") != run:
        return [f"{where} (event {seq}) names another run"]
    if not isinstance(seq, int) or seq not in hashes:
        return [f"the signed head names event {seq}, which the chain no longer has"]
    if hashes[seq] != digest:
        return [
            f"event {seq} is not the one that was signed ({str(digest)[:12]} signed, "
            f"{hashes[seq][:12]} now): the chain up to it was rewritten"
        ]
    return []
