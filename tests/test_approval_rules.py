"""Approval rules: several different people, from given groups, not the run's creator, each
approval counting only for so long; any no denies.

Why it exists: payments, deletions and production changes need two people. The rule is the
promise's "never runs unapproved" made stricter, so these tests drive the real loop over real
SQLite files, count every call downstream, and read the audit chain a person would read: the
WRITE runs once, and only once the rule's approvals are in the store; a person counts once; a
person outside the groups, or the creator under notCreator, is refused with a line saying why;
an approval that is too old when the call would run (a budget stop in between) is asked for
again and the old one stays on record; the rule travels with the saved action and an edited
manifest can only make it stricter; a decision on other arguments than the call's is refused.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

import keelgate
from crashkit import Journal, World
from fakes.downstream import Shop
from keelgate.adapters.models.scripted import ScriptedModel
from keelgate.adapters.tools.python import PythonTool
from keelgate.core import clocks, fence
from keelgate.core.approvals import refusal, rule_of, tally
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.state import Decision
from keelgate.core.types import ApprovalRule, Outcome, SideEffect, StopReason, idempotency_key
from keelgate.errors import InputError, SettleError
from support.restock import ORDER, RESTOCK, Recorder, loop_over, only, spec

TWO = ApprovalRule(required=2)
PAYMENTS = ApprovalRule(required=2, groups=("payments",))
AUTHENTICATED = ("system:authenticated",)


def world_with(tmp_path: Path, rule: ApprovalRule, name: str = "world") -> World:
    return World(Journal(tmp_path / f"{name}.jsonl"), rules={"place_order": rule})


def waiting(stores: Stores, world: World, **options: object) -> Loop:
    """A loop stopped before its WRITE (2:0), which needs the world's rule."""
    loop = loop_over(stores, Recorder(RESTOCK), world.tools())
    stopped = loop.run_or_resume(spec(**options))  # type: ignore[arg-type]
    assert stopped.stop.reason is StopReason.AWAITING_APPROVAL
    assert world.effects() == {}
    return loop


@contextmanager
def wall_clock_at(start: float) -> Iterator[list[float]]:
    """The wall clock (what decisions are stamped with and counted against) at ``start``,
    moved by the test through the list it yields."""
    now = [start]
    with clocks.simulated(wall=lambda: now[0], boot=time.monotonic):
        yield now


def test_a_write_needing_two_people_runs_once_and_only_after_the_second(
    stores: Stores, tmp_path: Path
) -> None:
    """One approval of two leaves the run waiting however often it is resumed, and nothing
    runs; the same person approving again is refused (a person counts once); a second person's
    approval lets the WRITE run, once. The stop says "1 of 2"; each decision is its own audit
    event, naming who and the count, never an argument."""
    world = world_with(tmp_path, TWO)
    loop = waiting(stores, world)
    first = loop.approve("shop", "restock", "2:0", approved=True, by="alice")
    assert first.stop.reason is StopReason.AWAITING_APPROVAL
    (pending,) = first.pending_approvals
    assert (pending.approvals, pending.required, pending.approved_by) == (1, 2, ("alice",))
    assert "approved by alice (1 of 2); waiting for 1 more" in first.stop.message
    for _ in range(2):
        again = loop.run_or_resume(spec())
        assert again.stop.reason is StopReason.AWAITING_APPROVAL
        assert again.pending_approvals[0].tally() == "1 of 2"
        assert world.effects() == {}
    with pytest.raises(SettleError, match="alice approved it already \\(1 of 2\\)"):
        loop.approve("shop", "restock", "2:0", approved=True, by="alice")
    loop.approve("shop", "restock", "2:0", approved=True, by="bob")
    assert loop.run_or_resume(spec()).stop.reason is StopReason.GOAL_MET
    assert loop.run_or_resume(spec()).stop.reason is StopReason.GOAL_MET
    assert list(world.effects().values()) == [1]
    approved = only(stores.audit.events("shop", "restock"), "loop.approved")
    assert [(e.actor, e.data["approvals"], e.data["required"]) for e in approved] == [
        ("alice", 1, 2),
        ("bob", 2, 2),
    ]
    assert [e.key for e in approved] == ["decided:2:0", "decided:2:0:1"]
    assert ORDER["note"] not in str([e.to_json() for e in approved])


def test_any_deny_denies_even_after_approvals(stores: Stores, tmp_path: Path) -> None:
    """Alice approves, bob denies: the action never runs, the model is told who denied it, and
    no later approval can bring it back."""
    world = world_with(tmp_path, TWO)
    loop = waiting(stores, world)
    loop.approve("shop", "restock", "2:0", approved=True, by="alice")
    denied = loop.approve("shop", "restock", "2:0", approved=False, by="bob")
    assert denied.pending_approvals == ()
    with pytest.raises(SettleError, match="already denied by bob"):
        loop.approve("shop", "restock", "2:0", approved=True, by="carol")
    assert loop.run_or_resume(spec()).stop.reason is StopReason.GOAL_MET
    assert world.effects() == {}
    assert [e.actor for e in only(stores.audit.events("shop", "restock"), "loop.denied")] == ["bob"]


def test_only_people_in_the_rules_groups_decide(stores: Stores, tmp_path: Path) -> None:
    """A rule naming groups takes decisions only from people authenticated in one of them,
    approve or deny; the groups that counted are on the decision's audit event."""
    world = world_with(tmp_path, PAYMENTS)
    loop = waiting(stores, world)
    with pytest.raises(SettleError, match="mallory may not decide it: the rule asks 2 approvals "):
        loop.approve("shop", "restock", "2:0", approved=True, by="mallory", groups=AUTHENTICATED)
    with pytest.raises(SettleError, match="may not decide it"):
        loop.approve("shop", "restock", "2:0", approved=False, by="mallory")
    for person in ("alice", "bob"):
        loop.approve(
            "shop", "restock", "2:0", approved=True, by=person, groups=("payments", *AUTHENTICATED)
        )
    assert loop.run_or_resume(spec()).stop.reason is StopReason.GOAL_MET
    assert list(world.effects().values()) == [1]
    events = only(stores.audit.events("shop", "restock"), "loop.approved")
    assert [e.data["groups"] for e in events] == [["payments"], ["payments"]]


def test_the_creator_may_not_approve_under_not_creator_but_may_deny(
    stores: Stores, tmp_path: Path
) -> None:
    """notCreator: the run's creator (as its spec records it) is refused an approval, in words
    naming why; someone else's counts; and the creator's no denies."""
    world = world_with(tmp_path, ApprovalRule(not_creator=True))
    loop = loop_over(stores, Recorder(RESTOCK), world.tools())
    created = replace(spec(), creator="alice")
    assert loop.run_or_resume(created).stop.reason is StopReason.AWAITING_APPROVAL
    with pytest.raises(SettleError, match="alice created the run, and its rule asks for someone"):
        loop.approve("shop", "restock", "2:0", approved=True, by="alice")
    loop.approve("shop", "restock", "2:0", approved=True, by="bob")
    assert loop.run_or_resume(created).stop.reason is StopReason.GOAL_MET
    assert list(world.effects().values()) == [1]

    other = world_with(tmp_path, ApprovalRule(not_creator=True), "other")
    loop = loop_over(stores, Recorder(RESTOCK), other.tools())
    second = replace(spec("second"), creator="alice")
    assert loop.run_or_resume(second).stop.reason is StopReason.AWAITING_APPROVAL
    loop.approve("shop", "second", "2:0", approved=False, by="alice")
    assert loop.run_or_resume(second).stop.reason is StopReason.GOAL_MET
    assert other.effects() == {}


def test_a_run_created_by_a_service_account_says_so_and_no_account_decides_it(
    stores: Stores, tmp_path: Path
) -> None:
    """bob creates a run `--as ci` (issue 46): its creator on record is the ServiceAccount, and
    its audit trail says the creator is one (notCreator cannot tell who acted through it). The
    account itself cannot approve the run it created, nor any other; bob, a person, counts (the
    docs say why notCreator cannot stop him). A person's run carries no such mark."""
    robot = "system:serviceaccount:shop:ci"
    world = world_with(tmp_path, ApprovalRule(not_creator=True))
    loop = loop_over(stores, Recorder(RESTOCK), world.tools())
    created = replace(spec(), creator=robot)
    assert loop.run_or_resume(created).stop.reason is StopReason.AWAITING_APPROVAL
    (started,) = only(loop.audit("shop", "restock"), "loop.started")
    assert (started.data["creator"], started.data["creatorIsServiceAccount"]) == (robot, True)
    with pytest.raises(SettleError, match="is a ServiceAccount, and the rule counts people only"):
        loop.approve("shop", "restock", "2:0", approved=True, by=robot)
    loop.approve("shop", "restock", "2:0", approved=True, by="bob")
    assert loop.run_or_resume(created).stop.reason is StopReason.GOAL_MET
    assert list(world.effects().values()) == [1]

    person = replace(spec("by-alice"), creator="alice")
    assert loop.run_or_resume(person).stop.reason is StopReason.AWAITING_APPROVAL
    (started,) = only(loop.audit("shop", "by-alice"), "loop.started")
    assert started.data["creator"] == "alice" and "creatorIsServiceAccount" not in started.data
    with pytest.raises(SettleError, match="is a ServiceAccount, and the rule counts people only"):
        loop.approve("shop", "by-alice", "2:0", approved=True, by=robot)


def test_not_creator_with_no_creator_on_record_counts_nobody(
    stores: Stores, tmp_path: Path
) -> None:
    """Who created the run is not known: no approval can be checked against the rule, so none
    counts and each is refused, naming the annotation that records a creator; a deny works."""
    world = world_with(tmp_path, ApprovalRule(not_creator=True))
    loop = waiting(stores, world)
    with pytest.raises(SettleError, match=r"keelgate\.dev/created-by"):
        loop.approve("shop", "restock", "2:0", approved=True, by="bob")
    loop.approve("shop", "restock", "2:0", approved=False, by="bob")
    assert loop.run_or_resume(spec()).stop.reason is StopReason.GOAL_MET
    assert world.effects() == {}


def test_an_approval_too_old_when_the_write_would_run_is_asked_for_again(
    stores: Stores, tmp_path: Path
) -> None:
    """expiresAfter 60 s: both approve, a budget stop comes between them and the WRITE, and two
    minutes pass. Resumed, the run asks again (0 of 2; the stop says whose approvals stopped
    counting) instead of running it; the old decisions stay in the checkpoint and on the chain;
    approved afresh, it runs once. The pending approval says when the first approval expires."""
    world = world_with(tmp_path, ApprovalRule(required=2, expires_after=60.0))
    with wall_clock_at(1_900_000_000.0) as now:
        loop = waiting(stores, world)
        first = loop.approve("shop", "restock", "2:0", approved=True, by="alice")
        assert first.pending_approvals[0].expires_at == "2030-03-17T17:47:40Z"
        now[0] += 10
        loop.approve("shop", "restock", "2:0", approved=True, by="bob")
        spent = loop.run_or_resume(spec(tokens=10))  # already past: a budget stop
        assert spent.stop.reason is StopReason.TOKEN_BUDGET
        now[0] += 120
        again = loop.run_or_resume(spec(tokens=100_000))
        assert again.stop.reason is StopReason.AWAITING_APPROVAL
        assert again.pending_approvals[0].tally() == "0 of 2"
        assert "asked again, as the approval of alice, bob no longer counts" in again.stop.message
        assert world.effects() == {}
        state = loop.state("shop", "restock")
        assert [d.by for d in state.approvals["2:0"]] == ["alice", "bob"]
        loop.approve("shop", "restock", "2:0", approved=True, by="alice")
        loop.approve("shop", "restock", "2:0", approved=True, by="bob")
        assert loop.run_or_resume(spec(tokens=100_000)).stop.reason is StopReason.GOAL_MET
    assert list(world.effects().values()) == [1]
    kept = [e.actor for e in only(stores.audit.events("shop", "restock"), "loop.approved")]
    assert kept == ["alice", "bob", "alice", "bob"]


def test_a_write_held_up_past_its_deadline_asks_again_once_its_approvals_are_too_old(
    stores: Stores,
) -> None:
    """expiresAfter 60 s: both approve and the step passes the gate, then its process is held up
    two minutes between the claim and the send. Its deadline has passed, so nothing is sent;
    its approvals no longer count either, so instead of claiming afresh and sending at once (an
    order placed on approvals two minutes old: the simulator's seed 12324971751474755569) it
    stops and asks again. Approved afresh, the order is placed once."""
    wall, boot = [1_900_000_000.0], [5_000.0]
    held, sent = [True], []

    def place_order(args: dict[str, object], *, idempotency_key: str | None) -> object:
        if held[0]:
            held[0] = False
            wall[0] += 120.0  # the process is held up two minutes before its request leaves
            boot[0] += 120.0
        keelgate.about_to_send(idempotency_key)
        sent.append(idempotency_key)
        return {"placed": True}

    rule = ApprovalRule(required=2, expires_after=60.0)
    tool = PythonTool(
        "place_order",
        place_order,
        side_effect=SideEffect.WRITE,
        requires_approval=True,
        approval=rule,
        timeout_seconds=30.0,
    )
    script = [{"actions": [{"tool": "place_order", "args": ORDER}]}, {"done": True, "answer": ""}]
    held_spec = LoopSpec("shop", "held", "restock", budget=Budget(max_iterations=5))
    with clocks.simulated(wall=lambda: wall[0], boot=lambda: boot[0]):
        loop = Loop(stores=stores, model=ScriptedModel(script), tools=[tool])
        assert loop.run_or_resume(held_spec).stop.reason is StopReason.AWAITING_APPROVAL
        loop.approve("shop", "held", "1:0", approved=True, by="alice")
        loop.approve("shop", "held", "1:0", approved=True, by="bob")
        again = loop.run_or_resume(held_spec)
        assert again.stop.reason is StopReason.AWAITING_APPROVAL, again.to_json()
        assert again.pending_approvals[0].tally() == "0 of 2"
        assert sent == []
        loop.approve("shop", "held", "1:0", approved=True, by="alice")
        loop.approve("shop", "held", "1:0", approved=True, by="bob")
        assert loop.run_or_resume(held_spec).stop.reason is StopReason.GOAL_MET
    assert sent == [idempotency_key("shop", "held", "place_order", ORDER)]


class HeldUpRead:
    """A READ of the real shop over HTTP, its process held up ``hold`` seconds on its first
    call after the gate let it through, right before its request leaves (both clocks move on,
    as a stopped process's do); it reports the request with ``about_to_send``, as a Python
    tool that sends by itself does. ``seen`` is what each call found of a deadline in reach."""

    def __init__(self, shop: Shop, clock: list[float], hold: float) -> None:
        self.shop, self.clock, self.hold = shop, clock, hold
        self.seen: list[fence.WriteDeadline | None] = []

    def __call__(self, args: dict[str, object], *, idempotency_key: str | None) -> object:
        self.seen.append(fence.current())
        if self.hold:
            self.clock[0] += self.hold
            self.hold = 0.0
        keelgate.about_to_send(idempotency_key)
        return httpx.get(f"{self.shop.url}/items/{args['sku']}", timeout=5.0).json()


@contextmanager
def held_clocks() -> Iterator[list[float]]:
    """Both clocks, moved together by what the test adds to the list it yields: the wall clock
    decisions are counted against, and the boot clock deadlines are."""
    offset = [0.0]
    start = 1_900_000_000.0 - time.monotonic()
    with clocks.simulated(
        wall=lambda: start + time.monotonic() + offset[0],
        boot=lambda: time.monotonic() + offset[0],
    ):
        yield offset


@pytest.fixture
def shop() -> Iterator[Shop]:
    server = Shop().start()
    yield server  # type: ignore[misc]
    server.stop()


LOOK = {"sku": "A1"}
LOOK_SCRIPT = [{"actions": [{"tool": "look", "args": LOOK}]}, {"done": True, "answer": ""}]
LOOK_SPEC = LoopSpec("shop", "look", "count A1", budget=Budget(max_iterations=5))


@contextmanager
def held_read(
    stores: Stores, shop: Shop, rule: ApprovalRule | None
) -> Iterator[tuple[HeldUpRead, Loop]]:
    """A run whose one action is a READ of the shop (``look``, under ``rule``, a 30 s time
    limit), its process held up two minutes on the first call; and the READ, to see what each
    call found."""
    with held_clocks() as clock:
        read = HeldUpRead(shop, clock, 120.0)
        tool = PythonTool(
            "look", read, side_effect=SideEffect.READ, approval=rule, timeout_seconds=30.0
        )
        yield read, Loop(stores=stores, model=ScriptedModel(LOOK_SCRIPT), tools=[tool])


def approved_by_two(loop: Loop) -> Outcome:
    """alice and bob approve the READ, and the run goes on."""
    loop.approve("shop", "look", "1:0", approved=True, by="alice")
    loop.approve("shop", "look", "1:0", approved=True, by="bob")
    return loop.run_or_resume(LOOK_SPEC)


def looks(shop: Shop) -> list[str]:
    return [r.path for r in shop.received if r.method == "GET"]


def test_a_read_under_a_rule_held_up_past_its_approvals_is_not_sent_and_asks_again(
    stores: Stores, shop: Shop
) -> None:
    """A READ may carry an approval rule too (here: 2 approvals, expiresAfter 60 s). Both
    approve and the gate lets it through, then its process is held up two minutes before the
    request leaves. Its deadline (its time limit, as a WRITE's) has passed, so nothing is sent,
    and its approvals no longer count: the run stops and asks again (0 of 2) instead of
    sending it on approvals two minutes old (the simulator's seed 17236921387873743512).
    Approved afresh, the request goes out once."""
    with held_read(stores, shop, ApprovalRule(required=2, expires_after=60.0)) as (tool, loop):
        assert loop.run_or_resume(LOOK_SPEC).stop.reason is StopReason.AWAITING_APPROVAL
        again = approved_by_two(loop)
        assert again.stop.reason is StopReason.AWAITING_APPROVAL, again.to_json()
        assert again.pending_approvals[0].tally() == "0 of 2"
        assert looks(shop) == []
        assert isinstance(tool.seen[0], fence.WriteDeadline)
        assert approved_by_two(loop).stop.reason is StopReason.GOAL_MET
    assert looks(shop) == ["/items/A1"]
    completed = only(loop.audit("shop", "look"), "loop.action_completed")
    assert [e.data["status"] for e in completed] == ["ok"]


def test_a_read_held_up_past_its_deadline_while_its_approvals_still_count_goes_out_once(
    stores: Stores, shop: Shop
) -> None:
    """The same hold under approvals that count for an hour: the READ's deadline passed unsent,
    the gate is asked again and still lets it through, so it is tried afresh at once, sent
    once, and nobody is asked anything more."""
    with held_read(stores, shop, ApprovalRule(required=2, expires_after=3600.0)) as (tool, loop):
        assert loop.run_or_resume(LOOK_SPEC).stop.reason is StopReason.AWAITING_APPROVAL
        assert approved_by_two(loop).stop.reason is StopReason.GOAL_MET
    assert looks(shop) == ["/items/A1"]
    assert len(tool.seen) == 2  # tried once, held past its deadline; tried afresh and sent


@pytest.mark.parametrize(
    "rule", [None, ApprovalRule(required=2)], ids=["no rule", "approvals that never expire"]
)
def test_a_read_whose_let_through_cannot_lapse_goes_out_unfenced_after_a_hold(
    stores: Stores, shop: Shop, rule: ApprovalRule | None
) -> None:
    """A READ under no rule, or one whose approvals never expire, has nothing that could lapse
    while it waits: it carries no deadline, and held up two minutes it is still sent, once,
    as READs always were."""
    with held_read(stores, shop, rule) as (tool, loop):
        done = loop.run_or_resume(LOOK_SPEC)
        if rule is not None:
            assert done.stop.reason is StopReason.AWAITING_APPROVAL
            done = approved_by_two(loop)
        assert done.stop.reason is StopReason.GOAL_MET
    assert looks(shop) == ["/items/A1"]
    assert tool.seen == [None]


def test_an_approval_that_expires_while_the_second_is_awaited_does_not_count(
    stores: Stores, tmp_path: Path
) -> None:
    """Alice approves, bob comes an hour later: alice's approval no longer counts (1 of 2, his),
    and she may approve again."""
    world = world_with(tmp_path, ApprovalRule(required=2, expires_after=1800.0))
    with wall_clock_at(1_900_000_000.0) as now:
        loop = waiting(stores, world)
        loop.approve("shop", "restock", "2:0", approved=True, by="alice")
        now[0] += 3600
        late = loop.approve("shop", "restock", "2:0", approved=True, by="bob")
        assert late.pending_approvals[0].approved_by == ("bob",)
        loop.approve("shop", "restock", "2:0", approved=True, by="alice")
        assert loop.run_or_resume(spec()).stop.reason is StopReason.GOAL_MET
    assert list(world.effects().values()) == [1]


def test_the_rule_travels_with_the_saved_action_and_an_edit_only_adds(
    stores: Stores, tmp_path: Path
) -> None:
    """Planned under "2 from payments", the WRITE keeps needing two after the manifest drops to
    requiresApproval: true; a manifest raising it to three needs three; and an edit naming
    other groups needs a person in one of each."""
    planned = world_with(tmp_path, PAYMENTS)
    loop = waiting(stores, planned)
    both = ("payments", "treasury", *AUTHENTICATED)
    loop.approve("shop", "restock", "2:0", approved=True, by="alice", groups=both)

    looser = World(planned.journal, approval=frozenset({"place_order"}))
    loop = loop_over(stores, Recorder(RESTOCK), looser.tools())
    held = loop.run_or_resume(spec())
    assert held.stop.reason is StopReason.AWAITING_APPROVAL
    assert held.pending_approvals[0].tally() == "1 of 2"

    stricter = world_with(tmp_path, ApprovalRule(required=3, groups=("treasury",)))
    loop = loop_over(stores, Recorder(RESTOCK), stricter.tools())
    held = loop.run_or_resume(spec())
    (pending,) = held.pending_approvals
    assert pending.tally() == "1 of 3"
    assert pending.rule is not None
    assert pending.rule.describe() == "3 approvals from payments and from treasury"
    with pytest.raises(SettleError, match="may not decide it"):
        loop.approve("shop", "restock", "2:0", approved=True, by="bob", groups=("payments",))
    loop.approve("shop", "restock", "2:0", approved=True, by="bob", groups=both)
    loop.approve("shop", "restock", "2:0", approved=True, by="carol", groups=both)
    assert loop.run_or_resume(spec()).stop.reason is StopReason.GOAL_MET
    assert list(planned.effects().values()) == [1]


def test_a_decision_on_other_arguments_than_the_calls_is_refused(
    stores: Stores, tmp_path: Path
) -> None:
    """A decision made on the call a person was shown carries its idempotency key (a digest of
    the tool and its arguments): another key is refused and nothing is recorded; the right one
    counts."""
    world = world_with(tmp_path, ApprovalRule())
    loop = waiting(stores, world)
    other = idempotency_key("shop", "restock", "place_order", {**ORDER, "qty": 2000})
    with pytest.raises(SettleError, match="its arguments are not the ones shown"):
        loop.approve("shop", "restock", "2:0", approved=True, by="alice", key=other)
    assert loop.state("shop", "restock").approvals == {}
    right = idempotency_key("shop", "restock", "place_order", ORDER)
    loop.approve("shop", "restock", "2:0", approved=True, by="alice", key=right)
    assert loop.run_or_resume(spec()).stop.reason is StopReason.GOAL_MET
    assert list(world.effects().values()) == [1]


def test_an_entry_recorded_twice_under_its_ref_is_one_decision(
    stores: Stores, tmp_path: Path
) -> None:
    """The operator records an Approval object's entry under its ref: recording it again (a
    retried reconcile) changes nothing and writes no second event."""
    world = world_with(tmp_path, TWO)
    loop = waiting(stores, world)
    for _ in range(3):
        loop.approve("shop", "restock", "2:0", approved=True, by="alice", ref="x#alice#1")
    assert len(loop.state("shop", "restock").approvals["2:0"]) == 1
    assert len(only(stores.audit.events("shop", "restock"), "loop.approved")) == 1


@pytest.mark.parametrize("groups", [["a\nb"], ["ok", ""], [f"g{i}" for i in range(65)]])
def test_groups_a_decision_names_are_checked(
    stores: Stores, tmp_path: Path, groups: list[str]
) -> None:
    """A decision's groups are one printable line each, at most 64: else one line naming
    them, nothing recorded."""
    loop = waiting(stores, world_with(tmp_path, TWO))
    with pytest.raises(InputError) as refused:
        loop.approve("shop", "restock", "2:0", approved=True, by="alice", groups=groups)
    assert refused.value.field == "groups"
    assert loop.state("shop", "restock").approvals == {}


def test_a_group_that_is_not_utf8_text_is_refused_and_nothing_saved(
    stores: Stores, tmp_path: Path
) -> None:
    """A group read from bytes that are not UTF-8 (a lone surrogate, as Python decodes them) is
    refused as a person's name is, in one line naming the field: the SQLite store would keep
    it, and the checkpoint would then carry text no other reader can encode."""
    loop = waiting(stores, world_with(tmp_path, TWO))
    before = stores.checkpoints.load("shop", "restock")
    with pytest.raises(InputError) as refused:
        loop.approve("shop", "restock", "2:0", approved=True, by="alice", groups=["caf\udce9"])
    assert refused.value.field == "groups"
    assert str(refused.value) == ("groups: is not valid UTF-8 text (check the terminal's encoding)")
    assert stores.checkpoints.load("shop", "restock") == before
    assert loop.state("shop", "restock").approvals == {}
    assert only(stores.audit.events("shop", "restock"), "loop.approved") == []


def test_rules_combine_to_the_stricter_of_both() -> None:
    """The higher count, the shorter expiry, not the creator if either says so, each rule's
    groups; a tool without a rule of its own asks one approval if it requires approval."""
    a = ApprovalRule(required=2, groups=("payments",), expires_after=3600.0)
    b = ApprovalRule(required=1, groups=("treasury",), not_creator=True, expires_after=600.0)
    both = a.stricter(b)
    assert (both.required, both.not_creator, both.expires_after) == (2, True, 600.0)
    assert both.group_lists() == (("payments",), ("treasury",))
    assert both.admits({"payments", "treasury"}) and not both.admits({"payments"})
    assert a.stricter(None) is a and a.stricter(a) is a
    assert rule_of(
        World(Journal(Path("/dev/null")), approval=frozenset({"notify"})).tools()[2]
    ) == (ApprovalRule())
    assert both.describe() == (
        "2 approvals from payments and from treasury, not the run's creator, each counting for 10m"
    )


def test_a_person_counts_once_with_their_newest_approval() -> None:
    """Two approvals by one person are one; the newer one's age counts; a no anywhere denies."""
    rule = ApprovalRule(required=2, expires_after=60.0)
    old = Decision(True, "alice", "2030-01-01T00:00:00.000Z")
    new = Decision(True, "alice", "2030-01-01T00:02:00.000Z")
    at = 1_893_456_150.0  # 2030-01-01T00:02:30Z
    counted = tally([old, new], rule, creator="", now=at)
    assert [d.at for d in counted.counted] == [new.at] and not counted.met
    assert counted.expires_at == at - 30 + 60
    no = Decision(False, "bob", "2030-01-01T00:02:10.000Z")
    assert tally([old, new, no], rule, creator="", now=at).denied == no


def test_service_accounts_decide_only_where_the_rule_says_so(
    stores: Stores, tmp_path: Path
) -> None:
    """Two ServiceAccounts of one namespace are not two people: by default neither may approve
    or deny (refused in one line naming the rule's serviceAccounts), and nothing is recorded;
    with serviceAccounts: true they count like people."""
    world = world_with(tmp_path, TWO)
    loop = waiting(stores, world)
    for account, yes in (("ci", True), ("cd", False)):
        with pytest.raises(SettleError, match="is a ServiceAccount, and the rule counts people"):
            loop.approve(
                "shop", "restock", "2:0", approved=yes, by=f"system:serviceaccount:shop:{account}"
            )
    assert loop.state("shop", "restock").approvals == {}
    allowed = world_with(tmp_path, replace(TWO, service_accounts=True), "allowed")
    loop = loop_over(stores, Recorder(RESTOCK), allowed.tools())
    assert loop.run_or_resume(spec("robots")).stop.reason is StopReason.AWAITING_APPROVAL
    for account in ("ci", "cd"):
        loop.approve(
            "shop", "robots", "2:0", approved=True, by=f"system:serviceaccount:shop:{account}"
        )
    assert loop.run_or_resume(spec("robots")).stop.reason is StopReason.GOAL_MET
    assert list(allowed.effects().values()) == [1]


def test_a_rule_can_ask_a_reason_to_deny_and_the_reason_is_on_record(
    stores: Stores, tmp_path: Path
) -> None:
    """reasonToDeny: a deny without a note is refused; with one, the note (redacted, one line)
    is on the decision, its loop.denied event, and the run's Denied words."""
    from keelgate.core.approvals import denials

    world = world_with(tmp_path, ApprovalRule(reason_to_deny=True))
    loop = waiting(stores, world)
    with pytest.raises(SettleError, match="its rule asks a reason to deny"):
        loop.approve("shop", "restock", "2:0", approved=False, by="bob", note="  ")
    loop.approve(
        "shop", "restock", "2:0", approved=False, by="bob", note="wrong sku\nbearer-token sk-abc"
    )
    state = loop.state("shop", "restock")
    (decision,) = state.approvals["2:0"]
    assert decision.note.startswith("wrong sku ") and "\n" not in decision.note
    (event,) = only(stores.audit.events("shop", "restock"), "loop.denied")
    assert event.data["note"] == decision.note
    (denial,) = denials(state)
    assert denial.describe() == f"place_order (2:0) denied by bob: {decision.note}"
    assert loop.run_or_resume(spec()).stop.reason is StopReason.GOAL_MET
    assert world.effects() == {}


def test_one_person_cannot_fill_an_actions_decisions(stores: Stores, tmp_path: Path) -> None:
    """expiresAfter 1 s: alice approves again each time her approval expires; after 8 of
    hers no more are taken from her, and bob and carol still decide (the action takes 64)."""
    world = world_with(tmp_path, ApprovalRule(required=2, expires_after=1.0))
    with wall_clock_at(1_900_000_000.0) as now:
        loop = waiting(stores, world)
        for _ in range(8):
            loop.approve("shop", "restock", "2:0", approved=True, by="alice")
            now[0] += 2
        with pytest.raises(SettleError, match="has 8 approvals of alice: no more are taken"):
            loop.approve("shop", "restock", "2:0", approved=True, by="alice")
        loop.approve("shop", "restock", "2:0", approved=True, by="bob")
        loop.approve("shop", "restock", "2:0", approved=True, by="carol")
        assert loop.run_or_resume(spec()).stop.reason is StopReason.GOAL_MET
    assert list(world.effects().values()) == [1]


def test_a_person_at_the_cap_may_still_deny(stores: Stores, tmp_path: Path) -> None:
    """The cap is on approvals: alice, with 8 approvals on the action (no more taken of her),
    may still deny it, and the deny stops it."""
    world = world_with(tmp_path, ApprovalRule(required=3, expires_after=10.0))
    with wall_clock_at(1_900_000_000.0) as now:
        loop = waiting(stores, world)
        for _ in range(8):
            loop.approve("shop", "restock", "2:0", approved=True, by="alice")
            now[0] += 11
        loop.approve("shop", "restock", "2:0", approved=False, by="alice", note="wrong sku")
        assert [d.approved for d in loop.state("shop", "restock").approvals["2:0"]][-1] is False
        loop.run_or_resume(spec())
    assert world.effects() == {}


def test_a_round_is_asked_afresh_only_once_nothing_in_it_can_count(
    stores: Stores, tmp_path: Path
) -> None:
    """ask_again changes nothing while an approval counts, after a deny, or for a round the
    run is no longer in; once every approval of round 1 expired it starts round 2: the round's
    decisions leave the checkpoint (each person has all their room again), the question names
    round 2, loop.asked_again is on the chain, and only round 2's approvals run the call."""
    world = world_with(tmp_path, ApprovalRule(required=2, expires_after=60.0))
    with wall_clock_at(1_900_000_000.0) as now:
        loop = waiting(stores, world)
        loop.approve("shop", "restock", "2:0", approved=True, by="alice")
        before = loop.state("shop", "restock")
        assert loop.ask_again("shop", "restock", "2:0", round=1) == before  # alice counts
        now[0] += 61
        asked = loop.ask_again("shop", "restock", "2:0", round=1)
        assert asked.round_of("2:0") == 2 and asked.approvals["2:0"] == ()
        (pending,) = asked.pending
        assert (pending.round, pending.approvals) == (2, 0)
        assert loop.ask_again("shop", "restock", "2:0", round=1).seq == asked.seq  # done
        (event,) = only(stores.audit.events("shop", "restock"), "loop.asked_again")
        assert event.data["round"] == 2 and event.data["approvedBefore"] == ["alice"]
        loop.approve("shop", "restock", "2:0", approved=True, by="alice")
        loop.approve("shop", "restock", "2:0", approved=True, by="bob")
        keys = [e.key for e in stores.audit.events("shop", "restock") if e.type == "loop.approved"]
        assert len(set(keys)) == 3  # round 2's first decision is not taken for round 1's
        assert loop.run_or_resume(spec()).stop.reason is StopReason.GOAL_MET
    assert list(world.effects().values()) == [1]


def test_a_round_with_a_deny_is_never_asked_afresh(stores: Stores, tmp_path: Path) -> None:
    """bob denies after alice's approval expired: nothing can start a new round (a no is
    never dropped with its round), and the call never runs."""
    world = world_with(tmp_path, ApprovalRule(required=2, expires_after=60.0))
    with wall_clock_at(1_900_000_000.0) as now:
        loop = waiting(stores, world)
        loop.approve("shop", "restock", "2:0", approved=True, by="alice")
        now[0] += 61
        loop.approve("shop", "restock", "2:0", approved=False, by="bob")
        denied = loop.state("shop", "restock")
        assert loop.ask_again("shop", "restock", "2:0", round=1, why="full") == denied
        loop.run_or_resume(spec())
    assert world.effects() == {}


def test_the_judge_says_why_a_decision_cannot_count() -> None:
    """One judge for the command line, decide, the gate and the operator: each reason in its
    own words, and None for a decision that counts."""
    rule = ApprovalRule(required=2, groups=("payments",), not_creator=True, reason_to_deny=True)
    pay = ("payments",)

    def why(approved: bool, by: str, groups: tuple[str, ...] = pay, **more: Any) -> str | None:
        return refusal(rule, approved=approved, by=by, groups=groups, creator="alice", **more)

    assert why(True, "bob") is None
    assert "alice created the run" in str(why(True, "alice"))
    assert why(False, "alice", note="no") is None  # the creator may deny, with a reason
    assert "may not decide it" in str(why(True, "mallory", ()))
    assert "is a ServiceAccount" in str(why(True, "system:serviceaccount:shop:ci"))
    assert "asks a reason to deny" in str(why(False, "bob"))
    assert "approved it already (1 of 2)" in str(why(True, "bob", counted=("bob",)))
