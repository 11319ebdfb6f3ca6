"""The gateway: the only door through which a tool call reaches the world.

It enforces the side-effect class a loop allows (``side_effect_not_permitted`` otherwise, whatever
the tool list grants), and makes every PROPOSE and WRITE durable-idempotent: a key is claimed
in flight before the call, with a write deadline (``keelgate.core.fence``) past which the call is
never sent, completed after it, replayed if already completed, and read as an unknown outcome if
its owner died. A call is one unit of knowledge: once any request of it may have left
(``fence.Invocation``), no error of it reads as "nothing happened". A READ under an approval
rule whose approvals expire is sent within a deadline too, and past it the gate is asked again:
it has no key to claim, but what let it through can lapse as a WRITE's can. A key on record decides
before anything the spec says now: an edited tool list, side-effect class or approval rule never
turns a call that may have run into "refused". It never retries a call whose outcome it does not
know, and never accepts the model's or the tool's word that an unknown call happened.

Why one module a little past 500 lines: a call's whole life (refused, claimed, sent, completed,
replayed, unknown) is one sequence of compare-and-sets, read in one place.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from keelgate.core import failpoints, fence
from keelgate.core.audit import AuditDraft
from keelgate.core.calls import CONFIRMER_PARTS, Definition, changed_parts, fingerprint
from keelgate.core.protocols import AuditLog, Completion, Confirmer, IdempotencyStore, Tool
from keelgate.core.types import (
    Action,
    ActionResult,
    KeyRecord,
    KeyState,
    LateResult,
    ResultStatus,
    SideEffect,
    UnknownAction,
    json_safe,
    stricter,
)
from keelgate.errors import KeelgateError, RunBusy, SettleError, SettleTooEarly, ToolError

log = logging.getLogger("keelgate.gateway")

SIDE_EFFECT_NOT_PERMITTED = "side_effect_not_permitted"

# How many times a claim whose deadline passed before its call could be sent (the process was
# held up) is dropped and made afresh before the call counts as refused. Nothing was sent either
# way; a process held up again and again is better told so than kept trying.
FENCE_ATTEMPTS = 3


class LetThroughNoMore(KeelgateError):
    """Raised to the session: a call's deadline passed before it could be sent (the process was
    held up), and what let it through the gate then no longer holds (its approvals grew too
    old meanwhile). Nothing was sent and a WRITE's claim is dropped (a READ has none): the
    session asks the gate again, and the people again if the rule says so."""

    def __init__(self, action: Action) -> None:
        super().__init__(
            f"{action.tool} ({action.id}) was held up past its deadline, and its approvals no "
            "longer count",
            action=action.id,
            tool=action.tool,
        )


class UnknownOutcomeStop(KeelgateError):
    """Raised to the loop, which stops the run with ``outcome_unknown``: a WRITE's outcome is
    unknown and nobody trusted could settle it.

    The gateway's own signal, never a tool's: a tool that cannot tell raises the public
    ``OutcomeUncertain`` (or anything but ``ToolError``), and this is what the gateway makes of it.
    """

    def __init__(self, unknown: UnknownAction) -> None:
        super().__init__(
            f"outcome of {unknown.tool} ({unknown.action}) is unknown",
            action=unknown.action,
            tool=unknown.tool,
        )
        self.unknown = unknown


@dataclass(frozen=True)
class Settlement:
    """How an unknown outcome was settled: by whom, on what authority, which way."""

    executed: bool
    actor: str
    source: str  # "human" or "confirmer"

    @property
    def verdict(self) -> str:
        return "executed" if self.executed else "abandoned"

    def draft(self, action: str, tool: str, key: str) -> AuditDraft:
        return AuditDraft(
            "loop.reconciled",
            {
                "action": action,
                "tool": tool,
                "idempotencyKey": key,
                "source": self.source,
                "verdict": self.verdict,
            },
            actor=self.actor,
            key=f"reconciled:{key}",
        )


class Gateway:
    def __init__(
        self,
        tools: Mapping[str, Tool],
        idempotency: IdempotencyStore,
        *,
        tenant: str,
        run: str,
        allowed: frozenset[SideEffect],
        emit: Callable[[AuditDraft], None],
        definitions: Mapping[str, Definition] | None = None,
        confirmer: Confirmer | None = None,
        busy_wait: float = 5.0,
        durable_start: bool = False,
        deferred_completion: bool = False,
        claim_after_checkpoint: bool = False,
        audit: AuditLog | None = None,
        remember_late: Callable[[LateResult, AuditDraft], None] | None = None,
    ) -> None:
        self.tools = tools
        self.keys = idempotency
        self.tenant = tenant
        self.run = run
        self.allowed = allowed
        self.emit = emit
        # What decides each tool's call now (``core.calls``): a call goes out only under the
        # definition its action is bound to, and a confirmer vouches only for a call made under
        # the definition in force. None: not checked (a caller that binds no definitions).
        self.definitions = definitions
        self.confirmer = confirmer
        self.busy_wait = busy_wait
        # True when the key store also holds the audit chain: a WRITE's start event then
        # commits with its claim, so even a death mid-call leaves it on the chain.
        self.durable_start = durable_start
        # True when the checkpoint store completes keys in the checkpoint's own transaction: a
        # WRITE's key is then completed by the checkpoint that records its result (one commit
        # after the call, not two). Until then the key stays in flight, so a death in between
        # reads as an unknown outcome, exactly as before the completion's own commit.
        self.deferred_completion = deferred_completion
        # True when the key store also holds the checkpoints: a claim then lands only while the
        # run's checkpoint is still the one the action was planned from, so a process held up
        # before its claim while another drove the run on can never claim, nor send.
        self.claim_after_checkpoint = claim_after_checkpoint
        self._deferred: dict[str, tuple[Tool, Action, Completion]] = {}
        # Where a call that ends after its run stopped records how it ended, and (when someone
        # settled its key meanwhile) how the run remembers it (``Checkpointer.remember_late``).
        self.audit = audit
        self.remember_late = remember_late
        # Calls that ended after their keys were settled, for the next checkpoint to remember.
        self.late: list[LateResult] = []

    def call(
        self,
        action: Action,
        *,
        after: int | None = None,
        still_let_through: Callable[[], bool] | None = None,
    ) -> ActionResult:
        """Make ``action``'s call (or meet its record). ``after``: the checkpoint the run stood
        at when the action was reached; a claim is made only while it still does.
        ``still_let_through``: given when what let the call through (approvals that expire) can
        lapse while it waits to leave, and asked before a call is tried afresh after its
        deadline passed unsent (the process was held up): whether it still holds; if not,
        ``LetThroughNoMore`` is raised and nothing is sent. With it a READ is sent under a
        deadline as a WRITE is (``_read``); without it a READ goes out as it always did."""
        tool = self.tools.get(action.tool)
        if tool is None:
            refused = ActionResult(
                action.id, ResultStatus.ERROR, error=f"unknown tool {action.tool!r}"
            )
            return self.recorded(action) or refused
        side_effect = stricter(tool.side_effect, action.side_effect)
        if side_effect not in self.allowed:
            refused = ActionResult(
                action.id,
                ResultStatus.REFUSED,
                error=f"{SIDE_EFFECT_NOT_PERMITTED}: {side_effect.value} tools are not "
                f"permitted in this loop",
            )
            return self.recorded(action) or refused
        if side_effect is SideEffect.READ:
            return self._read(tool, action, still_let_through)
        return self._write(tool, action, side_effect, after, still_let_through)

    def recorded(self, action: Action) -> ActionResult | None:
        """What the action's key on record decides, if a call of it is on record: its result
        replayed, its abandonment, or (raised) a stop for its unknown outcome. None if no call
        of it was ever made under its key.

        Asked before the spec now in force may refuse the action (a tool removed, a side-effect
        class no longer allowed, an approval rule added, a budget spent): a call that may have
        run is settled by what is on record, never dropped as refused. A key in flight in a live
        process is waited for, as a claim waits, and past that the run is busy.
        """
        record = once_not_in_flight(
            lambda: self.keys.get(self.tenant, action.key),
            wait=self.busy_wait,
            busy=lambda record: busy_elsewhere(
                self.tenant, self.run, action.tool, action.id, here=record.here
            ),
        )
        return None if record is None else self._existing(action, record)

    def _rebound(self, action: Action) -> list[str] | None:
        """The parts of the tool's definition that differ from the one ``action`` is bound to
        (None: the same, or not known on either side)."""
        if self.definitions is None or not action.definition:
            return None
        now = self.definitions.get(action.tool)
        if now is None or now == action.definition:
            return None
        return changed_parts(action.definition, now)

    def _started(self, tool: Tool, action: Action, side_effect: SideEffect) -> AuditDraft:
        data: dict[str, Any] = {
            "action": action.id,
            "tool": tool.name,
            "sideEffect": side_effect.value,
            "idempotencyKey": action.key if side_effect is not SideEffect.READ else None,
        }
        if action.definition:
            data["definition"] = fingerprint(action.definition)  # what the call went out under
        return AuditDraft(
            "loop.action_started",
            data,
            # Unique per real start, so re-appending it from an outbox after a crash is a no-op
            # while a READ genuinely run again after a crash is recorded again.
            key=f"started:{action.id}:{uuid.uuid4().hex[:12]}",
        )

    def _read(
        self, tool: Tool, action: Action, still_let_through: Callable[[], bool] | None
    ) -> ActionResult:
        """A READ's call: no key, no claim, no unknown outcome (whatever goes wrong is an error
        the model sees, and a READ may be made again).

        Let through on approvals that expire (``still_let_through`` given), it leaves only
        within a deadline taken as it is tried (its tool's time limit, as a WRITE's), checked
        right before each request leaves: a process held up past it sends nothing, and the
        gate is asked again before the READ is tried afresh, so a call under an approval rule
        never leaves on approvals the gate would no longer count, whatever its class
        (``LetThroughNoMore`` once they lapsed). The deadline lives on this process's own
        clock, which counts the hold: nothing durable is needed, since a process that died
        sends nothing and its successor meets the gate afresh."""
        if still_let_through is None:
            return self._read_once(tool, action, None)
        return self._within_deadlines(
            tool,
            action,
            still_let_through,
            lambda seconds: self._read_once(
                tool, action, fence.WriteDeadline.starting_now(action.key, seconds)
            ),
        )

    def _read_once(
        self, tool: Tool, action: Action, deadline: fence.WriteDeadline | None
    ) -> ActionResult:
        """One try of a READ's call, under ``deadline`` if given. Raises ``DeadlinePassed`` if
        that deadline passed before anything of the call was sent."""
        self.emit(self._started(tool, action, SideEffect.READ))
        call = None if deadline is None else fence.Invocation(deadline)
        try:
            if call is None:
                output = tool.invoke(action.args, idempotency_key=None)
            else:
                with fence.invoking(call):
                    call.deadline.check()  # a tool that sends without checking is checked here
                    output = tool.invoke(action.args, idempotency_key=None)
        except Exception as error:  # a READ may fail any way it likes: the model sees it
            sent = call is None or call.end()
            if not sent and isinstance(error, fence.DeadlinePassed):
                raise
            failpoints.hit("after_gateway_call")
            return ActionResult(action.id, ResultStatus.ERROR, error=describe(error))
        if call is not None:
            call.end()  # a thread the tool left behind sends nothing more for this call
        failpoints.hit("after_gateway_call")
        return ActionResult(action.id, ResultStatus.OK, output=json_safe(output))

    def _write(
        self,
        tool: Tool,
        action: Action,
        side_effect: SideEffect,
        after: int | None,
        still_let_through: Callable[[], bool] | None,
    ) -> ActionResult:
        changed = self._rebound(action)
        if changed is not None:
            # The call approved (or planned) is not the one this tool would send: it is never
            # sent, and its key is not claimed (the session binds an action to the definition
            # in force before asking for approvals; this is the last door, should it not have).
            existing = self.recorded(action)
            if existing is not None:
                return existing
            return ActionResult(
                action.id,
                ResultStatus.REFUSED,
                error=f"{tool.name}: its definition changed since the call was planned "
                f"({', '.join(changed)}); nothing was sent",
            )

        def claim_and_send(seconds: float) -> ActionResult:
            started = self._started(tool, action, side_effect)
            # Taken before the claim is sent, so it falls before the deadline the store records.
            deadline = fence.WriteDeadline.starting_now(action.key, seconds)
            record = self._claim(
                tool,
                action,
                started if self.durable_start else None,
                deadline_in=seconds + fence.MARGIN,
                after=after if self.claim_after_checkpoint else None,
            )
            if record is not None:
                return self._existing(action, record)
            if not self.durable_start:
                self.emit(started)
            try:
                return self._send(tool, action, deadline)
            except fence.DeadlinePassed:
                # Held up between the claim and the send: nothing was sent, and a person may
                # already have settled the key as not executed. Drop our claim (a no-op if it
                # was settled, or if our owner session was lost meanwhile: the key then reads
                # unknown); the next try claims afresh, which meets any record left.
                self.keys.forget(self.tenant, action.key)
                raise

        return self._within_deadlines(tool, action, still_let_through, claim_and_send)

    def _within_deadlines(
        self,
        tool: Tool,
        action: Action,
        still_let_through: Callable[[], bool] | None,
        try_once: Callable[[float], ActionResult],
    ) -> ActionResult:
        """``try_once`` (one try of the call under a deadline of the tool's time limit, raising
        ``DeadlinePassed`` when nothing of it was sent in time), tried up to ``FENCE_ATTEMPTS``
        times. Before a try made afresh, ``still_let_through`` (if given) is asked whether what
        let the call through still holds: held up past the earlier deadline for longer than its
        approvals count, ``LetThroughNoMore`` is raised, nothing having been sent."""
        seconds = fence.call_seconds(getattr(tool, "timeout_seconds", None))
        for attempt in range(FENCE_ATTEMPTS):
            if attempt and still_let_through is not None and not still_let_through():
                raise LetThroughNoMore(action)
            try:
                return try_once(seconds)
            except fence.DeadlinePassed as late:
                log.warning("%s %s: %s", self.run, action.id, late.message)
        return ActionResult(
            action.id,
            ResultStatus.ERROR,
            error=f"{tool.name}: its deadline passed before it could be sent, "
            f"{FENCE_ATTEMPTS} times (the process is being held up); nothing was sent",
        )

    def _send(self, tool: Tool, action: Action, deadline: fence.WriteDeadline) -> ActionResult:
        """Call the tool under its claimed key, within its deadline, and take what came of it.
        Raises ``DeadlinePassed`` if the deadline passed before anything of the call was sent.

        The call is one unit of knowledge: once any request of it may have left (a fenced HTTP
        or MCP request, or a Python tool's ``about_to_send``), no error of it reads as "nothing
        happened", a ``ToolError`` or a passed deadline included. A composite tool whose second
        request fails after its first was sent has an unknown outcome, never a refusal."""
        call = fence.Invocation(deadline)
        try:
            with fence.invoking(call):
                deadline.check()  # a tool that sends without checking is still checked here
                output = tool.invoke(action.args, idempotency_key=action.key)
        except ToolError as error:
            if call.end():
                # Something of the call may have left before this error: it may have run.
                self._leave_unknown(tool, action, call, error)
                raise UnknownOutcomeStop(self._unknown_action(action)) from None
            if isinstance(error, fence.DeadlinePassed):
                raise  # nothing of the call was sent: the caller claims afresh
            # A definite refusal: nothing happened, so the key is dropped and the same call may
            # be made again (a crash before the drop leaves it unknown: the safe side).
            failpoints.hit("after_gateway_call")
            if not self.keys.forget(self.tenant, action.key):
                # Our owner session was lost meanwhile: the key has read unknown to everyone
                # since, another process may have stopped the run on it and a person may be
                # settling it. It stays theirs; the chain says what really came.
                self._kept_after_refusal(action)
                raise UnknownOutcomeStop(self._unknown_action(action)) from None
            return ActionResult(action.id, ResultStatus.ERROR, error=error.message)
        except Exception as error:
            # Timeout, reset after send, or a crash inside the tool: it may or may not have run.
            self._leave_unknown(tool, action, call, error)
            # No confirmer now: the call may still be running (a timed-out worker, a request in
            # flight), so "not found downstream" would be premature. A later resume asks it.
            raise UnknownOutcomeStop(self._unknown_action(action)) from None
        call.end()  # a thread the tool left behind sends nothing more under this key
        failpoints.hit("after_gateway_call")
        result = ActionResult(action.id, ResultStatus.OK, output=json_safe(output))
        if self.deferred_completion:
            self._deferred[action.key] = (tool, action, Completion(action.key, result.to_json()))
        elif not self.keys.complete(self.tenant, action.key, result.to_json()):
            draft, late = self._late(action, "ok")
            self.emit(draft)
            self.late.append(late)
        return result

    def _kept_after_refusal(self, action: Action) -> None:
        """A definite refusal whose key could not be dropped (its owner session was lost): the
        ``loop.late_result`` event (status refused, the key's record as it stands) goes on the
        chain now, whether or not this process can still record the run's stop."""
        log.warning("%s %s: refused, but its key is no longer ours to drop", self.run, action.id)
        draft, _ = self._late(action, "refused")
        if self.audit is not None:
            self.audit.append(self.tenant, self.run, [draft])
        else:
            self.emit(draft)

    def _leave_unknown(
        self, tool: Tool, action: Action, call: fence.Invocation, error: Exception
    ) -> None:
        """The call may or may not have run: its key is left for a person or the confirmer
        (the caller then stops the run with ``UnknownOutcomeStop``)."""
        log.warning("%s %s: outcome unknown (%s)", self.run, action.id, type(error).__name__)
        running = getattr(error, "still_running", None)
        if running is not None:
            # The call goes on in this process: the key stays ours (a resume meanwhile sees
            # it live and waits; a reconcile is refused as still in flight) until the call
            # ends and its end is recorded. Closing the store meanwhile must not release
            # the owner, so the store is held until then.
            release = self.keys.hold()
            running.when_done(functools.partial(self._ended_late, tool, action, call, release))
        else:
            call.end()
            self.keys.release(self.tenant, action.key)

    def completions(self) -> tuple[Completion, ...]:
        """The completions of the WRITEs that ran since the last checkpoint, for the next one to
        commit (``deferred_completion``)."""
        return tuple(completion for _, _, completion in self._deferred.values())

    def completed(self, missed: tuple[str, ...]) -> tuple[AuditDraft, ...]:
        """The checkpoint carrying ``completions()`` committed; ``missed`` are the keys someone
        else had settled meanwhile. Their late results are returned as the events of one more
        checkpoint (an extra commit, but a rare one: nothing says another one follows), and
        kept in ``late`` for it to remember."""
        drafts = []
        for key, (_, action, _) in self._deferred.items():
            if key in missed:
                draft, late = self._late(action, "ok")
                drafts.append(draft)
                self.late.append(late)
        self._deferred.clear()
        return tuple(drafts)

    def take_late(self) -> tuple[LateResult, ...]:
        """The late results met since the last call, for the run's next checkpoint."""
        late, self.late = tuple(self.late), []
        return late

    def _late(self, action: Action, status: str) -> tuple[AuditDraft, LateResult]:
        """A call ended (``status``: ok, refused, unknown) after its key was settled by someone
        else (this process's owner session was lost, or its deadline passed, and someone
        decided): their record stands; the chain and the run note what really came."""
        current = self.keys.get(self.tenant, action.key)
        if current is None:  # a refused call's key is dropped: nothing is recorded for it
            recorded = "forgotten" if status == "refused" else "missing"
        else:
            recorded = current.state.value
        settled_by = "" if current is None else current.settled_by
        if current is not None and current.source:
            # Whoever settled it may have died before writing the decision's event, and this
            # process, which ended the call itself, may be the last to meet the key (its run
            # moves on past the action): the decision goes on the chain before what came late
            # (idempotent, as in ``_existing``).
            decided = _settlement_on_record(action, current)
            if self.audit is not None:
                self.audit.append(self.tenant, self.run, [decided])
            else:
                self.emit(decided)
        if settled_by:
            log.warning(
                "%s %s: ended %s, but %s had already settled its key (%s)",
                self.run,
                action.id,
                status,
                settled_by,
                recorded,
            )
        draft = AuditDraft(
            "loop.late_result",
            {
                "action": action.id,
                "tool": action.tool,
                "idempotencyKey": action.key,
                "status": status,
                "recorded": recorded,
                "settledBy": settled_by,
            },
            key=f"late:{action.key}",
        )
        return draft, LateResult(action.id, action.tool, action.key, status, recorded, settled_by)

    def _ended_late(
        self,
        tool: Tool,
        action: Action,
        call: fence.Invocation,
        release: Callable[[], None],
        output: Any,
        error: BaseException | None,
    ) -> None:
        """A timed-out call finally ended: record what it came to, on its own thread, then let
        the store's owner go (which closes the store if its runner has closed it meanwhile). If
        someone settled its key meanwhile, the run's checkpoint remembers it too."""
        try:
            sent = call.end()
            if error is None:
                result = ActionResult(action.id, ResultStatus.OK, output=json_safe(output))
                # False if someone settled it meanwhile: their record stands (below).
                self.keys.complete(self.tenant, action.key, result.to_json())
                status = "ok"
            elif isinstance(error, ToolError) and not sent:
                self.keys.forget(self.tenant, action.key)  # refused after all: nothing happened
                status = "refused"
            else:
                self.keys.release(self.tenant, action.key)  # still unknown: for a person
                status = "unknown"
            draft, late = self._late(action, status)
            if late.settled_by and self.remember_late is not None:
                self.remember_late(late, draft)  # settled by someone: the run remembers it
            elif self.audit is not None:
                self.audit.append(self.tenant, self.run, [draft])
        except Exception as failure:  # the store may have failed; the key then stays unknown
            log.warning(
                "%s %s: could not record a late end (%s)",
                self.run,
                action.id,
                type(failure).__name__,
            )
        finally:
            release()

    def _claim(
        self,
        tool: Tool,
        action: Action,
        event: AuditDraft | None,
        *,
        deadline_in: float,
        after: int | None,
    ) -> KeyRecord | None:
        return once_not_in_flight(
            lambda: self.keys.claim(
                self.tenant,
                action.key,
                run=self.run,
                action=action.id,
                tool=tool.name,
                event=event,
                deadline_in=deadline_in,
                after=after,
            ),
            wait=self.busy_wait,
            busy=lambda record: in_flight_elsewhere(
                self.tenant, self.run, tool, action, here=record.here
            ),
        )

    def _existing(self, action: Action, record: KeyRecord) -> ActionResult:
        if record.source:
            # Settled by a person or a confirmer: make sure the chain says so, even if the
            # process that settled it died before writing the event (appending is idempotent).
            self.emit(_settlement_on_record(action, record))
        if record.state is KeyState.COMPLETED:
            return _replay(action, record)
        if record.state is KeyState.ABANDONED:
            return _abandoned(action, record)
        return self._unknown(action, record)

    def _unknown_action(self, action: Action, record: KeyRecord | None = None) -> UnknownAction:
        """The unknown outcome as the run's stop lists it, with when it may be settled as not
        executed (read from the key if ``record`` is not given)."""
        if record is None:
            try:
                record = self.keys.get(self.tenant, action.key)
            except KeelgateError:  # the store failed: the stop is all the more due
                record = None
        after = "" if record is None else record.not_executed_after
        return UnknownAction(action.id, action.tool, action.key, after)

    def _unknown(self, action: Action, record: KeyRecord) -> ActionResult:
        unknown = self._unknown_action(action, record)
        changed = [p for p in self._rebound(action) or () if p not in CONFIRMER_PARTS]
        if changed:
            # The call was made under an earlier definition of its tool: the confirmer in
            # force now may ask another system than the one the call went to, so only a
            # person settles it, by what the call was when it was made. (A confirmer added or
            # changed since is asked: vouching for calls already made is what it is for.)
            log.warning(
                "%s %s: made under an earlier definition (%s): left for a person",
                self.run,
                action.id,
                ", ".join(changed),
            )
            raise UnknownOutcomeStop(unknown)
        settlement = self._ask_confirmer(unknown, action)
        if settlement is not None and not settlement.executed and record.sendable:
            # A process held up before sending may still send it until its deadline: "not
            # found downstream" cannot be believed yet. A later resume asks again.
            log.warning(
                "%s %s: the confirmer's 'not executed' waits for the deadline (%s)",
                self.run,
                action.id,
                unknown.not_executed_after,
            )
            settlement = None
        if settlement is None:
            raise UnknownOutcomeStop(unknown)
        try:
            settled = self.keys.settle(
                self.tenant,
                action.key,
                executed=settlement.executed,
                by=settlement.actor,
                source=settlement.source,
            )
        except SettleTooEarly:
            raise UnknownOutcomeStop(self._unknown_action(action)) from None
        except SettleError:
            # Someone (a person) settled it while the confirmer was deciding: theirs stands.
            current = self.keys.get(self.tenant, action.key)
            if current is None or current.state is KeyState.OUTCOME_UNKNOWN:
                raise
            if current.state is KeyState.IN_FLIGHT:
                raise busy_elsewhere(
                    self.tenant, self.run, action.tool, action.id, here=current.here
                ) from None
            return self._existing(action, current)
        # The event rides with the next checkpoint; a death before it leaves the key settled
        # without it, and the next resume writes it from the key's record (_existing).
        failpoints.hit("after_settle")
        self.emit(settlement.draft(action.id, action.tool, action.key))
        return _replay(action, settled) if settlement.executed else _abandoned(action, settled)

    def _ask_confirmer(self, unknown: UnknownAction, action: Action) -> Settlement | None:
        if self.confirmer is None:
            return None
        try:
            verdict = self.confirmer.confirm(self.tenant, self.run, unknown, action.args)
        except Exception as error:
            log.warning(
                "confirmer %s failed on %s: %s",
                self.confirmer.name,
                unknown.action,
                type(error).__name__,
            )
            return None
        if verdict is True or verdict is False:
            return Settlement(verdict, self.confirmer.name, "confirmer")
        return None


def _settlement_on_record(action: Action, record: KeyRecord) -> AuditDraft:
    """The event of the decision a settled key records (a person's or a confirmer's)."""
    executed = record.state is KeyState.COMPLETED
    return Settlement(executed, record.settled_by, record.source).draft(
        action.id, action.tool, action.key
    )


def once_not_in_flight(
    read: Callable[[], KeyRecord | None], *, wait: float, busy: Callable[[KeyRecord], RunBusy]
) -> KeyRecord | None:
    """``read()`` (a claim, a look-up) again until its key is not in flight in a live process,
    for at most ``wait`` seconds; past that, ``busy(record)`` is raised.

    A key in flight in a live process means another runner of the run is at it. A dying owner
    may take a moment to be seen as gone (a server ends a session asynchronously), so a moment
    is waited; past that, this runner must not act.
    """
    deadline = time.monotonic() + wait
    while True:
        record = read()
        if record is None or record.state is not KeyState.IN_FLIGHT:
            return record
        if time.monotonic() >= deadline:
            raise busy(record)
        time.sleep(0.05)


def in_flight_elsewhere(
    tenant: str, run: str, tool: Tool, action: Action, *, here: bool = False
) -> RunBusy:
    return busy_elsewhere(tenant, run, tool.name, action.id, here=here)


def busy_elsewhere(tenant: str, run: str, tool: str, action: str, *, here: bool = False) -> RunBusy:
    """The run is busy: a call of it is in flight in a live process. ``here``: this very
    process, whose call (a timed-out one still running, another thread's) has not ended yet."""
    if here:
        return RunBusy(tenant, run, f"{tool} ({action}) is still running in this process")
    return RunBusy(tenant, run, f"{tool} ({action}) is in flight in another live process")


def _replay(action: Action, record: KeyRecord) -> ActionResult:
    if isinstance(record.result, Mapping) and "status" in record.result:
        stored = ActionResult.from_json({**record.result, "action": action.id})
        return ActionResult(action.id, stored.status, stored.output, stored.error, replayed=True)
    # Settled as executed by a person or a confirmer: it ran, but its output is not known.
    return ActionResult(
        action.id,
        ResultStatus.OK,
        output={"executed": True, "settledBy": record.settled_by},
        replayed=True,
    )


def _abandoned(action: Action, record: KeyRecord) -> ActionResult:
    return ActionResult(
        action.id,
        ResultStatus.ABANDONED,
        error=f"not executed: abandoned by {record.settled_by or 'reconcile'}; "
        "it will not be retried under the same key",
    )


def describe(error: BaseException) -> str:
    """An error as a model or a user may see it: its type and message, never a traceback."""
    message = str(error) or type(error).__name__
    return message if isinstance(error, KeelgateError) else f"{type(error).__name__}: {message}"
