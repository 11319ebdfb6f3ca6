"""The durable loop of ADR-0004: plan -> act -> observe -> verify -> (revise | stop).

``Loop`` is what users and runners hold: it runs or resumes a run to its next stop, reads where a
run stands, and records a person's decisions (a reconcile, an approval). Every phase reads the
checkpoint, does one thing, and writes the next checkpoint; a crash at any point resumes from
the last one. The phases are ``keelgate.core.phases``, the checkpoints they write
``keelgate.core.persistence``, the limits they keep ``keelgate.core.budgets``, the questions
they put to a person ``keelgate.core.approvals``. Every stop has an explicit reason. This module
must never retry a WRITE whose outcome is unknown, never call a tool the loop kind does not
allow, and never put tool arguments into the audit chain or logs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from keelgate.core import failpoints
from keelgate.core.approvals import SPENT, ask_again, decide
from keelgate.core.audit import AuditEvent, ChainCheck, ChainReport
from keelgate.core.gateway import Settlement
from keelgate.core.model import Model
from keelgate.core.phases import Session
from keelgate.core.protocols import Confirmer, RunLock, Stores, Tool
from keelgate.core.spec import LoopSpec, Price
from keelgate.core.state import RunState
from keelgate.core.tracing import NO_TRACING, Attributes, Tracer
from keelgate.core.types import Action, KeyRecord, Outcome
from keelgate.core.values import one_line
from keelgate.errors import InputError, RunBusy, RunNotFound, SettleError, UnreadableEvent

GoalPredicate = Callable[[Sequence[Mapping[str, Any]]], bool]


class Loop:
    """Runs, resumes, reconciles and approves runs over a set of stores.

    ``model`` and ``tools`` are needed only to run; reconciling, approving and reading a run's
    state need the stores alone.
    """

    def __init__(
        self,
        *,
        stores: Stores,
        model: Model | None = None,
        tools: Sequence[Tool] = (),
        confirmer: Confirmer | None = None,
        pricing: Mapping[str, Price] | None = None,
        price_model: str | None = None,
        goal_predicate: GoalPredicate | None = None,
        max_output_tokens: int | None = None,
        busy_wait: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        tracer: Tracer = NO_TRACING,
    ) -> None:
        self.stores = stores
        self.model = model
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise InputError("tools", f"two tools are named {tool.name!r}")
            self.tools[tool.name] = tool
        self.confirmer = confirmer
        self.pricing = dict(pricing or {})
        self.price_model = price_model
        self.goal_predicate = goal_predicate
        self.max_output_tokens = max_output_tokens
        self.busy_wait = busy_wait
        self.clock = clock
        self.tracer = tracer

    # Reading

    def state(self, tenant: str, run: str) -> RunState:
        checkpoint = self.stores.checkpoints.load(tenant, run)
        if checkpoint is None:
            raise RunNotFound(tenant, run)
        return RunState.from_json(checkpoint.state).but(seq=checkpoint.seq)

    def outcome(self, tenant: str, run: str) -> Outcome:
        return self.state(tenant, run).outcome()

    def audit(self, tenant: str, run: str) -> list[AuditEvent]:
        return self.stores.audit.events(tenant, run)

    def verify_audit(
        self, tenant: str, run: str, *, each: Callable[[AuditEvent], None] | None = None
    ) -> ChainReport:
        """Verify the run's chain, anchored to its checkpoint so a cut-off end is detected.

        The chain is read from the store a page at a time and checked as it comes, so its
        length costs time, never memory; ``each`` is given every event read (a caller showing
        the trail needs no second read). The checkpoint is read first: the events it says were
        written committed with it, so they are on the chain by the time it is read, even while
        the run goes on. An event the store cannot decode is a broken link, not an error.
        """
        checkpoint = self.stores.checkpoints.load(tenant, run)
        if checkpoint is None:
            check = ChainCheck(tenant, run)
        else:
            state = checkpoint.state
            pending = {d.get("key") for d in state.get("outbox", []) if d.get("key")}
            check = ChainCheck(tenant, run, anchor=state.get("auditTail"), pending=pending)
        after = 0
        while True:
            try:
                for event in self.stores.audit.iter_events(tenant, run, after=after):
                    check.add(event)
                    if each is not None:
                        each(event)
                break
            except UnreadableEvent as bad:
                check.unreadable(bad.seq, bad.type, bad.key, bad.hash)
                after = bad.seq
        return check.report()

    # Running

    def run_or_resume(
        self,
        spec: LoopSpec,
        *,
        one_iteration: bool = False,
        asked_to_stop: Callable[[], bool] | None = None,
    ) -> Outcome:
        """Start the run, or continue it from its last checkpoint, to its next stop.

        With ``one_iteration``, return at the end of the iteration under way (what a step pod
        does): the outcome then has no stop and phase ``Running``, and the next call plans the
        next iteration. ``asked_to_stop`` says whether the process has been asked to stop (a
        drain's SIGTERM): the call it is in is finished and recorded, and the run is left at
        its next checkpoint, as it stands (no stop recorded, phase ``Running``), for another
        process to go on from. Raises ``RunBusy`` or ``StaleCheckpoint`` if another live
        process is driving the run: then this one has done nothing the other could not see.
        With stores that lock runs (``RunLock``), that is found before anything runs, a READ
        included.
        """
        release = self._lock_run(spec)
        try:
            session = Session(self, spec, asked_to_stop=asked_to_stop)
            return session.drive(one_iteration=one_iteration)
        finally:
            release()

    def _lock_run(self, spec: LoopSpec) -> Callable[[], None]:
        """Become the run's only driver for this call, or raise ``RunBusy``.

        Waits up to ``busy_wait`` first, as the gateway does for a key in flight: a driver that
        just died may take a moment to be seen gone (a server ends a session asynchronously).
        """
        locks: object = self.stores.idempotency
        if not isinstance(locks, RunLock):
            return lambda: None  # the key store's claims remain the only guard
        deadline = time.monotonic() + self.busy_wait
        while (release := locks.lock_run(spec.tenant, spec.run)) is None:
            if time.monotonic() >= deadline:
                raise RunBusy(spec.tenant, spec.run, "another run or resume of it is under way")
            time.sleep(0.05)
        return release

    def price(self) -> Price | None:
        name = self.price_model or (self.model.name if self.model is not None else None)
        return None if name is None else self.pricing.get(name)

    # Settling

    def reconcile(
        self, tenant: str, run: str, action: str, *, executed: bool, by: str
    ) -> KeyRecord:
        """Settle an unknown outcome on a person's word: executed (done) or not (abandoned).

        The decision is attributed and audited; the next ``run_or_resume`` continues the run and
        never retries an abandoned action under its key.
        """
        check_actor(by)
        state = self.state(tenant, run)
        planned = _find_action(state, action)
        if any(p.action == planned.id for p in state.pending):
            raise SettleError(
                run,
                action,
                "is awaiting approval, not an unknown outcome: approve or deny it instead",
            )
        settlement = Settlement(executed, by, "human")
        draft = settlement.draft(planned.id, planned.tool, planned.key)
        together = self.stores.settling
        try:
            if together is not None:
                # One transaction: the decision's event is written by whoever decides (the
                # operator's role), never later by a step pod that finds the key settled.
                record = together.settle(
                    tenant, planned.key, executed=executed, by=by, source="human", event=draft
                )
            else:
                record = self.stores.idempotency.settle(
                    tenant, planned.key, executed=executed, by=by, source="human"
                )
        except SettleError as error:
            if error.run:
                raise
            # The store knows keys, not actions: no key, no call of this action on record (not
            # started, a READ, or a call the tool refused).
            raise SettleError(
                run, action, "has no unknown outcome to settle (no call of it is on record)"
            ) from None
        # With stores that settle with the event it is on the chain already. Otherwise a death
        # here leaves the key settled without its event: the next resume meets the settled key
        # in the gateway, which writes the event from the key's record.
        failpoints.hit("after_settle")
        if together is None:
            self.stores.audit.append(tenant, run, [draft])
        self._tell_decision(
            state,
            f"settle {planned.tool}",
            "keelgate.settlement",
            {
                "keelgate.action": planned.id,
                "keelgate.idempotency_key": planned.key,
                "keelgate.verdict": settlement.verdict,
                "keelgate.source": "human",
                "keelgate.by": by,
            },
        )
        return record

    def approve(
        self,
        tenant: str,
        run: str,
        action: str,
        *,
        approved: bool,
        by: str,
        groups: Collection[str] = (),
        key: str = "",
        ref: str = "",
        definition: str = "",
        note: str = "",
        at: str = "",
    ) -> Outcome:
        """Record one person's decision on an action that awaits approval. Any no denies it
        (it never runs; the model sees it); it runs once its rule's approvals are recorded,
        each by a different person in the rule's groups (``groups``: those the person was
        authenticated in). ``key`` and ``definition``, when given, must be the action's
        idempotency key and its tool definition's fingerprint (the call the person was shown);
        ``ref`` makes recording an Approval object's entry idempotent; ``note`` is the
        person's reason, ``at`` when they decided, if earlier
        (``keelgate.core.approvals.decide``)."""
        check_actor(by)
        state = self.state(tenant, run)
        decided = decide(
            self.stores,
            state,
            action,
            approved=approved,
            by=by,
            groups=groups,
            key=key,
            ref=ref,
            definition=definition,
            note=note,
            at=at,
        )
        outcome = decided.outcome()
        if decided is state:
            return outcome  # this entry was on record already: nothing new to tell
        self._tell_decision(
            state,
            f"approve {action}",
            "keelgate.approval",
            {
                "keelgate.action": action,
                "keelgate.verdict": "approved" if approved else "denied",
                "keelgate.by": by,
            },
        )
        return outcome

    def ask_again(
        self, tenant: str, run: str, action: str, *, round: int, why: str = SPENT
    ) -> RunState:
        """Ask ``action`` afresh in a new round once round ``round`` can decide nothing any
        more (``keelgate.core.approvals.ask_again``); the run's state after it (unchanged when
        it was not so: a deny, approvals still counting, or asked afresh already)."""
        return ask_again(self.stores, self.state(tenant, run), action, round=round, why=why)

    def _tell_decision(
        self, state: RunState, name: str, event: str, attributes: Attributes
    ) -> None:
        """A person's decision, in the run's trace: a short span with the decision as its
        event, wherever it was made (the CLI, the operator, Python). Never its arguments."""
        if state.trace is None or not self.tracer.enabled:
            return
        with self.tracer.run(state.trace).span(name) as span:
            span.event(event, attributes)


def check_actor(by: str, *, field: str = "by") -> None:
    """Who decided goes on the audit chain: a name on one line, nothing else. ``field`` is how
    the caller spells it (the CLI's ``--by``)."""
    one_line(by, field, "the person deciding")


def _find_action(state: RunState, action: str) -> Action:
    planned = state.planned(action)
    if planned is not None:
        return planned
    unknown = ", ".join(u.action for u in state.unknown) or "none"
    raise SettleError(
        state.run, action, f"no such action in the current plan (unknown outcomes: {unknown})"
    )
