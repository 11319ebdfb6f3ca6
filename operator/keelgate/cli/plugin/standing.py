"""Whether a person can decide something that waits, and if not, why: one line, as they read it.

Why it exists: `kubectl keelgate pending` and the decision inbox show what waits for you apart
from what you cannot decide (you created the run and its rule says not the creator; you are in
no group it names; you decided already; you are a ServiceAccount and the rule counts people),
and `kubectl keelgate approve` refuses the same decisions before writing anything. All of them
read the rule in force (the run's ``status.pendingApprovals[].rule``, never the spec, which its
creator may have weakened since) and ask the one judge, ``keelgate.core.approvals.refusal``,
which the operator asks too: what a page offers is what would count. This module only reads
objects already fetched: it must never call the API server, and never judge by a rule of its own.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from keelgate.core.approvals import refusal
from keelgate.core.types import ApprovalRule


@dataclass(frozen=True)
class Standing:
    """What one person may do about one waiting Reconciliation or Approval."""

    #: They may decide it as it waits to be decided: settle it either way, or approve it (and
    #: deny it, unless ``why_not_deny`` says otherwise).
    decide: bool
    #: They may deny it, though it is not theirs to approve (the run's creator under a
    #: notCreator rule, someone whose approval counts already).
    deny: bool
    #: Why it is not theirs to decide, in one line ("" when it is).
    why: str = ""
    #: The rule asks a reason to deny: a deny needs a note.
    reason_to_deny: bool = False

    def to_json(self) -> dict[str, Any]:
        """As ``pending -o json`` carries it beside each object (``you``)."""
        shown: dict[str, Any] = {"mayDecide": self.decide}
        if not self.decide:
            shown.update(mayDeny=self.deny, why=self.why)
        if self.reason_to_deny:
            shown["reasonToDeny"] = True
        return shown


def rbac_refused(namespace: str, kind: str, reason: str = "") -> Standing:
    """The API server's access review says they may not patch such objects there."""
    why = f"RBAC: you may not patch {kind.lower()}s in {namespace}"
    return Standing(False, False, f"{why} ({reason})" if reason else why)


def asked_of(run: Mapping[str, Any], action: str) -> tuple[Mapping[str, Any] | None, ApprovalRule]:
    """What ``run`` asks of ``action`` now: its entry of ``status.pendingApprovals`` (None:
    the run does not wait for it) and the rule in force there (one approval if it names none)."""
    status = run.get("status") or {}
    asked = next(
        (p for p in status.get("pendingApprovals") or () if str(p.get("action")) == action),
        None,
    )
    raw = (asked or {}).get("rule")
    return asked, ApprovalRule.from_json(raw) if isinstance(raw, Mapping) else ApprovalRule()


def not_waiting(run: Mapping[str, Any]) -> str:
    """ "is not waiting for approval now (the run is Stopped, budget_exhausted)"."""
    status = run.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    reason = str(status.get("stopReason") or "")
    where = f"{phase}, {reason}" if reason else phase
    return f"is not waiting for approval now (the run is {where})"


def creator_of(run: Mapping[str, Any]) -> str:
    """The run's creator as its annotation says, read where the operator reads it."""
    # Here, not at the top: keelgate.kube.resources loads the manifest models (pydantic, tens
    # of milliseconds), which --help, completion and the commands that list do without.
    from keelgate.kube.resources import creator_of as recorded

    return recorded(run)


def counted_of(approval: Mapping[str, Any], asked: Mapping[str, Any] | None) -> tuple[str, ...]:
    """Whose approvals count now, as the operator shows them on the Approval (else the run)."""
    status = approval.get("status") or {}
    return tuple(str(b) for b in status.get("approvedBy") or (asked or {}).get("approvedBy") or ())


def made_already(
    spec: Mapping[str, Any], status: Mapping[str, Any], user: str, decision: bool, definition: str
) -> bool:
    """Whether the user's newest entry is this very decision, on the call as it is bound now,
    and the operator has yet to record it (it has recorded fewer decisions than the object
    holds): then it was made, and nothing is to be added."""
    mine = [d for d in spec.get("decisions") or () if d.get("by") == user]
    if not mine or mine[-1].get("approved") is not decision:
        return False
    shown = str(mine[-1].get("definition") or "")
    if shown and definition and shown != definition:
        return False  # made on the tool before an edit: it counts for nothing now
    entries = len(spec.get("decisions") or ()) + (spec.get("approved") is not None)
    return not decision or int(status.get("decided") or 0) < entries


def of_approval(
    approval: Mapping[str, Any],
    run: Mapping[str, Any] | None,
    *,
    user: str,
    groups: Collection[str],
) -> Standing:
    """``user``'s standing on a waiting Approval of ``run`` (None: the run is not to be
    found), with the groups the API server authenticated them in, by the rule in force."""
    spec, status = approval.get("spec") or {}, approval.get("status") or {}
    if run is None:
        name = str(spec.get("runName") or "")
        return Standing(False, False, f"its run {name} is not found: nothing waits to run")
    action = str(spec.get("action") or "")
    asked, rule = asked_of(run, action)
    if asked is None:
        return Standing(False, False, f"{action} {not_waiting(run)}")
    creator = creator_of(run)
    counted = counted_of(approval, asked)
    definition = str(asked.get("definition") or status.get("definition") or "")
    why = refusal(rule, approved=True, by=user, groups=groups, creator=creator, counted=counted)
    # A deny is judged as made with the note the rule asks for: the form asks for it.
    deny = (
        refusal(
            rule,
            approved=False,
            by=user,
            groups=groups,
            creator=creator,
            counted=counted,
            note="-" if rule.reason_to_deny else "",
        )
        is None
    )
    if why is not None and not deny:
        return Standing(False, False, why)  # not theirs at all: in no group, a ServiceAccount
    unrecorded = (
        "the operator has not recorded it (the Approval's message says why if it refused it)"
    )
    if made_already(spec, status, user, False, definition):
        return Standing(False, False, f"you denied it; {unrecorded}")
    if user in counted:
        progress = str(status.get("progress") or "")
        said = f" ({progress})" if progress else ""
        return Standing(
            False, deny, f"you approved it already{said}: it waits for others", rule.reason_to_deny
        )
    if made_already(spec, status, user, True, definition):
        return Standing(False, deny, f"you approved it; {unrecorded}", rule.reason_to_deny)
    if why is None:
        return Standing(True, deny, "", rule.reason_to_deny)
    return Standing(False, deny, f"{why}; you may deny it", rule.reason_to_deny)
