"""The durable loop of ADR-0004: plan -> act -> observe -> verify -> (revise | stop).

Every phase reads the checkpoint, does one thing, and writes the next checkpoint; a crash at any
point resumes from the last one. Planned actions are saved before any runs (write-ahead), so a
resume never asks the model again for a step it already planned. Every stop has an explicit
reason. This module must never retry a WRITE whose outcome is unknown, never call a tool the
loop kind does not allow, and never put tool arguments into the audit chain or logs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from keelgate.core import failpoints
from keelgate.core.audit import AuditDraft, AuditEvent, ChainReport, utc_now, verify
from keelgate.core.gateway import Gateway, Settlement, UnknownOutcomeStop, describe
from keelgate.core.model import Model, ModelReply, ModelRequest, ToolInfo, estimate_input_tokens
from keelgate.core.protocols import CheckpointLog, Confirmer, RunLock, Stores, Tool
from keelgate.core.spec import LoopSpec, Price
from keelgate.core.state import Approval, Plan, RunState, Step, capped
from keelgate.core.types import (
    Action,
    ActionResult,
    KeyRecord,
    KeyState,
    Outcome,
    PendingApproval,
    ResultStatus,
    SideEffect,
    Stop,
    StopReason,
    UnknownAction,
    Usage,
    idempotency_key,
    stricter,
)
from keelgate.errors import (
    InputError,
    KeelgateError,
    ModelError,
    ModelUnavailable,
    RunBusy,
    RunNotFound,
    SettleError,
)

log = logging.getLogger("keelgate.loop")

# Results whose error Keelgate wrote itself (a refusal, a denial, an abandoned outcome): the
# reason may go on the audit chain. A tool's own error message may not.
_WHY_NOT_RUN = frozenset({ResultStatus.REFUSED, ResultStatus.DENIED, ResultStatus.ABANDONED})

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

    def verify_audit(self, tenant: str, run: str) -> ChainReport:
        """Verify the run's chain, anchored to its checkpoint so a cut-off end is detected."""
        events = self.stores.audit.events(tenant, run)
        checkpoint = self.stores.checkpoints.load(tenant, run)
        if checkpoint is None:
            return verify(tenant, run, events)
        state = checkpoint.state
        pending = {d.get("key") for d in state.get("outbox", []) if d.get("key")}
        return verify(tenant, run, events, anchor=state.get("auditTail"), pending=pending)

    # Running

    def run_or_resume(self, spec: LoopSpec, *, one_iteration: bool = False) -> Outcome:
        """Start the run, or continue it from its last checkpoint, to its next stop.

        With ``one_iteration``, return at the end of the iteration under way (what a step pod
        does): the outcome then has no stop and phase ``Running``, and the next call plans the
        next iteration. Raises ``RunBusy`` or ``StaleCheckpoint`` if another live process is
        driving the run: then this one has done nothing the other could not see. With stores
        that lock runs (``RunLock``), that is found before anything runs, a READ included.
        """
        release = self._lock_run(spec)
        try:
            return _Session(self, spec).drive(one_iteration=one_iteration)
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
        record = self.stores.idempotency.settle(
            tenant, planned.key, executed=executed, by=by, source="human"
        )
        # A death here leaves the key settled without its event: the next resume meets the
        # settled key in the gateway, which writes the event from the key's record.
        failpoints.hit("after_settle")
        self.stores.audit.append(
            tenant,
            run,
            [Settlement(executed, by, "human").draft(planned.id, planned.tool, planned.key)],
        )
        return record

    def approve(self, tenant: str, run: str, action: str, *, approved: bool, by: str) -> Outcome:
        """Settle an ``awaiting_approval`` stop. A denied action never runs; the model sees it."""
        check_actor(by)
        state = self.state(tenant, run)
        if action in state.approvals:
            decided = state.approvals[action]
            verdict = "approved" if decided.approved else "denied"
            raise SettleError(run, action, f"already {verdict} by {decided.by}")
        if state.stop is None or state.stop.reason is not StopReason.AWAITING_APPROVAL:
            raise SettleError(run, action, "the run is not awaiting an approval")
        pending = {p.action: p for p in state.pending}
        if action not in pending:
            waiting = ", ".join(pending) or "none"
            raise SettleError(run, action, f"not awaiting approval (awaiting: {waiting})")
        verdict = "approved" if approved else "denied"
        draft = AuditDraft(
            f"loop.{verdict}",  # a denial is not an approval, even with verdict=denied
            {"action": action, "tool": pending[action].tool, "verdict": verdict},
            actor=by,
            key=f"decided:{action}",
        )
        state = state.but(
            seq=state.seq + 1,
            approvals={**state.approvals, action: Approval(approved, by, utc_now())},
            pending=tuple(p for p in state.pending if p.action != action),
            stop=Stop(
                StopReason.AWAITING_APPROVAL,
                f"{pending[action].tool} ({action}) {verdict} by {by}; resume to continue",
                True,
            ),
        )
        # No active time passes while a person decides: this save adds none.
        state = _persist(self.stores, _joint(self.stores), state, (*state.outbox, draft))
        return state.outcome()


def _joint(stores: Stores) -> CheckpointLog | None:
    """The backend that holds checkpoints and the audit chain together, if the stores declare
    one (``Capabilities.checkpoint_with_events``)."""
    return stores.joint


def _persist(
    stores: Stores, joint: CheckpointLog | None, state: RunState, outbox: Sequence[AuditDraft]
) -> RunState:
    """Write ``state`` (its seq already the next one) with the audit events it carries.

    With one backend for both, checkpoint and events commit together; otherwise the events ride
    in the checkpoint's outbox and are appended after it, so a crash in between re-appends them
    on resume (appending is idempotent by event key). The checkpoint records the last event's
    key, the anchor that lets verify see events cut off the chain's end.
    """
    tail = next((d.key for d in reversed(outbox) if d.key), state.audit_tail)
    state = state.but(outbox=(), audit_tail=tail)
    if joint is not None:
        joint.save_with_events(state.tenant, state.run, state.seq, state.to_json(), outbox)
        return state
    stores.checkpoints.save(
        state.tenant, state.run, state.seq, state.but(outbox=tuple(outbox)).to_json()
    )
    if outbox:
        stores.audit.append(state.tenant, state.run, outbox)
    return state


def check_actor(by: str, *, field: str = "by") -> None:
    """Who decided goes on the audit chain: a name on one line, nothing else. ``field`` is how
    the caller spells it (the CLI's ``--by``)."""
    if not by.strip():
        raise InputError(field, "must name the person deciding")
    if any(ord(c) < 32 or ord(c) == 127 for c in by) or len(by) > 253:
        raise InputError(field, "must be one line of at most 253 printable characters")


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


def _find_action(state: RunState, action: str) -> Action:
    if state.plan is not None:
        for planned in state.plan.actions:
            if planned.id == action:
                return planned
    unknown = ", ".join(u.action for u in state.unknown) or "none"
    raise SettleError(
        state.run, action, f"no such action in the current plan (unknown outcomes: {unknown})"
    )


class _Session:
    """One call of run_or_resume: the loop's working memory, rebuilt from the checkpoint."""

    def __init__(self, loop: Loop, spec: LoopSpec) -> None:
        self.loop = loop
        self.spec = spec
        self.stores = loop.stores
        self.mark = loop.clock()
        self.price = loop.price()
        self.joint = _joint(loop.stores)
        self.pending: list[AuditDraft] = []
        self.gateway = Gateway(
            loop.tools,
            loop.stores.idempotency,
            tenant=spec.tenant,
            run=spec.run,
            allowed=spec.side_effects,
            emit=self.pending.append,
            confirmer=loop.confirmer,
            busy_wait=loop.busy_wait,
            durable_start=loop.stores.capabilities.claim_with_event,
            audit=loop.stores.audit,
        )
        self.tool_infos = tuple(
            ToolInfo(t.name, t.description, t.side_effect, t.input_schema)
            for t in loop.tools.values()
            if t.side_effect in spec.side_effects
        )

    # Persistence

    def _save(self, state: RunState, *drafts: AuditDraft) -> RunState:
        """Write the next checkpoint, with the active time since the last one and the audit
        events it carries: the gateway's since then (an action started, a settlement) ride
        along."""
        now = self.loop.clock()
        active = Usage(active_seconds=now - self.mark)
        self.mark = now
        outbox = (*state.outbox, *self.pending, *drafts)
        self.pending.clear()
        state = state.but(seq=state.seq + 1, usage=state.usage.plus(active))
        return _persist(self.stores, self.joint, state, outbox)

    def _stop(
        self,
        state: RunState,
        reason: StopReason,
        message: str = "",
        *,
        resumable: bool | None = None,
        unknown: tuple[UnknownAction, ...] = (),
        pending: tuple[PendingApproval, ...] = (),
        **changes: Any,
    ) -> RunState:
        stop = Stop(reason, message, resumable)
        draft = AuditDraft(
            "loop.stopped",
            {
                "reason": reason.value,
                "resumable": stop.is_resumable,
                "iteration": state.iteration,
                "step": changes.get("step", state.step).value,
                **({"unknownActions": [u.action for u in unknown]} if unknown else {}),
            },
            key=f"stopped:{state.seq + 1}",
        )
        if message:
            log.info("%s/%s stopped: %s (%s)", state.tenant, state.run, reason.value, message)
        return self._save(state.but(stop=stop, unknown=unknown, pending=pending, **changes), draft)

    # Driving

    def _start(self) -> RunState:
        checkpoint = self.stores.checkpoints.load(self.spec.tenant, self.spec.run)
        if checkpoint is None:
            state = RunState(spec=self.spec)
            return self._save(
                state,
                AuditDraft(
                    "loop.started",
                    {"kind": self.spec.kind.value, "goal": self.spec.goal},
                    key="started",
                ),
            )
        state = RunState.from_json(checkpoint.state).but(seq=checkpoint.seq)
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
            log.log(
                level,
                "%s/%s: the run's spec changed (%s)",
                state.tenant,
                state.run,
                ", ".join(changed),
            )
            self.pending.append(
                AuditDraft(
                    "loop.spec_changed",
                    {"fields": changed},
                    key=f"spec_changed:{state.seq}:{'|'.join(changed)}",
                )
            )
        return state.but(spec=self.spec)

    def drive(self, *, one_iteration: bool = False) -> Outcome:
        state = self._start()
        if state.stop is not None:
            if not state.continues_under(self.spec.budget):
                return state.outcome()
            state = self._save(
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
            if state.step is Step.DONE:  # a checkpoint from a run that met its goal
                state = self._stop(state, StopReason.GOAL_MET)
                break
            state = phases[state.step](state)
            if one_iteration and state.stop is None and state.step is Step.PLAN:
                break  # the iteration is over: its verify (or rejection) is saved
        return state.outcome()

    # Budgets

    def _active(self, state: RunState) -> float:
        return state.usage.active_seconds + (self.loop.clock() - self.mark)

    def _spent(self, state: RunState) -> tuple[StopReason, str] | None:
        """A limit already crossed: nothing further may be acted on."""
        budget = self.spec.budget
        if budget.timeout_seconds is not None and self._active(state) > budget.timeout_seconds:
            return StopReason.TIMEOUT, f"active time passed {budget.timeout_seconds}s"
        if budget.tokens is not None and state.usage.tokens > budget.tokens:
            return StopReason.TOKEN_BUDGET, (f"used {state.usage.tokens} of {budget.tokens} tokens")
        if budget.dollars is not None and state.usage.dollars > budget.dollars:
            return StopReason.DOLLAR_BUDGET, (f"spent ${state.usage.dollars} of ${budget.dollars}")
        return None

    def _precheck(self, state: RunState, request: ModelRequest) -> tuple[StopReason, str] | None:
        """Before a model call: a spent budget, an unknown price, or an input that would cross."""
        budget = self.spec.budget
        if budget.dollars is not None and self.price is None:
            name = self.loop.price_model or getattr(self.loop.model, "name", "?")
            return StopReason.COST_UNKNOWN, (
                f"a dollar budget is set but the price of model {name!r} is unknown"
            )
        spent = self._spent(state)
        if spent is not None:
            return spent
        if budget.tokens is None and budget.dollars is None:
            return None  # no budget to hold an estimate against: skip serialising the request
        # A provider that knows its own wire format may estimate better than the neutral guess.
        estimator = getattr(self.loop.model, "estimate_input_tokens", estimate_input_tokens)
        try:
            estimate = int(estimator(request))
        except Exception:  # a provider's own estimate failing must not stop the run
            estimate = estimate_input_tokens(request)
        if budget.tokens is not None and state.usage.tokens + estimate > budget.tokens:
            return StopReason.TOKEN_BUDGET, (
                f"the next call's input alone (~{estimate} tokens) would pass the budget "
                f"({state.usage.tokens} of {budget.tokens} used)"
            )
        if budget.dollars is not None and self.price is not None:
            cost = self.price.cost(Usage(input_tokens=estimate))
            if state.usage.dollars + cost > budget.dollars:
                return StopReason.DOLLAR_BUDGET, (
                    f"the next call's input alone (~${cost:.6f}) would pass the budget "
                    f"(${state.usage.dollars} of ${budget.dollars} spent)"
                )
        return None

    def _call_model(self, state: RunState, request: ModelRequest) -> ModelReply | RunState:
        """Call the model; on a refusal, return the ``failed`` stop instead."""
        if self.loop.model is None:
            return self._stop(state, StopReason.FAILED, "no model is configured", resumable=False)
        try:
            return self.loop.model.call(request)
        except ModelUnavailable:
            raise  # nothing was saved: the run stays where it was, to be tried again
        except ModelError as error:
            return self._stop(state, StopReason.FAILED, f"model: {error.message}", resumable=False)
        except KeelgateError:
            raise
        except Exception as error:
            return self._stop(
                state, StopReason.FAILED, f"model: {describe(error)}", resumable=False
            )

    def _charge(self, usage: Usage) -> Usage:
        if self.price is None:
            return usage
        return Usage(usage.input_tokens, usage.output_tokens, self.price.cost(usage))

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

    def _needs_approval(self, name: str) -> bool:
        tool = self.loop.tools.get(name)
        return tool is not None and tool.requires_approval

    # Phases

    def _plan(self, state: RunState) -> RunState:
        limit = self.spec.budget.max_iterations
        if limit is not None and state.iteration >= limit:
            return self._stop(
                state,
                StopReason.MAX_ITERATIONS,
                f"reached {limit} iteration{'s' if limit != 1 else ''}",
            )
        iteration = state.iteration + 1
        request = self._request(state, "plan", call=state.calls, iteration=iteration)
        refused = self._precheck(state, request)
        if refused is not None:
            return self._stop(state, *refused)  # not an iteration: a resume retries this call
        reply = self._call_model(state, request)
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
                    self._needs_approval(call.tool),
                )
                for index, call in enumerate(reply.actions)
            )
        except ValueError:
            # e.g. NaN in the arguments: no key can be derived from them, so nothing may run.
            return self._stop(
                state,
                StopReason.FAILED,
                "model: a planned action's arguments are not valid JSON",
                resumable=False,
            )
        plan = Plan(iteration, state.calls, actions, reply.done, reply.answer)
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
        state = self._save(
            state.but(
                iteration=iteration,
                calls=state.calls + 1,
                plan=plan,
                results=(),
                usage=state.usage.plus(self._charge(reply.usage)),
                step=Step.ACT if actions else Step.VERIFY,
            ),
            draft,
        )
        failpoints.hit("after_plan")
        return state

    def _act(self, state: RunState) -> RunState:
        assert state.plan is not None
        remaining = [a for a in state.plan.actions if state.result_of(a.id) is None]
        if not remaining:
            return self._save(state.but(step=Step.OBSERVE))
        for number, action in enumerate(remaining, start=1):
            spent = self._spent(state)
            if spent is not None:  # the plan stays saved: a resume with more budget runs it
                return self._stop(state, *spent)
            failpoints.hit("before_action")
            result = self._approval_result(state, action)
            if isinstance(result, RunState):
                return result
            if result is None:
                try:
                    result = self.gateway.call(action)
                except UnknownOutcomeStop as unknown:
                    return self._stop(
                        state,
                        StopReason.OUTCOME_UNKNOWN,
                        f"{unknown.unknown.tool} ({action.id}) may or may not have run; "
                        f"reconcile it",
                        unknown=(unknown.unknown,),
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
            state = self._save(
                state.but(
                    results=(*state.results, result), step=Step.OBSERVE if last else Step.ACT
                ),
                draft,
            )
            failpoints.hit("after_action_checkpoint")
        return state

    def _approval_result(self, state: RunState, action: Action) -> ActionResult | RunState | None:
        # A person's recorded decision stands, whatever the manifest says now.
        approval = state.approvals.get(action.id)
        if approval is not None:
            if approval.approved:
                return None
            return ActionResult(action.id, ResultStatus.DENIED, error=f"denied by {approval.by}")
        tool = self.loop.tools.get(action.tool)
        if tool is None:
            return None  # the gateway reports the unknown tool; nothing runs
        if not (action.requires_approval or tool.requires_approval):
            return None
        side_effect = stricter(tool.side_effect, action.side_effect)
        if side_effect not in self.spec.side_effects:
            return None  # the gateway refuses it; no person needs to be asked
        if side_effect is not SideEffect.READ and self._begun(state, tool, action):
            # Its call was made before (the manifest asked no approval then): what it came to
            # is settled first, by the gateway. An approver asked now would be asked about a
            # call that may already have run, and asked again once it is settled.
            return None
        return self._stop(
            state,
            StopReason.AWAITING_APPROVAL,
            f"{tool.name} ({action.id}) needs approval",
            pending=(PendingApproval(action.id, tool.name),),
        )

    def _begun(self, state: RunState, tool: Tool, action: Action) -> bool:
        """Whether the action's key is on record, settled or unknown: its call was made.

        A key still in flight in a live process may yet be dropped (a late definite refusal),
        and the call then counts as never made: it is waited for, as the gateway waits, and
        past that the run is busy. A key that is not in flight can no longer disappear, so
        the gateway meets the same record and never calls the tool.
        """
        deadline = time.monotonic() + self.loop.busy_wait
        while True:
            record = self.stores.idempotency.get(state.tenant, action.key)
            if record is None:
                return False
            if record.state is not KeyState.IN_FLIGHT:
                return True
            if time.monotonic() >= deadline:
                raise RunBusy(
                    state.tenant,
                    state.run,
                    f"{tool.name} ({action.id}) is in flight in another live process",
                )
            time.sleep(0.05)

    def _observe(self, state: RunState) -> RunState:
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
        state = self._save(state.remember(entry).but(step=Step.VERIFY, results=()))
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
        refused = self._precheck(state, request)
        if refused is not None:
            return self._stop(state, *refused)
        reply = self._call_model(state, request)
        if isinstance(reply, RunState):
            return reply
        usage = state.usage.plus(self._charge(reply.usage))
        if reply.verdict == "reject":
            rejections = state.rejections + 1
            state = state.remember(
                {"iteration": plan.iteration, "verdict": "reject", "reason": reply.reason}
            ).but(usage=usage, rejections=rejections, step=Step.PLAN)
            limit = self.spec.budget.max_verifier_rejections
            if limit is not None and rejections >= limit:
                state = self._stop(
                    state,
                    StopReason.VERIFIER_REJECTIONS,
                    f"the verifier rejected {rejections} time(s)",
                    resumable=False,
                )
            else:
                state = self._save(
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
            return self._stop(
                state,
                StopReason.FAILED,
                f"goal predicate: {describe(error)}",
                resumable=False,
            )
        if reached:
            answer = plan.answer if plan.done else None
            state = self._stop(
                state, StopReason.GOAL_MET, answer or "", step=Step.DONE, answer=answer
            )
        else:
            state = self._save(
                state.but(step=Step.PLAN),
                AuditDraft(
                    "loop.verified",
                    {"iteration": plan.iteration, "verdict": "accept"},
                    key=f"verified:{plan.iteration}:accept",
                ),
            )
        failpoints.hit("after_verify")
        return state
