"""Reconciliation and Approval (contract section 5): the objects a person edits to settle a stop.

The operator creates one per unknown-outcome WRITE (Reconciliation) or per action that needs a
person's yes (Approval); a human sets ``executed``/``approved`` and ``by``. These models only
describe the objects: they must never settle anything themselves. Immutability once decided and
``by`` matching the requesting user are enforced by the CRD's rules and the admission policy.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictBool, StringConstraints, model_validator

from keelgate.core.values import MAX_DECISIONS, MAX_GROUPS, ActionId, NonNegativeInt
from keelgate.manifest.base import (
    NOT_BLANK,
    STATUS_CONFIG,
    Condition,
    DnsSubdomain,
    GroupName,
    KeelgateModel,
    NonEmpty,
    ObjectMeta,
    Timestamp,
    ToolName,
    rule_error,
)


class ReconciliationSpec(KeelgateModel):
    run_name: DnsSubdomain = Field(description="The AgentRun (or tick) the action belongs to.")
    action: ActionId = Field(description="The action's id within the run, e.g. '3:0'.")
    tool: ToolName = Field(description="The tool the action called.")
    idempotency_key: NonEmpty = Field(description="The key the call carried downstream.")
    executed: StrictBool | None = Field(
        default=None,
        description="Set by a person: true (it ran: record it done) or false (abandon it; it "
        "is never retried under this key). Cannot change once set, but from false to true "
        "before it is settled (a person who looked too early, and then found that it ran).",
    )
    by: str = Field(default="", description="Who decided; must be the requesting user.")
    note: str = Field(default="", description="Why, for the audit trail's readers.")
    decided_at: Timestamp = Field(
        default="",
        description="When the person looked at what the call acts on (RFC 3339), as their "
        "client says. not executed counts only if written after status.notExecutedAfter: one "
        "written earlier is refused, and its maker writes it again (this moment, new) once "
        "they have looked again.",
    )

    @model_validator(mode="after")
    def _decided_by_someone(self) -> ReconciliationSpec:
        if self.executed is not None and not self.by.strip():
            raise rule_error(("by",), "must name who decided when executed is set")
        return self


class ReconciliationStatus(KeelgateModel):
    model_config = STATUS_CONFIG

    phase: Literal["Pending", "Settled"] = Field(
        default="Pending", description="Pending | Settled."
    )
    verdict: Literal["", "executed", "abandoned"] = Field(
        default="", description="executed | abandoned, once settled."
    )
    source: Literal["", "human", "confirmer"] = Field(
        default="", description="human | confirmer: on whose authority."
    )
    settled_by: str = Field(default="", description="The person or confirmer that settled it.")
    settled_at: Timestamp = Field(default="", description="When it was settled (RFC 3339).")
    not_executed_after: Timestamp = Field(
        default="",
        description="Until this moment (RFC 3339, on the store's clock) the call may still be "
        "sent by a process that was held up: executed may be settled at once, not executed "
        "only by a look after it (one written earlier is refused: the call may have gone out "
        "after it).",
    )
    held_generation: NonNegativeInt = Field(
        default=0,
        description="The generation whose not executed the operator met before "
        "notExecutedAfter: written too early, it never counts.",
    )
    message: str = Field(default="", description="What the operator is doing with the decision.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready (settled) and Stalled (the decision was refused, or its run does not "
        "exist: message says why).",
    )


class Reconciliation(KeelgateModel):
    api_version: Literal["keelgate.dev/v1alpha1"] = Field(description="keelgate.dev/v1alpha1.")
    kind: Literal["Reconciliation"] = Field(description="Reconciliation.")
    metadata: ObjectMeta = Field(description="Named <run>-<iteration>-<tool> by the operator.")
    spec: ReconciliationSpec = Field(description="The action to settle, and the decision.")
    status: ReconciliationStatus | None = Field(default=None, description="Set by the operator.")


class ApprovalDecision(KeelgateModel):
    """One person's decision, appended to an Approval's decisions: admission checks that by is
    the requesting user and that each group named is one the API server authenticated them in;
    once added it never changes (the list is append-only)."""

    by: Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=NOT_BLANK)] = Field(
        description="Who decides: the requesting user's own name."
    )
    groups: list[GroupName] = Field(
        default_factory=list,
        max_length=MAX_GROUPS,
        description="The groups the API server authenticated the person in (each must be the "
        "requesting user's; kubectl keelgate approve names them all).",
    )
    approved: StrictBool = Field(description="true: approve (run it); false: deny it (final).")
    note: Annotated[str, StringConstraints(max_length=1024)] = Field(
        default="",
        description="Why, for the audit trail's readers (and the Events and the inbox); a rule "
        "with reasonToDeny refuses a deny without one.",
    )
    at: Timestamp = Field(
        default="",
        description="When the person decided (RFC 3339), as their client says: an approval "
        "counts from the earlier of this and when the operator first saw the entry.",
    )
    definition: str = Field(
        default="",
        description="The fingerprint of the tool's definition the person was shown (the "
        "Approval's status.definition): a decision on another one is not counted. Admission "
        "fills it from the status when the entry leaves it out.",
    )
    id: str = Field(
        default="",
        description="Set by admission: the resourceVersion of the Approval the entry was added "
        "to (one entry per request, so no two entries of an object share one), its identity "
        "with the object's uid. A client may not set another.",
    )


class ApprovalSpec(KeelgateModel):
    run_name: DnsSubdomain = Field(description="The AgentRun (or tick) waiting for approval.")
    action: ActionId = Field(description="The action's id within the run, e.g. '2:0'.")
    tool: ToolName = Field(description="The tool the action would call.")
    idempotency_key: str = Field(
        default="",
        description="The key of the call to approve (a digest of its tool and arguments), set "
        "by the operator: a decision counts only for the call it was made for.",
    )
    decisions: list[ApprovalDecision] = Field(
        default_factory=list,
        max_length=MAX_DECISIONS,
        description="People's decisions, one entry each, appended (never changed or removed). "
        "Any deny denies; the call runs once the tool's rule has its approvals.",
    )
    approved: StrictBool | None = Field(
        default=None,
        description="The one-decision form: true (run it) or false (deny it; the model sees the "
        "denial), with by; counts as a decision with no groups. Cannot change once set.",
    )
    by: str = Field(default="", description="Who decided; must be the requesting user.")
    note: str = Field(default="", description="Why, for the audit trail's readers.")
    decided_at: Timestamp = Field(
        default="",
        description="The one-decision form: when the person decided (RFC 3339), as their "
        "client says (the earlier of this and when the operator first saw it counts).",
    )
    decision_id: str = Field(
        default="",
        description="Set by admission with approved: the resourceVersion of the Approval it was "
        "set on, the decision's identity with the object's uid. A client may not set another.",
    )
    definition: str = Field(
        default="",
        description="The one-decision form: the fingerprint of the tool's definition the person "
        "was shown (the Approval's status.definition); an approval made on another one is not "
        "counted. Admission fills it from the status when approved is set without it; it "
        "cannot change once approved is set.",
    )

    @model_validator(mode="after")
    def _decided_by_someone(self) -> ApprovalSpec:
        if self.approved is not None and not self.by.strip():
            raise rule_error(("by",), "must name who decided when approved is set")
        return self


class ApprovalStatus(KeelgateModel):
    model_config = STATUS_CONFIG

    phase: Literal["Pending", "Settled"] = Field(
        default="Pending", description="Pending | Settled."
    )
    verdict: Literal["", "approved", "denied", "expired"] = Field(
        default="",
        description="approved | denied, once settled; expired: every approval on it stopped "
        "counting before the call ran, and the action is asked afresh on askedAgainAs.",
    )
    approvals: NonNegativeInt = Field(
        default=0, description="Approvals recorded that count now, each by a different person."
    )
    required: NonNegativeInt = Field(default=0, description="Approvals the call needs.")
    progress: str = Field(default="", description="Approvals of those needed, e.g. '1 of 2'.")
    approved_by: list[str] = Field(
        default_factory=list, description="Who gave the approvals that count."
    )
    expires_at: Timestamp = Field(
        default="",
        description="When the first approval that counts stops counting (RFC 3339): unless "
        "the call has run by then, it is asked for again.",
    )
    asks: str = Field(default="", description="The rule, in words: who must approve.")
    definition: str = Field(
        default="",
        description="The fingerprint of the tool's definition the call is bound to (its method, "
        "URL, headers' names, server, callable, confirmer): approvals count for it only, and an "
        "edit of the tool that changes it asks again.",
    )
    service_accounts: StrictBool = Field(
        default=False,
        description="Whether ServiceAccounts may decide (the rule's serviceAccounts): admission "
        "refuses their entries otherwise.",
    )
    decided: NonNegativeInt = Field(
        default=0,
        description="Decisions on record in the store for the action (each is told once).",
    )
    settled_by: str = Field(default="", description="The person (or people) that decided.")
    settled_at: Timestamp = Field(default="", description="When it was decided (RFC 3339).")
    message: str = Field(default="", description="What the operator is doing with the decision.")
    round: NonNegativeInt = Field(
        default=0,
        description="The round it asked in, once settled as expired (1: the first asking).",
    )
    asked_again_as: str = Field(
        default="",
        description="Settled as expired: the Approval the action is asked on now (a new round); "
        "no approval added here counts there, a deny added here still denies.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready (decided) and Stalled (the decision was refused, or its run does not "
        "exist: message says why).",
    )


class Approval(KeelgateModel):
    api_version: Literal["keelgate.dev/v1alpha1"] = Field(description="keelgate.dev/v1alpha1.")
    kind: Literal["Approval"] = Field(description="Approval.")
    metadata: ObjectMeta = Field(description="Named by the operator.")
    spec: ApprovalSpec = Field(description="The action to decide, and the decision.")
    status: ApprovalStatus | None = Field(default=None, description="Set by the operator.")
