"""What an Approval's entries are: each decision the object holds, its identity, and when it
was made.

Why it exists: the Approval reconciler records each entry once, and the finalizer on the object
(``approval_finalizer``) lets a deletion through only once every entry is on record; both must
name an entry alike (a ref no copy, move or re-created object can take over), match it alike
against what the store holds, and date it alike, or the finalizer would release an object whose
decision the reconciler has yet to record. Pure: it reads an object's body and the store's
decisions, and never judges whether an entry counts under a rule (``keelgate.core.approvals``
does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from keelgate.core.approvals import seconds
from keelgate.core.audit import utc_iso_millis
from keelgate.core.state import Decision
from keelgate.kube.times import parse_time


@dataclass(frozen=True)
class Entry:
    """One decision the object holds: an entry of ``spec.decisions``, or the one-decision form."""

    ref: str  # its identity: what the store records it under
    approved: bool
    by: str
    groups: tuple[str, ...]
    note: str = ""
    at: str = ""  # the moment the entry says it was made ("": it says none)
    definition: str = ""  # the definition of the call it was made on, as shown ("": none)
    legacy: str = ""  # the ref an earlier release recorded it under ("": none could be)


def entries(body: Mapping[str, Any]) -> list[Entry]:
    """The object's decisions in order (the one-decision form first), each with its identity:
    the object's uid and the version of the object the entry was added to, which admission
    stamps on each new entry (``id``, ``spec.decisionId``: the resourceVersion it was appended
    over; one entry per request, so no two share one), so no copy, move or re-created object
    can make one entry pass for another. An entry with no stamp (a cluster without the mutating
    admission policy) is named by the object's uid and its place in the list, which admission
    and the CRD keep (entries are only appended, each old one unchanged in its place)."""
    meta = body.get("metadata") or {}
    name = str(meta.get("name") or "")
    uid = str(meta.get("uid") or name)
    spec = body.get("spec") or {}
    found: list[Entry] = []
    if spec.get("approved") is not None and str(spec.get("by") or "").strip():
        stamp = str(spec.get("decisionId") or "")
        found.append(
            Entry(
                f"{uid}/{stamp}" if stamp else f"{uid}#spec",
                spec["approved"] is True,
                str(spec["by"]),
                (),
                note=str(spec.get("note") or ""),
                at=str(spec.get("decidedAt") or ""),
                definition=str(spec.get("definition") or ""),
                legacy=f"{name}#spec",
            )
        )
    seen: dict[str, int] = {}
    for index, item in enumerate(spec.get("decisions") or ()):
        by = str(item.get("by") or "")
        if not by.strip() or not isinstance(item.get("approved"), bool):
            continue  # the schema refuses such an entry: nothing to record
        seen[by] = seen.get(by, 0) + 1
        stamp = str(item.get("id") or "")
        found.append(
            Entry(
                f"{uid}/{stamp}" if stamp else f"{uid}#{index}",
                item["approved"] is True,
                by,
                tuple(str(g) for g in item.get("groups") or ()),
                note=str(item.get("note") or ""),
                at=str(item.get("at") or ""),
                definition=str(item.get("definition") or ""),
                legacy="" if stamp else f"{name}#{by}#{seen[by]}",
            )
        )
    return found


def recorded_refs(body: Mapping[str, Any], decisions: Sequence[Decision]) -> set[str]:
    """The refs of ``body``'s entries that the store holds already. An entry an earlier
    release recorded (by its name and its place among its maker's entries) is matched by that
    ref only if the object existed when the decision was recorded: an object made later (a run
    deleted and applied again) is another object, whose entries are new decisions."""
    refs = {d.ref: d for d in decisions if d.ref}
    created = str((body.get("metadata") or {}).get("creationTimestamp") or "")
    found: set[str] = set()
    for entry in entries(body):
        if entry.ref in refs:
            found.add(entry.ref)
            continue
        earlier = refs.get(entry.legacy) if entry.legacy else None
        if earlier is not None and created and seconds(created) <= seconds(earlier.at):
            found.add(entry.ref)
    return found


def written_at(body: Mapping[str, Any]) -> float | None:
    """When the API server last took a write of the Approval other than its status, as its
    field managers' records say (``metadata.managedFields[].time``, whole seconds; None when it
    keeps none): no entry of the object was made later. Each write is recorded under its
    manager with its time, and the latest is at or after the last entry's. A client may write
    these records itself: a time too early makes approvals count for less, one too late is
    bounded by the operator's own look."""
    meta = body.get("metadata") or {}
    found = [
        parse_time(str(entry.get("time") or ""))
        for entry in meta.get("managedFields") or ()
        if isinstance(entry, Mapping) and not entry.get("subresource")
    ]
    moments = [moment.timestamp() for moment in found if moment is not None]
    return max(moments) if moments else None


def made_at(stated: str, seen: float) -> str:
    """When an entry's decision counts from: the earlier of the moment it states (a client's
    word, RFC 3339) and ``seen``, the earliest moment it is known to have been there (when the
    operator first saw it, or the object's last write before that). Admission cannot stamp a
    time (its expressions have no clock), and a client's word may be wrong either way: the
    earlier one can only make an approval count for less, never longer."""
    first = utc_iso_millis(seen)
    if not stated:
        return first
    try:
        return stated if seconds(stated) < seen else first
    except ValueError:
        return first
