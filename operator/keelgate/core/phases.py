"""The phases of a run: plan -> act -> observe -> verify -> (revise | stop), one session at a time.

A session is one call of ``Loop.run_or_resume``: it rebuilds the run from its checkpoint, then
does one phase after another, each reading the state, doing one thing and writing the next
checkpoint (``keelgate.core.persistence``), within the run's budgets (``keelgate.core.budgets``),
every tool call through the gateway. Planned actions are saved before any runs (write-ahead), so
a resume never asks the model again for a step it already planned. This module must never retry
a WRITE whose outcome is unknown, never ask a person to approve a call that may already have
run, and never put tool arguments into the audit chain or logs.

Why one module past 500 lines: the phases hand the run to each other through the checkpoint,
and each crash window sits between two of them; read apart, a window would be split across
files.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from keelgate.core import failpoints, telemetry
from keelgate.core.approvals import ApprovalGate, is_service_account, recent, rule_of
from keelgate.core.audit import AuditDraft
from keelgate.core.budgets import Budgets
from keelgate.core.calls import Definition, changed_parts, definition_of, fingerprint
from keelgate.core.gateway import Gateway, LetThroughNoMore, UnknownOutcomeStop, describe
from keelgate.core.model import Model, ModelReply, ModelRequest, ToolInfo
from keelgate.core.persistence import Checkpointer
from keelgate.core.protocols import Confirmer, Stores, Tool
from keelgate.core.redaction import redact_text, redact_value
from keelgate.core.spec import LoopSpec, Price
from keelgate.core.state import Plan, RunState, Step, capped
from keelgate.core.tracing import NO_TRACING, RunTrace, Tracer, TraceRef
from keelgate.core.types import (
    Action,
    ActionResult,
    ApprovalRule,
    Outcome,
    PendingApproval,
    ResultStatus,
    SideEffect,
    StopReason,
    canonical_json,
    idempotency_key,
)
from keelgate.errors import KeelgateError, ModelError, ModelUnavailable


class LoopParts(Protocol):
    """What a session uses of the ``Loop`` that runs it. ``Loop`` is the one implementation;
    it imports this module, so this module names what it needs instead of importing it (no
    import circle in ``core``: a contract in pyproject.toml keeps it so)."""

    @property
    def stores(self) -> Stores: ...

    @property
    def model(self) -> Model | None: ...

    @property
    def tools(self) -> Mapping[str, Tool]: ...

    @property
    def confirmer(self) -> Confirmer | None: ...

    @property
    def price_model(self) -> str | None: ...

    @property
    def goal_predicate(self) -> Callable[[Sequence[Mapping[str, Any]]], bool] | None: ...

    @property
    def max_output_tokens(self) -> int | None: ...

    @property
    def busy_wait(self) -> float: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def tracer(self) -> Tracer: ...

    def price(self) -> Price | None: ...


log = logging.getLogger("keelgate.loop")

# Results whose error Keelgate wrote itself (a refusal, a denial, an abandoned outcome): the
# reason may go on the audit chain. A tool's own error message may not.
_WHY_NOT_RUN = frozenset({ResultStatus.REFUSED, ResultStatus.DENIED, ResultStatus.ABANDONED})


class Session:
    """One call of run_or_resume: the loop's working memory, rebuilt from the checkpoint."""

    def __init__(
        self, loop: LoopParts, spec: LoopSpec, *, asked_to_stop: Callable[[], bool] | None = None
    ) -> None:
        self.loop = loop
        self.spec = spec
        self.asked_to_stop = asked_to_stop or _never
        self.stores = loop.stores
        self.checkpoints = Checkpointer(loop.stores, loop.clock, tenant=spec.tenant, run=spec.run)
        self.budgets = Budgets(
            spec.budget,
            active=self.checkpoints.active,
            model=loop.model,
            price=loop.price(),
            price_model=loop.price_model,
        )
        # What decides each tool's call now (``core.calls``): a planned action is bound to it,
        # and its approvals count only while it is the one they were given for.
        self.definitions: dict[str, Definition] = {
            name: definition_of(tool, loop.confirmer) for name, tool in loop.tools.items()
        }
        self.approvals = ApprovalGate(
            loop.tools,
            loop.stores.idempotency,
            allowed=spec.side_effects,
            busy_wait=loop.busy_wait,
            creator=spec.creator,
        )
        self.gateway = Gateway(
            loop.tools,
            loop.stores.idempotency,
            tenant=spec.tenant,
            run=spec.run,
            allowed=spec.side_effects,
            emit=self.checkpoints.pending.append,
            definitions=self.definitions,
            confirmer=loop.confirmer,
            busy_wait=loop.busy_wait,
            durable_start=loop.stores.capabilities.claim_with_event,
            deferred_completion=loop.stores.capabilities.checkpoint_with_completion,
            claim_after_checkpoint=loop.stores.capabilities.claim_after_checkpoint,
            audit=loop.stores.audit,
            remember_late=self.checkpoints.remember_late,
        )
        self.tool_infos = tuple(
            ToolInfo(t.name, t.description, t.side_effect, t.input_schema)
            for t in loop.tools.values()
            if t.side_effect in spec.side_effects
        )
        # The iterations this session planned itself: their actions were planned under the spec
        # in force now. A plan saved earlier may hold calls made under another spec.
        self.planned_here: set[int] = set()
        # The run's trace (``start`` names it): every span of the session descends from it.
        self.tracer = loop.tracer
        self.trace: RunTrace = NO_TRACING.run(TraceRef("", ""))

    # Starting and driving

    def start(self) -> RunState:
        checkpoint = self.stores.checkpoints.load(self.spec.tenant, self.spec.run)
        if checkpoint is None:
            # A traced run's trace is named in its first checkpoint, so that every process that
            # drives or settles it later joins the same trace.
            state = RunState(
                spec=self.spec, trace=self.tracer.new_run() if self.tracer.enabled else None
            )
            started: dict[str, Any] = {
                "kind": self.spec.kind.value,
                # A goal is text a person wrote: a secret in it must not live on in the chain.
                "goal": redact_text(self.spec.goal),
            }
            if self.spec.creator:
                # Who created it, as admission recorded them; a ServiceAccount is said to be one:
                # notCreator cannot tell who acted through it (impersonation, its token).
                started["creator"] = self.spec.creator
                if is_service_account(self.spec.creator):
                    started["creatorIsServiceAccount"] = True
            return self.checkpoints.save(state, AuditDraft("loop.started", started, key="started"))
        state = RunState.from_json(checkpoint.state).but(seq=checkpoint.seq)
        if state.trace is None and self.tracer.enabled:
            state = state.but(trace=self.tracer.new_run())  # saved with the next checkpoint
        if state.outbox:
            self.stores.audit.append(state.tenant, state.run, state.outbox)
            state = state.but(outbox=())
        changed = _changed_fields(state.spec.to_json(), self.spec.to_json())
        if changed:
            # Raising a budget is the normal way to resume; anything else deserves a warning.
            level = (
                logging.INFO if all(f.startswith("budget.") for f in changed) else logging.WARNING
            )
            # The spec given now wins (a raised budget, an edited manifest), on the record: the
            # chain says which parts changed, never their values. A saved plan keeps its actions
            # and the side-effect class and approval rule they were planned under.
            if state.stop is not None and not state.continues_under(self.spec.budget):
                # Nothing will run: the edit is neither used nor recorded, and the user who
                # edited the manifest must hear that plainly, with what would run it.
                log.warning(
                    "%s/%s: the run's spec changed (%s), but the run has finished (%s): the "
                    "change is not used; to run the edited manifest, give it another "
                    "metadata.name",
                    state.tenant,
                    state.run,
                    ", ".join(changed),
                    state.stop.reason.value,
                )
            else:
                log.log(
                    level,
                    "%s/%s: the run's spec changed (%s): it goes on under the new one from its "
                    "last checkpoint (a plan saved before keeps its actions)",
                    state.tenant,
                    state.run,
                    ", ".join(changed),
                )
            self.checkpoints.pending.append(
                AuditDraft(
                    "loop.spec_changed",
                    {"fields": changed},
                    key=f"spec_changed:{state.seq}:{'|'.join(changed)}",
                )
            )
        return state.but(spec=self.spec)

    def drive(self, *, one_iteration: bool = False) -> Outcome:
        state = self.start()
        if state.trace is not None:
            self.trace = self.tracer.run(state.trace)
        attributes = {"keelgate.tenant": state.tenant, "keelgate.run": state.run}
        with self.trace.session(attributes) as session:
            state = self._drive(state, one_iteration=one_iteration)
            stop = state.stop
            if stop is not None:
                session.event(
                    "keelgate.stop",
                    {
                        "keelgate.stop_reason": stop.reason.value,
                        "keelgate.resumable": stop.is_resumable,
                    },
                )
        if state.stop is not None and not state.stop.is_resumable and self.tracer.enabled:
            self._end_run(state)
        return state.outcome()

    def _drive(self, state: RunState, *, one_iteration: bool) -> RunState:
        if state.stop is not None:
            if not state.continues_under(self.spec.budget):
                return state
            state = self.checkpoints.save(
                state.but(stop=None, unknown=(), pending=()),
                AuditDraft(
                    "loop.resumed",
                    {"from": state.stop.reason.value},
                    key=f"resumed:{state.seq + 1}",
                ),
            )
        phases: dict[Step, Callable[[RunState], RunState]] = {
            Step.PLAN: self._plan,
            Step.ACT: self._act,
            Step.OBSERVE: self._observe,
            Step.VERIFY: self._verify,
        }
        while state.stop is None:
            if self.asked_to_stop():
                break  # at a checkpoint: the next process goes on from here
            if state.step is Step.DONE:  # a checkpoint from a run that met its goal
                state = self.checkpoints.stop(state, StopReason.GOAL_MET)
                break
            iteration = state.iteration + 1 if state.step is Step.PLAN else state.iteration
            with self.trace.span(state.step.value, {"keelgate.iteration": iteration}):
                state = phases[state.step](state)
            if one_iteration and state.stop is None and state.step is Step.PLAN:
                break  # the iteration is over: its verify (or rejection) is saved
        return state

    def _end_run(self, state: RunState) -> None:
        """The run has ended for good (goal met, or failed): its own span goes out, with the
        stops and settlements of its whole life (read back from its audit chain) as events."""
        from keelgate.core.telemetry import run_attributes, run_events

        try:
            events = run_events(self.stores.audit.iter_events(state.tenant, state.run))
        except KeelgateError:
            events = []  # the span says less; the run's end stands
        name = f"invoke_agent {state.run}"
        self.trace.end_run(name, run_attributes(state, self.loop.model), events)

    # Phases

    def _plan(self, state: RunState) -> RunState:
        limit = self.spec.budget.max_iterations
        if limit is not None and state.iteration >= limit:
            return self.checkpoints.stop(
                state,
                StopReason.MAX_ITERATIONS,
                f"reached {limit} iteration{'s' if limit != 1 else ''}",
            )
        iteration = state.iteration + 1
        request = self._request(state, "plan", call=state.calls, iteration=iteration)
        refused = self.budgets.refusal(state, request)
        if refused is not None:
            return self.checkpoints.stop(
                state, *refused
            )  # not an iteration: a resume retries this call
        reply = self._ask_model(state, request)
        if isinstance(reply, RunState):
            return reply
        try:
            actions = tuple(
                Action(
                    f"{iteration}:{index}",
                    call.tool,
                    dict(call.args),
                    idempotency_key(state.tenant, state.run, call.tool, call.args),
                    self._side_effect_of(call.tool),
                    *self._approval_of(call.tool),
                    definition=self.definitions.get(call.tool, {}),
                )
                for index, call in enumerate(reply.actions)
            )
        except ValueError:
            # e.g. NaN in the arguments: no key can be derived from them, so nothing may run.
            return self.checkpoints.stop(
                state,
                StopReason.FAILED,
                "model: a planned action's arguments are not valid JSON",
                resumable=False,
            )
        plan = Plan(iteration, state.calls, actions, reply.done, reply.answer)
        self.planned_here.add(iteration)
        draft = AuditDraft(
            "loop.plan_saved",
            {
                "iteration": iteration,
                "done": plan.done,
                "actions": [
                    {"action": a.id, "tool": a.tool, "idempotencyKey": a.key} for a in actions
                ],
            },
            key=f"plan:{iteration}",
        )
        state = self.checkpoints.save(
            state.but(
                iteration=iteration,
                calls=state.calls + 1,
                plan=plan,
                results=(),
                approvals=recent(state.approvals, iteration),
                usage=state.usage.plus(self.budgets.charge(reply.usage)),
                step=Step.ACT if actions else Step.VERIFY,
            ),
            draft,
        )
        failpoints.hit("after_plan")
        return state

    def _act(self, state: RunState) -> RunState:
        plan = state.plan
        assert plan is not None
        remaining = [a for a in plan.actions if state.result_of(a.id) is None]
        if not remaining:
            state = self.checkpoints.save(_observed(state))
            failpoints.hit("after_observe")
            return state
        resumed = plan.iteration not in self.planned_here
        if resumed:
            state = self._bound_now(state, remaining)
            assert state.plan is not None
            remaining = [a for a in state.plan.actions if state.result_of(a.id) is None]
        for number, action in enumerate(remaining, start=1):
            tool = self.loop.tools.get(action.tool)
            side_effect = action.side_effect if tool is None else tool.side_effect
            attributes = telemetry.tool_attributes(action, side_effect)
            if self.tracer.records_arguments:  # only when a setting asks for them, redacted
                attributes["gen_ai.tool.call.arguments"] = canonical_json(redact_value(action.args))
            with self.trace.span(f"execute_tool {action.tool}", attributes) as span:
                try:
                    result = self._next_result(state, action, resumed=resumed)
                except UnknownOutcomeStop as unknown:
                    span.set("keelgate.outcome", "unknown")
                    span.fail(f"{action.tool} ({action.id}) may or may not have run")
                    return self.checkpoints.stop(
                        state,
                        StopReason.OUTCOME_UNKNOWN,
                        f"{unknown.unknown.tool} ({action.id}) may or may not have run; "
                        "reconcile it",
                        unknown=(unknown.unknown,),
                    )
                span.set(
                    "keelgate.outcome",
                    f"held: {result.reason.value}"
                    if isinstance(result, Held)
                    else telemetry.outcome_of(result),
                )
            if isinstance(result, Held):
                return self.checkpoints.stop(
                    state, result.reason, result.message, pending=result.pending
                )
            draft = AuditDraft(
                "loop.action_completed",
                {
                    "action": action.id,
                    "tool": action.tool,
                    "status": result.status.value,
                    "replayed": result.replayed,
                    # Why it did not run, in Keelgate's own words (never a tool's message,
                    # which may quote its arguments).
                    **({"reason": result.error} if result.status in _WHY_NOT_RUN else {}),
                },
                key=f"completed:{action.id}",
            )
            last = number == len(remaining)
            state = state.but(results=(*state.results, result)).with_late(self.gateway.take_late())
            # After the last action nothing happens outside the process before the observation
            # is made, so the action's checkpoint is the observation's: one commit, not two.
            # With stores that take it, the WRITE's key is completed in that commit too.
            state, missed = self.checkpoints.save_completing(
                _observed(state) if last else state,
                draft,
                completions=self.gateway.completions(),
            )
            late = self.gateway.completed(missed)
            if late:  # a result that came after someone settled its key: remembered at once
                state = self.checkpoints.save(state.with_late(self.gateway.take_late()), *late)
            failpoints.hit("after_action_checkpoint")
            if last:
                failpoints.hit("after_observe")
            elif self.asked_to_stop():
                return state  # the next process acts on the plan's remaining actions
        return state

    def _bound_now(self, state: RunState, remaining: Sequence[Action]) -> RunState:
        """The state whose saved actions are bound to their tools' definitions now, where a
        manifest edit changed one and no call of the action is on record (``core.calls``).

        Such an action is a call not yet made: the call that runs is the one of the tool as it
        is now, and an approval given for the earlier definition no longer counts (the gate
        asks again); the chain says which parts changed and whose approvals were voided. An
        action with a call on record keeps its definition: what is on record decides (its
        result replayed, its unknown outcome settled), and nothing is sent again under its key,
        to the new definition least of all. An action saved before definitions were is bound
        without a word (what it was planned under is not known)."""
        assert state.plan is not None
        rebound: dict[str, Action] = {}
        drafts: list[AuditDraft] = []
        for action in remaining:
            now = self.definitions.get(action.tool)
            if now is None or action.definition == now:
                continue
            if self.stores.idempotency.get(state.tenant, action.key) is not None:
                continue  # its call was made under the definition it is bound to
            rebound[action.id] = replace(action, definition=now)
            if not action.definition:
                continue
            was = fingerprint(action.definition)
            voided = [
                d.by
                for d in state.approvals.get(action.id, ())
                if d.approved and d.definition in ("", was)
            ]
            drafts.append(
                AuditDraft(
                    "loop.call_changed",
                    {
                        "action": action.id,
                        "tool": action.tool,
                        "changed": changed_parts(action.definition, now),
                        "voided": list(dict.fromkeys(voided)),
                    },
                    # Each rebind its own event: one keyed by the definition alone was
                    # dropped as a repeat when the call came back to a definition it was bound
                    # to before, and a decision made between was taken as made on this one.
                    key=f"call_changed:{action.id}:{state.seq}",
                )
            )
            log.warning(
                "%s/%s: %s (%s) changed since it was planned (%s)%s",
                state.tenant,
                state.run,
                action.tool,
                action.id,
                ", ".join(changed_parts(action.definition, now)),
                f": the approvals of {', '.join(voided)} no longer count" if voided else "",
            )
        if not rebound:
            return state
        plan = replace(state.plan, actions=tuple(rebound.get(a.id, a) for a in state.plan.actions))
        return self.checkpoints.save(state.but(plan=plan), *drafts)

    def _next_result(
        self, state: RunState, action: Action, *, resumed: bool
    ) -> ActionResult | Held:
        """What ``action`` comes to: a call on record decides first, then the budgets, a
        person's approval, and the gateway (which makes the call). ``Held`` if the run must stop
        before the call; raises ``UnknownOutcomeStop`` for an unknown outcome.

        A plan saved before this session may have had calls made under another spec (an edited
        tool list, side-effect class, approval rule or budget): its calls on record are looked
        up before anything the spec says now may refuse or hold them back. A plan made in this
        session needs no such look-up: the gateway meets any key on record when it claims, and
        looks before it refuses.
        """
        prior = self.gateway.recorded(action) if resumed else None
        if prior is None:
            spent = self.budgets.spent(state)
            if spent is not None:  # the plan stays saved: a resume with more budget runs it
                return Held(*spent)
        failpoints.hit("before_action")
        if prior is not None:
            return prior
        checked = self.approvals.check(state, action)
        if checked is None:
            try:
                return self.gateway.call(
                    action,
                    after=state.seq,
                    still_let_through=(
                        (lambda: self.approvals.check(state, action) is None)
                        if self.approvals.may_lapse(action)
                        else None  # nothing that let it through can lapse: a READ goes as ever
                    ),
                )
            except LetThroughNoMore:
                # Held up so long that its approvals grew too old (a WRITE's or a READ's):
                # nothing was sent, and the gate's answer now stands (asked again, in most
                # cases).
                checked = self.approvals.check(state, action)
                if checked is None:
                    raise
        if isinstance(checked, PendingApproval):
            return Held(
                StopReason.AWAITING_APPROVAL, _needs(checked, state, action), pending=(checked,)
            )
        return checked

    def _observe(self, state: RunState) -> RunState:
        """A checkpoint saved at ``observe`` by an earlier version (the act phase now observes
        in its last checkpoint): observe from it."""
        state = self.checkpoints.save(_observed(state))
        failpoints.hit("after_observe")
        return state

    def _verify(self, state: RunState) -> RunState:
        assert state.plan is not None
        plan = state.plan
        request = self._request(
            state,
            "verify",
            call=plan.call,
            iteration=plan.iteration,
            answer=plan.answer if plan.done else None,
        )
        refused = self.budgets.refusal(state, request)
        if refused is not None:
            return self.checkpoints.stop(state, *refused)
        reply = self._ask_model(state, request)
        if isinstance(reply, RunState):
            return reply
        usage = state.usage.plus(self.budgets.charge(reply.usage))
        if reply.verdict == "reject":
            rejections = state.rejections + 1
            state = state.remember(
                {"iteration": plan.iteration, "verdict": "reject", "reason": reply.reason}
            ).but(usage=usage, rejections=rejections, step=Step.PLAN)
            limit = self.spec.budget.max_verifier_rejections
            if limit is not None and rejections >= limit:
                state = self.checkpoints.stop(
                    state,
                    StopReason.VERIFIER_REJECTIONS,
                    f"the verifier rejected {rejections} time(s)",
                    resumable=False,
                )
            else:
                state = self.checkpoints.save(
                    state,
                    AuditDraft(
                        "loop.verified",
                        {"iteration": plan.iteration, "verdict": "reject"},
                        key=f"verified:{plan.iteration}:{rejections}",
                    ),
                )
            failpoints.hit("after_verify")
            return state
        state = state.but(usage=usage)
        predicate = self.loop.goal_predicate
        try:
            reached = plan.done or (predicate is not None and bool(predicate(state.history)))
        except Exception as error:
            return self.checkpoints.stop(
                state,
                StopReason.FAILED,
                f"goal predicate: {describe(error)}",
                resumable=False,
            )
        if reached:
            answer = plan.answer if plan.done else None
            state = self.checkpoints.stop(
                state, StopReason.GOAL_MET, answer or "", step=Step.DONE, answer=answer
            )
        else:
            state = self.checkpoints.save(
                state.but(step=Step.PLAN),
                AuditDraft(
                    "loop.verified",
                    {"iteration": plan.iteration, "verdict": "accept"},
                    key=f"verified:{plan.iteration}:accept",
                ),
            )
        failpoints.hit("after_verify")
        return state

    # The model

    def _ask_model(self, state: RunState, request: ModelRequest) -> ModelReply | RunState:
        """Call the model; on a refusal, return the ``failed`` stop instead."""
        if self.loop.model is None:
            return self.checkpoints.stop(
                state, StopReason.FAILED, "no model is configured", resumable=False
            )
        model = self.loop.model
        attributes = telemetry.chat_attributes(model, request.phase, request.iteration)
        with self.trace.span(
            f"chat {attributes['gen_ai.request.model']}", attributes, kind="client"
        ) as span:
            try:
                reply = model.call(request)
            except ModelUnavailable as error:
                span.fail(error.message)
                raise  # nothing was saved: the run stays where it was, to be tried again
            except ModelError as error:
                span.fail(error.message)
                return self.checkpoints.stop(
                    state, StopReason.FAILED, f"model: {error.message}", resumable=False
                )
            except KeelgateError:
                raise
            except Exception as error:
                span.fail(describe(error))
                return self.checkpoints.stop(
                    state, StopReason.FAILED, f"model: {describe(error)}", resumable=False
                )
            for key, value in telemetry.usage_attributes(reply.usage).items():
                span.set(key, value)
            return reply

    def _request(
        self, state: RunState, phase: str, *, call: int, iteration: int, answer: str | None = None
    ) -> ModelRequest:
        return ModelRequest(
            phase="plan" if phase == "plan" else "verify",
            goal=self.spec.goal,
            iteration=iteration,
            call=call,
            history=state.history,
            tools=self.tool_infos,
            max_output_tokens=self.loop.max_output_tokens,
            answer=answer,
        )

    def _side_effect_of(self, name: str) -> SideEffect | None:
        tool = self.loop.tools.get(name)
        return None if tool is None else tool.side_effect

    def _approval_of(self, name: str) -> tuple[bool, ApprovalRule | None]:
        """What a planned action saves of its tool's approval rule: whether it needs one, and
        the rule itself when it asks more than one approval by anyone."""
        tool = self.loop.tools.get(name)
        rule = None if tool is None else rule_of(tool)
        if rule is None:
            return False, None
        return True, None if rule == ApprovalRule() else rule


@dataclass(frozen=True)
class Held:
    """An action held back before its call: the run stops (a budget spent, a person to ask)."""

    reason: StopReason
    message: str
    pending: tuple[PendingApproval, ...] = ()


def _needs(pending: PendingApproval, state: RunState, action: Action) -> str:
    """The stop's words for an action that waits for approval: what it needs, what it has, and
    whose approval stopped counting, if any did."""
    said = f"{pending.tool} ({action.id}) needs approval"
    if pending.rule is None and not state.approvals.get(action.id):
        return said
    said += f" ({pending.tally()}"
    if pending.rule is not None:
        said += f"; {pending.rule.describe()}"
    said += ")"
    had = {d.by for d in state.approvals.get(action.id, ()) if d.approved}
    gone = sorted(had - set(pending.approved_by))
    if gone:
        said += f": asked again, as the approval of {', '.join(gone)} no longer counts"
    return said


def _never() -> bool:
    return False


def _observed(state: RunState) -> RunState:
    """The state with the plan's results remembered as the iteration's observation, ready to
    verify: what the model sees of its actions (their arguments, status and capped output)."""
    assert state.plan is not None
    observations = []
    for action in state.plan.actions:
        result = state.result_of(action.id)
        assert result is not None
        seen: dict[str, Any] = {
            "id": action.id,
            "tool": action.tool,
            "args": action.args,
            "status": result.status.value,
        }
        if result.output is not None:
            seen["output"] = capped(result.output)
        if result.error:
            seen["error"] = result.error
        observations.append(seen)
    entry = {"iteration": state.plan.iteration, "actions": observations}
    return state.remember(entry).but(step=Step.VERIFY, results=())


def _changed_fields(saved: Mapping[str, Any], given: Mapping[str, Any]) -> list[str]:
    """The dotted names of what differs between two spec documents, one level into the
    manifest and the budget (enough to say what changed without saying what it now is)."""
    changed: list[str] = []
    # Where and from which folder a run is driven is not what it does.
    for key in sorted((saved.keys() | given.keys()) - {"store", "sourceDir"}):
        old, new = saved.get(key), given.get(key)
        if old == new:
            continue
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            inner = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
            changed.extend(f"{key}.{k}" for k in inner)
        else:
            changed.append(key)
    return changed
