"""The Approval reconciler: people's decisions, from the object into the store, one by one.

Why it exists: people decide an Approval by appending to its ``spec.decisions`` (or, the
one-decision form, setting ``spec.approved`` and ``spec.by``); admission has made sure each
entry names the user who added it and only groups the API server authenticated them in. This
reconciler records each entry in the store through ``Loop.approve`` (the same rule as
``keelgate approve``: a different person each, from the rule's groups, not the creator if it
says so, for the call whose idempotency key the object names), once (each entry has its own
``ref``), and shows on the object what the store holds: "1 of 2", who counts, when the first
approval stops counting, or Settled approved or denied. The store decides, never the object: a
decision already recorded elsewhere (``keelgate approve``) is shown too, and an entry the loop
refuses is shown and tried again later. An action asked again (its approvals expired before the
call ran) is asked afresh in a new round (below): no approval of the old one counts.

Rounds: once no decision on the Approval can count any more (every approval on it expired or
was made on an earlier definition, nobody denied, the action still waits), or it holds as many
entries as it takes, this reconciler asks the store to ask the action afresh
(``Loop.ask_again``): a new round, with its own Approval (``naming.action_object_name``'s
``-r<round>``), which the run's status, the CLI, the inbox and the notifications follow. The old
object is shown Settled with verdict ``expired`` and the name of the new one, kept for audit;
an approval added to it later is never recorded (it is told, in a Warning and its message),
while a deny added to it is recorded and denies (a no is never lost). An object of a round the
store has not reached records nothing until it does. This module must never record a decision
nobody made, record an entry twice, change one already recorded, or count an approval of one
round in another. How an entry is named and dated is ``approval_entries``'s, which the
finalizer on the object reads alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from keelgate.core.approvals import FULL, SPENT, tally
from keelgate.core.state import RunState
from keelgate.core.types import ApprovalRule
from keelgate.core.values import MAX_DECISIONS
from keelgate.errors import InputError, RunNotFound, SettleError, StoreUnavailable
from keelgate.kube.controller.approval_entries import (
    Entry,
    entries,
    made_at,
    recorded_refs,
    written_at,
)
from keelgate.kube.controller.approval_events import ApprovalEvents
from keelgate.kube.controller.approval_sightings import Sightings
from keelgate.kube.controller.approval_status import Shown, shown
from keelgate.kube.controller.context import ControllerContext
from keelgate.kube.controller.outcomes import REST, Requeue, Result
from keelgate.kube.controller.ownership import HeldElsewhere
from keelgate.kube.controller.ports import JSON, Key
from keelgate.kube.controller.refusals import (
    REFUSED_RETRY,
    REFUSED_RETRY_MAX,
    not_recordable,
    refuse,
    show_status,
    warn,
    with_generation,
)
from keelgate.kube.naming import action_object_name, approval_round
from keelgate.kube.status import condition
from keelgate.kube.times import now

#: The status fields this reconciler decides (the rest: conditions, settledAt, are kept).
_SHOWN = (
    "phase",
    "verdict",
    "approvals",
    "required",
    "progress",
    "approvedBy",
    "expiresAt",
    "asks",
    "definition",
    "serviceAccounts",
    "settledBy",
    "decided",
    "message",
)


def _counted_against(state: RunState, action: str, view: Shown) -> ApprovalRule:
    """The rule each decision recorded now is counted against in what people are told: the
    one the run waits on, or, once the last approval met it (nothing waits any more), the
    one it was planned under, asking the count the object shows ("2 of 2", never "approved
    by carol" alone)."""
    if view.pending is not None:
        return view.pending.rule or ApprovalRule()
    planned = state.planned(action)
    base = (planned.approval_rule() if planned is not None else None) or ApprovalRule()
    need = int(view.status.get("required") or 0)
    return replace(base, required=need) if need > base.required else base


@dataclass(frozen=True)
class Looked:
    """What one look at an Approval came to: when to look again, and the run's state as the
    look left it (None: the run is not on record, or the look did not need it), which the
    finalizer judges by (``approval_finalizer``): the state each entry was just tried
    against, with no store read of its own."""

    result: Result
    state: RunState | None


class ApprovalReconciler:
    def __init__(self, context: ControllerContext) -> None:
        self._context = context
        self._events = ApprovalEvents(context)
        # Entries seen before they could be recorded, and looks that found the store away.
        self._sightings = Sightings(context.clock)

    def look(self, key: Key) -> Looked:
        """Record the object's new decisions, show what the store holds, wake the run."""
        context = self._context
        _, namespace, name = key
        gone = context.cache.tombstone(namespace, name, kind="Approval")
        if gone is not None:
            self._record_gone(gone)
            context.cache.forget_tombstone(namespace, name, kind="Approval")
        body = context.cache.get("Approval", namespace, name)
        if body is None:
            self._sightings.store_reached(namespace, name)
            return Looked(REST, None)
        try:
            looked = self._look(body)
        except StoreUnavailable as error:
            # Seen now, though nothing can be recorded: each entry counts from this look at the
            # latest, however long the store stays away (not from when it is back).
            written, found = written_at(body), entries(body)
            for entry in found:
                self._sightings.seen(entry.ref, written)
            holding = context.holding
            since = self._sightings.store_away(namespace, name)
            if holding.in_doubt() or holding.away_too_long(since):
                # The run may be driven by another cluster (this operator's hold is in doubt,
                # or it holds nothing it could confirm): a decision added here, not recorded,
                # is shown so where people look (a blip of the store is not).
                not_recordable(context, body, found, error)
            raise  # tried again by the worker's back-off, as any look the store's absence ends
        self._sightings.store_reached(namespace, name)
        return looked

    def _look(self, body: JSON) -> Looked:
        context = self._context
        namespace = str(body["metadata"]["namespace"])
        spec, old = body.get("spec") or {}, body.get("status") or {}
        run_name, action = str(spec.get("runName", "")), str(spec.get("action", ""))
        state = context.run_state(namespace, run_name)
        if state is not None:
            here, asked = approval_round(body), state.round_of(action)
            if here < asked:
                return self._superseded(body, state, here, asked)
            if here > asked:
                return Looked(self._not_asked_yet(body, run_name, here, asked), state)
        waiting = state is not None and any(p.action == action for p in state.pending)
        if old.get("phase") == "Settled" and not waiting:
            # Decided, and not asked again: an entry added since counts for nothing (admission
            # refuses one where its policy is installed), and is told so once.
            return Looked(self._after_settled(body, run_name, action, old, state), state)
        found = entries(body)
        if state is None:
            if not found:
                return Looked(REST, None)  # waiting for a person (its run has no checkpoint yet)
            refused_run = refuse(
                context,
                "Approval",
                body,
                run_name,
                "RunNotFound",
                str(RunNotFound(namespace, run_name)),
            )
            return Looked(refused_run, None)
        told_before = len(state.approvals.get(action, ()))
        state, refused = self._record(body, found, state)
        at = context.clock()
        view = shown(state, action, at=at, required=int(old.get("required") or 0))
        if view is None:
            if refused:
                why = "; ".join(refused)
                return Looked(
                    refuse(context, "Approval", body, run_name, "ApprovalRefused", why), state
                )
            return Looked(REST, state)
        self._tell(body, run_name, spec, old, state, view)
        if view.tally is not None and view.pending is not None:
            full = len(found) >= MAX_DECISIONS
            if (view.tally.spent or full) and not isinstance(
                context.holding.hold(namespace, run_name), HeldElsewhere
            ):
                # Nothing on this object can count any more (or nothing more fits on it):
                # the action is asked afresh, on a new object.
                after = context.loop.ask_again(
                    namespace,
                    run_name,
                    action,
                    round=view.pending.round,
                    why=FULL if full else SPENT,
                )
                if after is not state:
                    # The run's reconcile makes the new round's Approval; this one says so.
                    context.enqueue(("AgentRun", namespace, run_name), 0.0)
                    return self._superseded(body, after, view.pending.round, after.round_of(action))
        status = dict(view.status)
        refusing = bool(refused) and not view.settled
        if refusing:
            # Shown, not Stalled: the approval still waits for people whose decisions count.
            status["message"] = f"{status.get('message', '')}; not counted: {'; '.join(refused)}"
        told_before_now = old.get("message") == status.get("message")
        result = self._show(body, run_name, old, status, refusing=refusing)
        if result is not None:
            return Looked(result, state)
        if view.settled or len(state.approvals.get(action, ())) != told_before:
            # The run goes on (settled), or its status shows the new count.
            context.enqueue(("AgentRun", namespace, run_name), 0.0)
        if refusing:
            # A refusal may pass (the run was between stops): tried again, soon the first time.
            return Looked(Requeue(REFUSED_RETRY_MAX if told_before_now else REFUSED_RETRY), state)
        if view.tally is not None and view.tally.expires_at is not None:
            # Look again when the first approval stops counting: the object then says so.
            return Looked(Requeue(max(1.0, view.tally.expires_at - at + 0.5)), state)
        return Looked(REST, state)

    def _record(
        self, body: JSON, found: Sequence[Entry], state: RunState
    ) -> tuple[RunState, list[str]]:
        """Record each of ``found`` (the entries of ``body``) that the store does not hold yet;
        the run's state after them, and the refusals, one line each."""
        context = self._context
        namespace = str(body["metadata"]["namespace"])
        spec = body.get("spec") or {}
        run_name, action = str(spec.get("runName", "")), str(spec.get("action", ""))
        refused: list[str] = []
        recorded = recorded_refs(body, state.approvals.get(action, ()))
        written = written_at(body)
        # Denies first: a no on the object that the store does not hold yet was made before
        # any approval recorded with it here, and any no denies; recorded in list order, an
        # approval made earlier (refused then, counted now: a rule edited) could complete the
        # count first, and the later no be refused as "already approved" (a no lost).
        for entry in sorted(found, key=lambda e: e.approved):
            if entry.ref in recorded:
                self._sightings.recorded(entry.ref)
                continue
            seen = self._sightings.seen(entry.ref, written)
            held = context.holding.hold(namespace, run_name)
            if isinstance(held, HeldElsewhere):
                # The decision is written by whoever holds the run: not counted here (yet).
                refused.append(f"{entry.by}: {held.refusal()}")
                continue
            try:
                context.loop.approve(
                    namespace,
                    run_name,
                    action,
                    approved=entry.approved,
                    by=entry.by,
                    groups=entry.groups,
                    key=str(spec.get("idempotencyKey") or ""),
                    ref=entry.ref,
                    definition=entry.definition,
                    note=entry.note,
                    at=made_at(entry.at, seen),
                )
            except (SettleError, RunNotFound, InputError) as error:
                refused.append(f"{entry.by}: {error}")
            state = context.run_state(namespace, run_name) or state
            recorded = recorded_refs(body, state.approvals.get(action, ()))
            if entry.ref in recorded:
                self._sightings.recorded(entry.ref)
        return state, refused

    def _superseded(self, body: JSON, state: RunState, here: int, asked: int) -> Looked:
        """An Approval of an earlier round than the one the store asks in: its denies are
        recorded (a no is never lost, wherever it was added), its approvals never (none of an
        earlier round counts; one added after the new round began is told, once); it shows
        Settled, verdict expired, and the name of the round's Approval people decide on now;
        with the run's state after its denies."""
        context = self._context
        meta, spec, old = body["metadata"], body.get("spec") or {}, body.get("status") or {}
        namespace = str(meta["namespace"])
        run_name, action = str(spec.get("runName", "")), str(spec.get("action", ""))
        tool = str(spec.get("tool", ""))
        found = entries(body)
        denies = [e for e in found if not e.approved]
        refused: list[str] = []
        if denies:
            before = len(state.approvals.get(action, ()))
            state, refused = self._record(body, denies, state)
            if len(state.approvals.get(action, ())) != before:
                context.enqueue(("AgentRun", namespace, run_name), 0.0)
        now_asked = action_object_name(run_name, action, tool, round=asked)
        # Its approvals left the store with its round (``ask_again``); any recorded now is
        # one of the current round with the same ref, which no entry of this object can have.
        recorded = recorded_refs(body, state.approvals.get(action, ()))
        late = list(dict.fromkeys(e.by for e in found if e.approved and e.ref not in recorded))
        said = (
            f"asked afresh as approval {now_asked} (round {asked}): no approval on this one "
            f"(round {here}) can count any more (each expired, or was made on an earlier "
            "definition of the tool) and the call has not run; decide there"
        )
        denied = [e.by for e in denies if e.ref in recorded]
        if denied:
            said += f"; the deny of {', '.join(denied)} added here is recorded: it denies"
        if refused:
            said += f"; not recorded: {'; '.join(refused)}"
        if late:
            said += (
                f"; approvals on it count no more ({', '.join(late)}): an approval counts only "
                "on its round's Approval"
            )
        status: JSON = {
            **{k: old[k] for k in ("required", "asks", "definition") if k in old},
            "phase": "Settled",
            "verdict": "expired",
            "progress": f"0 of {old.get('required') or 0}",
            "approvedBy": [],
            "expiresAt": "",
            "settledBy": "",
            "approvals": 0,
            "askedAgainAs": now_asked,
            "round": here,
            "message": said,
        }
        stamp = now()
        status["conditions"] = with_generation(
            [
                condition(old, "Ready", "True", "AskedAgain", said, generation=0, now=stamp),
                condition(old, "Stalled", "False", "Settled", "", generation=0, now=stamp),
            ],
            body,
        )
        status["settledAt"] = old.get("settledAt") if old.get("verdict") == "expired" else stamp
        if all(old.get(k) == v for k, v in status.items()):
            return Looked(
                REST, state
            )  # shown already: a look that finds nothing new writes nothing
        if old.get("verdict") == "expired" and said != old.get("message"):
            # Something was added to it since it was settled as expired: told once.
            warn(context, body, run_name, "NotCounted", said)
        show_status(context, "Approval", body, status)
        return Looked(REST, state)

    def _not_asked_yet(self, body: JSON, run_name: str, here: int, asked: int) -> Result:
        """An Approval named for a round the store has not reached (made by someone ahead of
        the operator): nothing on it is recorded until the action is asked in that round; its
        entries then count from when they were first seen, as any entry made early does."""
        context = self._context
        written = written_at(body)
        for entry in entries(body):
            self._sightings.seen(entry.ref, written)
        said = (
            f"round {here} of this action is not asked (the run asks in round {asked}): "
            "nothing on it is recorded until it is"
        )
        old = body.get("status") or {}
        if old.get("message") != said:
            show_status(context, "Approval", body, {"message": said})
        return Requeue(REFUSED_RETRY_MAX)

    def _record_gone(self, gone: JSON) -> None:
        """A deleted Approval's last body (its run deleted, and the garbage collector took it,
        or someone deleted it): the decisions people added before it went are facts, recorded
        like those of a live object, so a deny is never lost to a deletion that overtook the
        operator's look (a run deleted and applied again would otherwise ask afresh). Nothing is
        shown: the object is gone; a refusal (its run no longer waits) is only dropped."""
        context = self._context
        namespace = str(gone["metadata"]["namespace"])
        spec = gone.get("spec") or {}
        run_name, action = str(spec.get("runName", "")), str(spec.get("action", ""))
        state = context.run_state(namespace, run_name)
        found = entries(gone)
        if state is not None and approval_round(gone) != state.round_of(action):
            # Another round's: only a deny on it is recorded (none of its approvals counts).
            found = [e for e in found if not e.approved]
        if state is None or not found:
            return
        before = len(state.approvals.get(action, ()))
        after, _ = self._record(gone, found, state)
        if len(after.approvals.get(action, ())) != before:
            context.enqueue(("AgentRun", namespace, run_name), 0.0)  # its Approval shows it

    def _after_settled(
        self,
        body: JSON,
        run_name: str,
        action: str,
        old: Mapping[str, Any],
        state: RunState | None,
    ) -> Result:
        """A Settled Approval that is not asked again: entries the store does not hold that
        came after the last one it recorded (added after it was settled) are named in its
        message, in one Warning. (One refused before, the creator's say, was told then.)"""
        decisions = state.approvals.get(action, ()) if state is not None else ()
        recorded = recorded_refs(body, decisions)
        found = entries(body)
        last = max((i for i, e in enumerate(found) if e.ref in recorded), default=-1)
        late = list(dict.fromkeys(e.by for e in found[last + 1 :] if e.ref not in recorded))
        if not late:
            return REST
        said = (
            f"not counted: {', '.join(late)} (added after approval {body['metadata']['name']} "
            f"was settled {old.get('verdict') or ''} by {old.get('settledBy') or 'someone'}: a "
            "decision cannot change)"
        )
        message = str(old.get("message") or "")
        if said in message:
            return REST
        status = {"message": f"{message}; {said}" if message else said}
        warn(self._context, body, run_name, "NotCounted", said)
        show_status(self._context, "Approval", body, status)
        return REST

    def _tell(
        self,
        body: JSON,
        run_name: str,
        spec: Mapping[str, Any],
        old: Mapping[str, Any],
        state: RunState,
        view: Shown,
    ) -> None:
        """The moments this look found: each decision recorded since the object last showed
        the store (wherever it was made), approvals that stopped counting, an action asked
        again."""
        context = self._context
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        action, tool = str(spec.get("action", "")), str(spec.get("tool", ""))
        decisions = state.approvals.get(action, ())
        told = int(old.get("decided") or 0)
        recorded_since = range(min(told, len(decisions)), len(decisions))
        waiting = view.tally is not None and view.pending is not None
        expired = view.tally.expired if view.tally is not None and waiting else ()
        if not recorded_since and not expired and not (waiting and old.get("phase") == "Settled"):
            return  # most looks find nothing to tell: the run's body is not copied for them
        run = context.cache.get("AgentRun", namespace, run_name) or body
        rule = _counted_against(state, action, view)
        definition = str(view.status.get("definition") or "")
        for index in recorded_since:
            so_far = tally(
                decisions[: index + 1],
                rule,
                creator=state.spec.creator,
                now=context.clock(),
                definition=definition,
            )
            count = so_far.count if so_far.rule.required > 1 else ""
            self._events.decided(run, name, tool, action, decisions[index], count)
        if view.tally is None or view.pending is None:
            return
        before = set(old.get("approvedBy") or ())
        expires_after = view.tally.rule.expires_after
        if expires_after is not None and view.tally.expired:
            self._events.expired(
                run,
                body,
                view.tally.expired,
                expires_after=expires_after,
                tally=view.tally.count,
                first_time=bool(before & {d.by for d in view.tally.expired}),
            )
        if old.get("phase") == "Settled":
            self._events.waiting(run, name, view.pending, again=True)

    def _show(
        self, body: JSON, run_name: str, old: Mapping[str, Any], status: JSON, *, refusing: bool
    ) -> Result | None:
        """Patch the object's status to ``status`` if it shows something else (a decision that
        does not count is told once, in a Warning); a Result when the reconcile ends here (the
        object is gone)."""
        context = self._context
        stamp = now()
        settled = status.get("phase") == "Settled"
        verdict = str(status.get("verdict") or "")
        if settled:
            ready = ("True", "Settled", verdict)
        else:
            # A decision that does not count says so in a reason too (the health checks read
            # reasons, never messages): the action still waits for people, with that in sight.
            why = "NotCounted" if refusing else "Waiting"
            ready = ("False", why, str(status.get("progress") or ""))
        reason = "Settled" if settled else "Waiting"
        conditions = [
            condition(old, "Ready", *ready, generation=0, now=stamp),
            condition(old, "Stalled", "False", reason, "", generation=0, now=stamp),
        ]
        status["conditions"] = with_generation(conditions, body)
        if settled:
            status["settledAt"] = old.get("settledAt") if old.get("phase") == "Settled" else stamp
        else:
            status["settledAt"] = ""
        if all(old.get(k) == status.get(k) for k in (*_SHOWN, "conditions", "settledAt")):
            return None
        if refusing and old.get("message") != status.get("message"):
            warn(context, body, run_name, "ApprovalRefused", str(status.get("message") or ""))
        return None if show_status(context, "Approval", body, status) else REST
