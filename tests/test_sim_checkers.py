"""The simulator's oracle, one checker at a time (issue 48 item 2, issue 49): each checker is fed
a hand-made history of the world and of the product's records that breaks exactly its promise,
and must say so, while every other checker stays quiet; a history that keeps every promise
passes them all. And the model of the chart's admission policies that operator-mode people
decide through, pinned case by case.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from keelgate.kube.naming import DECISIONS_FINALIZER
from keelgate.testing.sim.admission import (
    MAX_DECISIONS,
    User,
    admitted,
    finalizer_refusal,
    mutated,
)
from keelgate.testing.sim.books import (
    SERVICE_ACCOUNT,
    Ask,
    Books,
    Decision,
    Effect,
    Intent,
    ProcessLife,
    Question,
    Sent,
    SpecVersion,
    definition,
    tick_of,
    tick_ref,
)
from keelgate.testing.sim.checkers import CHECKERS, judge, judge_ticks
from keelgate.testing.sim.records import Event, KeyView, PlannedAction, Records

ORDERS = "POST http://shop.sim/orders"
ORDER = {"sku": "A1", "qty": 1, "ref": "p1"}


def manifest(approval: Mapping[str, Any] | None = None, **tool: Any) -> dict[str, Any]:
    place_order: dict[str, Any] = {
        "name": "place_order",
        "sideEffect": "WRITE",
        "http": {"method": "POST", "url": "http://shop.sim/orders"},
        **tool,
    }
    if approval is not None:
        place_order["approval"] = dict(approval)
    return {"goal": "g", "tools": [place_order]}


class History:
    """A run as the world saw it and as the product recorded it, written by hand: by default
    alice's step1 plans one order, sends it once, the shop takes it, and the run finishes."""

    def __init__(self, *, approval: Mapping[str, Any] | None = None) -> None:
        self.books = Books(max_iterations=5)
        self.records = Records(finished=True)
        self.spec(1, 0.0, manifest(approval))
        self.process("step1", 0.0, generation=1)

    # The world's books

    def spec(self, generation: int, at: float, document: Mapping[str, Any]) -> None:
        self.books.specs.append(SpecVersion(generation, at, dict(document)))

    def process(self, name: str, at: float, *, generation: int = 1) -> None:
        self.books.processes[name] = ProcessLife(at, self.books.next_order(), generation)

    def ask(
        self,
        process: str = "step1",
        at: float = 1.0,
        *,
        iteration: int = 1,
        args: Any = ORDER,
        phase: str = "plan",
        tokens: int = 0,
        verdict: str = "accept",
        output: int = 0,
    ) -> None:
        intents = () if args is None else (Intent(str(args["ref"]), "place_order", dict(args)),)
        self.books.asks.append(
            Ask(
                at,
                process,
                phase,
                iteration,
                intents,
                verdict=verdict,
                tokens=tokens,
                order=self.books.next_order(),
                output_tokens=output,
            )
        )

    def send(
        self,
        process: str = "step1",
        at: float = 2.0,
        *,
        key: str = "kg-1",
        known: bool = True,
        refused: bool = False,
        args: Mapping[str, Any] = ORDER,
        endpoint: str = ORDERS,
        reached: bool = True,
    ) -> int:
        self.books.sent.append(
            Sent(
                at,
                process,
                str(args["ref"]),
                "request",
                endpoint,
                dict(args),
                key,
                reached=reached,
                known_at=at if known else None,
                refused=refused,
                order=self.books.next_order(),
            )
        )
        return len(self.books.sent) - 1

    def effect(self, sent: int, at: float | None = None, *, noted: bool = True) -> None:
        """The shop takes the request ``sent``; ``noted``: the chain says how its call ended
        (a ``loop.late_result`` by its key), as the stories that leave the product's records
        out would otherwise break ``audit``'s "every effect is on the chain"."""
        where = self.books.sent[sent]
        moment = where.at if at is None else at
        self.books.effects.append(Effect(moment, where.ref, "request", sent))
        if noted and where.key:
            self.event("loop.late_result", moment, idempotencyKey=where.key, status="ok")

    def decide(
        self,
        by: str,
        at: float,
        *,
        kind: str = "approve",
        yes: bool = True,
        action: str = "1:0",
        human: str = "",
        accepted: bool = True,
        told: bool = True,
        move: str = "",
        shown: str = ORDERS,
        truthful: bool = True,
    ) -> None:
        self.books.decisions.append(
            Decision(
                at,
                kind,
                by,
                human or by,
                action,
                "p1",
                yes,
                shown=shown if kind == "approve" else "",
                truthful=truthful,
                accepted_at=at if accepted else None,
                told=told,
                move=move,
            )
        )

    def question(self, at: float, to: str = "alice") -> None:
        self.books.questions.append(Question(at, to, "1:0", "p1"))

    # The product's records

    def event(self, kind: str, at: float, actor: str = "keelgate", **data: Any) -> None:
        seq = len(self.records.events) + 1
        stamp = self.books.stamp(at)
        self.records.events.append(
            Event(seq, kind, actor, self.books.true_of_stamp(stamp), stamp, data)
        )

    def ordinary(self) -> History:
        """The order planned, sent once, taken, and recorded so."""
        self.ask()
        self.effect(self.send(), noted=False)
        self.event("loop.plan_saved", 1.0, actions=[{"action": "1:0", "idempotencyKey": "kg-1"}])
        self.event("loop.action_started", 1.5, action="1:0", idempotencyKey="kg-1")
        self.event("loop.action_completed", 3.0, action="1:0", status="ok")
        self.records.planned.append(PlannedAction("1:0", "place_order", dict(ORDER)))
        return self

    def broken(self) -> set[str]:
        return {v.rule for v in judge(self.books, self.records)}


def test_a_run_that_keeps_every_promise_passes_every_checker() -> None:
    """The ordinary history (one order planned, sent, taken and recorded) and one with an
    approval, a settlement and a retry after a definite refusal break nothing."""
    assert History().ordinary().broken() == set()
    story = History(approval={"required": 2, "groups": ["payments-approvers"]})
    story.ask()
    refused = story.send(at=1.5, refused=True, reached=True)
    assert refused == 0
    story.decide("bob", 1.6)
    story.decide("carol", 1.7)
    story.effect(story.send(at=2.0, known=False))
    story.question(3.0)
    story.decide("alice", 4.0, kind="settle", yes=True)
    story.event(
        "loop.reconciled",
        4.0,
        actor="alice",
        action="1:0",
        idempotencyKey="kg-1",
        verdict="executed",
    )
    story.event("loop.approved", 1.6, actor="bob", action="1:0")
    story.event("loop.approved", 1.7, actor="carol", action="1:0")
    assert story.broken() == set()


def test_every_promise_has_its_own_checker() -> None:
    """The checkers the oracle runs, by the promise each keeps."""
    assert set(CHECKERS) == {
        "twice",
        "retried",
        "unapproved",
        "after-not-executed",
        "confirmed",
        "told-not-run",
        "unasked",
        "waiting",
        "audit",
        "budget",
        "spent",
        "replanned",
        "altered",
        "again",
        "rejected",
        "two-drivers",
        "spun",
    }


def test_two_drivers_sees_two_clusters_drive_a_run_and_not_a_hand_over() -> None:
    """With two clusters, a step of one cluster writing the run after a step of the other had
    written it under a later epoch (east's epoch 1 after west's 2), or steps of both writing
    under one epoch, is the run driven by both at once; a hand-over (east's writes all before
    west's, and a move back under a later epoch still) and two steps of one cluster writing
    by turns under one epoch (a lost node's process and its replacement) are not."""

    def wrote(story: History, name: str, cluster: str, epoch: int) -> ProcessLife:
        story.books.processes[name] = life = ProcessLife(
            0.0, story.books.next_order(), 1, cluster=cluster, epoch=epoch
        )
        return life

    story = History().ordinary()
    east, west = wrote(story, "east/s1", "east", 1), wrote(story, "west/s2", "west", 2)
    east.wrote.append(story.books.next_order())
    west.wrote.append(story.books.next_order())
    assert story.broken() == set()
    east.wrote.append(story.books.next_order())
    assert story.broken() == {"two-drivers"}

    shared = History().ordinary()
    east, west = wrote(shared, "east/s1", "east", 1), wrote(shared, "west/s1", "west", 1)
    for life in (east, west):
        life.wrote.append(shared.books.next_order())
    assert shared.broken() == {"two-drivers"}

    handed = History().ordinary()
    east, west = wrote(handed, "east/s1", "east", 1), wrote(handed, "west/s2", "west", 2)
    back = wrote(handed, "east/s3", "east", 3)
    for life in (east, east, west, west, back):
        life.wrote.append(handed.books.next_order())
    lost, again = wrote(handed, "east/s4", "east", 3), wrote(handed, "east/s5", "east", 3)
    for life in (lost, again, lost):
        life.wrote.append(handed.books.next_order())
    assert handed.broken() == set()


def test_twice_sees_one_call_take_effect_twice_whatever_its_keys() -> None:
    """The shop acting twice on one call breaks "once", told apart by the world's ref: here a
    request the shop took twice (a duplicated delivery), with no second send to blame."""
    story = History().ordinary()
    story.effect(0, at=2.5)
    assert story.broken() == {"twice"}


def test_a_read_may_take_effect_and_be_sent_as_often_as_the_model_likes() -> None:
    """The spec owner's READ changes nothing: taken twice, it breaks no promise of a WRITE."""
    story = History()
    story.books.specs[0] = SpecVersion(1, 0.0, manifest(sideEffect="READ"))
    story.ordinary()
    story.effect(0, at=2.5)
    assert story.broken() == set()


def test_retried_sees_a_call_sent_again_after_a_send_nobody_knew_the_outcome_of() -> None:
    """A request lost on the way (no effect, no answer) and the same call sent again under a
    new key, even though it never took effect twice: not knowing is a reason to stop."""
    story = History()
    story.ask()
    story.send(at=2.0, known=False, reached=False)
    story.question(2.5)
    story.effect(story.send(at=3.0, key="kg-2"))
    assert story.broken() == {"retried"}


def test_retried_lets_a_call_go_again_after_a_definite_refusal() -> None:
    """A 4xx took no effect, and its sender knew it: the same call may be made again."""
    story = History()
    story.ask()
    story.send(at=1.5, refused=True)
    story.effect(story.send(at=2.0))
    assert "retried" not in story.broken()


def test_a_read_of_a_write_may_be_sent_again_and_need_not_be_asked_about() -> None:
    """A composite WRITE's quote is a GET, which the shop answers without acting on: one lost
    on the way, then the call tried afresh (its tool reported nothing, and the deadline passed
    before its charge) sends the quote again and then the charge, once. Not knowing what a
    request that changes nothing came to is no reason to stop, nor to ask anyone; the charge
    lost the same way and sent again is."""
    story = History()
    story.ask()
    quote = {"sku": "A1", "qty": 1, "ref": "p1"}
    for at in (1.5, 2.5):
        story.books.sent.append(
            Sent(
                at,
                "step1",
                "p1",
                "quote",
                "GET http://shop.sim/quotes",
                quote,
                "kg-1",
                order=story.books.next_order(),
            )
        )
    story.effect(story.send(at=3.0))
    assert story.broken() == set()
    story.send(at=1.8, known=False, reached=False)
    story.question(2.0)
    story.books.sent.sort(key=lambda s: s.at)
    story.books.effects[0] = Effect(3.0, "p1", "request", 3)
    assert story.broken() == {"retried"}


def test_a_held_up_step_sends_as_a_read_what_its_plan_read_as_one() -> None:
    """The tool was a READ when step1 planned the call and step2 read that plan; the owner then
    made it a WRITE and step3 planned the call again and sent it, its outcome unknown; step2,
    held up meanwhile, goes on and sends its plan's READ. That send is judged by the plan step2
    followed, never by the newer one it never saw: no WRITE was sent again."""
    story = History()
    story.books.specs[0] = SpecVersion(1, 0.0, manifest(sideEffect="READ"))
    story.ask()
    story.effect(story.send(at=2.0, key=""))
    story.process("step2", 3.0)
    story.spec(2, 4.0, manifest())
    story.process("step3", 5.0, generation=2)
    story.ask("step3", at=5.0, iteration=2)
    story.send("step3", at=6.0, known=False, reached=False)
    story.question(7.0)
    story.effect(story.send("step2", at=8.0, key=""))
    assert not story.broken() & {"twice", "retried"}


def _a_plan_fenced_off_after_the_one_saved(*, answer_lost: bool) -> History:
    """step2 plans the order while the tool is a READ and saves its plan; step1, held up since
    before the edit, then gets its answer (under the WRITE it read) and fails to save it;
    step3 reads the saved plan and sends the READ, its outcome unknown (a 503)."""
    story = History()
    story.spec(2, 0.5, manifest(sideEffect="READ"))
    story.process("step2", 0.6, generation=2)
    story.ask("step2", at=0.7)
    story.books.plan_saved("step2")
    story.ask("step1", at=1.0)
    if answer_lost:
        story.books.answer_lost("step1")
    story.process("step3", 2.0, generation=2)
    story.effect(story.send("step3", at=2.5, key="", known=False))
    return story


def test_a_plan_its_step_never_saved_is_no_plan_a_later_step_follows() -> None:
    """step3 followed step2's saved plan (a READ), not step1's answer that was never saved: its
    unknown outcome breaks no promise of a WRITE."""
    assert _a_plan_fenced_off_after_the_one_saved(answer_lost=False).broken() == set()


def test_a_plan_whose_save_may_have_landed_unheard_counts_too() -> None:
    """Had step1's save landed while its answer was lost, step3 may have read step1's plan (a
    WRITE): the oracle takes the stricter of the two, and an unknown WRITE nobody was asked
    about breaks its promise."""
    assert "unasked" in _a_plan_fenced_off_after_the_one_saved(answer_lost=True).broken()


def _a_newer_plan_saved_unheard(*, read_by_another: bool, again: int = 2) -> History:
    """step1 plans the order while the tool is a WRITE and saves its plan; the owner makes it a
    READ; step2 plans the order again with a notice (p9), under the READ, for iteration
    ``again``, and its answer to the save is lost. With ``read_by_another``, step4 (asking
    nothing) then sends p9, which only step2's plan had: step2's save landed. step3 starts
    later and sends the order, its outcome unknown."""
    story = History()
    story.ask()
    story.books.plan_saved("step1")
    story.spec(2, 1.5, manifest(sideEffect="READ"))
    story.process("step2", 1.6, generation=2)
    notice = Intent("p9", "notify", {"sku": "A1", "ref": "p9"})
    order = Intent("p1", "place_order", dict(ORDER))
    story.books.asks.append(
        Ask(1.7, "step2", "plan", again, (order, notice), order=story.books.next_order())
    )
    story.books.answer_lost("step2")
    if read_by_another:
        story.process("step4", 1.8, generation=2)
        story.send("step4", at=1.9, key="", args={"sku": "A1", "ref": "p9"})
    story.process("step3", 2.0, generation=2)
    story.send("step3", at=2.5, key="", known=False)
    return story


def test_a_save_heard_of_by_a_later_step_is_the_plan_followed_not_the_one_before_it() -> None:
    """step2 asked the model to plan iteration 2 after step1's plan of iteration 1 was saved:
    it had read that plan done, so no later step follows it. step3, asking nothing, sent the
    order: it followed step2's plan (a READ), whose save it proves landed, with or without
    step4's send of p9 (which only step2's plan had); the older, stricter plan judges nothing
    (an oracle that kept judging by it called a loosened rule's call unapproved, and asked
    about a READ). Had step2 planned iteration 1 again (its own read before step1's save), the
    older plan would still judge: step3's unknown order under step1's WRITE, nobody asked."""
    assert _a_newer_plan_saved_unheard(read_by_another=False).broken() == set()
    assert _a_newer_plan_saved_unheard(read_by_another=True).broken() == set()
    assert "unasked" in _a_newer_plan_saved_unheard(read_by_another=False, again=1).broken()


@pytest.mark.parametrize(
    ("rule", "decisions", "why"),
    [
        ({"required": 1}, [], "nobody approved"),
        ({"required": 2}, [("bob", 1.5, {})], "one of two"),
        ({"required": 2}, [("bob", 1.5, {}), ("bob", 1.6, {})], "the same person twice"),
        ({"required": 1}, [("bob", 1.5, {"yes": False}), ("carol", 1.6, {})], "a deny"),
        ({"required": 1, "notCreator": True}, [("alice", 1.5, {})], "the creator"),
        ({"required": 1, "groups": ["payments-approvers"]}, [("dave", 1.5, {})], "no group"),
        ({"required": 1, "expiresAfter": "60s"}, [("bob", -100.0, {})], "expired"),
        (
            {"required": 1},
            [("bob", 1.5, {"shown": "POST http://shop.sim/elsewhere"})],
            "another definition",
        ),
        (
            {"required": 1},
            [(SERVICE_ACCOUNT, 1.5, {"human": "bob"})],
            "a ServiceAccount",
        ),
        ({"required": 2}, [("bob", 1.5, {}), ("bob", 1.6, {"move": "copy"})], "a copy"),
        ({"required": 1}, [("bob", 1.5, {"accepted": False})], "a refused approval"),
        ({"required": 1}, [("bob", 2.5, {})], "an approval made after the request left"),
    ],
)
def test_unapproved_sees_an_effect_without_the_approvals_its_rule_asks(
    rule: Mapping[str, Any], decisions: list[tuple[str, float, dict[str, Any]]], why: str
) -> None:
    """Each way an approval can fall short of the rule in force (nobody, too few, one person
    twice, a deny, the creator under notCreator, someone outside the groups, one too old, one
    made when the tool went elsewhere, a ServiceAccount, a copy of someone's entry, one the
    product refused, one made after the request left) leaves the order unapproved."""
    story = History(approval=rule)
    for by, at, extra in decisions:
        story.decide(by, at, told=False, **extra)
    story.ordinary()
    assert story.broken() == {"unapproved"}, why


def test_a_deny_made_after_the_approvals_were_enough_comes_too_late() -> None:
    """bob's approval met the rule before carol denied: the call was approved (a deny made while
    approvals were still missing would have denied it, as the parameters above show)."""
    story = History(approval={"required": 1})
    story.decide("bob", 1.5, told=False)
    story.decide("carol", 1.6, yes=False, told=False)
    story.ordinary()
    assert story.broken() == set()


def test_a_deny_made_where_no_operator_ran_binds_from_when_one_runs_there_again() -> None:
    """With two clusters, carol denies on an Approval of a cluster where no operator runs: no
    process of the product can read it, and the other cluster runs the call on bob's approval
    made there. Never read before the request left, or read only once bob's approval was
    enough, it denies nothing; read (an operator running there again) before bob approved, and
    neither recorded nor shown refused, it denies the call."""
    for read_at, broken in ((None, set()), (1.8, set()), (1.4, {"unapproved"})):
        story = History(approval={"required": 1})
        story.decide("carol", 1.2, yes=False, told=False)
        story.books.decisions[-1].unread = True
        story.books.decisions[-1].read_at = read_at
        story.decide("bob", 1.5, told=False)
        story.ordinary()
        assert story.broken() == broken, read_at


def test_an_approval_counts_for_where_the_run_may_have_shown_the_call_to_go() -> None:
    """An approval made while the world cannot tell which of two definitions the run showed
    (the newest step died before it recorded where the run stands: ``shown_also``) counts for
    a request to either, and for nowhere else."""
    for also, broken in (("POST http://shop.sim/orders",), set()), ((), {"unapproved"}):
        story = History(approval={"required": 1})
        story.decide("bob", 1.5, told=False, shown="DELETE http://shop.sim/orders")
        story.books.decisions[-1].shown_also = also
        story.ordinary()
        assert story.broken() == broken
    story = History(approval={"required": 1})
    story.decide("bob", 1.5, told=False, shown="DELETE http://shop.sim/orders")
    story.books.decisions[-1].shown_also = ("POST http://shop.sim/steal",)
    story.ordinary()
    assert story.broken() == {"unapproved"}


def test_an_approval_of_one_remote_tool_of_an_mcp_server_counts_for_no_other() -> None:
    """Where an MCP tool's call goes is its server and the remote tool it names, as a person is
    shown it (``books.definition``) and as the world books the request (``mcp URL TOOL``): an
    approval of the call to the server's ``place_order`` counts for a request that tool
    received, and for none the same server's ``place_rush_order`` received (the manifest's
    tool pointed there after the approval)."""
    mcp = {"url": "http://shop.sim/mcp", "tool": "place_order"}
    shown = definition({"name": "place_order", "mcp": mcp})
    assert shown == "mcp http://shop.sim/mcp place_order"
    for remote, broken in (("place_order", set()), ("place_rush_order", {"unapproved"})):
        story = History(approval={"required": 1})
        story.decide("bob", 1.5, told=False, shown=shown)
        story.ask()
        story.effect(story.send(endpoint=f"mcp http://shop.sim/mcp {remote}"), noted=False)
        story.event("loop.plan_saved", 1.0, actions=[{"action": "1:0", "idempotencyKey": "kg-1"}])
        story.event("loop.action_started", 1.5, action="1:0", idempotencyKey="kg-1")
        story.event("loop.action_completed", 3.0, action="1:0", status="ok")
        story.records.planned.append(PlannedAction("1:0", "place_order", dict(ORDER)))
        assert story.broken() == broken, remote


@pytest.mark.parametrize(
    ("planned", "now", "counts"),
    [(True, True, True), (True, False, False), (False, True, False), (False, False, False)],
)
def test_a_service_account_counts_only_where_both_rules_let_service_accounts_decide(
    planned: bool, now: bool, counts: bool
) -> None:
    """A call planned under one rule and sent under an edited one is held to both: "a person
    must be in one of each rule's groups, ServiceAccounts only if both let them"
    (docs/manifest.md, approval rules). bob's CI job approves the order as the ServiceAccount
    ``ci``: the approval counts where the rule it was planned under and the rule the sender
    was given both say ``serviceAccounts: true``, and where either does not, the order went
    out unapproved."""
    story = History(approval={"required": 1, **({"serviceAccounts": True} if planned else {})})
    story.ask()
    story.spec(2, 1.2, manifest({"required": 1, **({"serviceAccounts": True} if now else {})}))
    story.process("step2", 1.3, generation=2)
    story.decide(SERVICE_ACCOUNT, 1.5, human="bob", told=False)
    story.effect(story.send("step2", at=2.0))
    assert story.broken() == (set() if counts else {"unapproved"}), (planned, now)


def test_a_service_account_is_one_approver_whoever_acts_through_it() -> None:
    """Under a rule of two approvals that lets ServiceAccounts decide, bob and the ServiceAccount
    ``ci`` (bob's CI job) are two names the product counts: the world counts the ServiceAccount
    as itself, whoever acted through it (notCreator cannot tell either: alice, the creator,
    approving as ``ci`` counts). ``ci`` twice is one approval, not two; and a ServiceAccount's
    deny, where the rule lets ServiceAccounts decide, denies where the rule names no groups
    (under one that does, its token's groups decide, which the world does not judge)."""
    rule = {"required": 2, "serviceAccounts": True, "notCreator": True}
    story = History(approval=rule)
    story.decide("bob", 1.4, told=False)
    story.decide(SERVICE_ACCOUNT, 1.5, human="alice", told=False)
    story.ordinary()
    assert story.broken() == set()
    twice = History(approval=rule)
    twice.decide(SERVICE_ACCOUNT, 1.4, human="bob", told=False)
    twice.decide(SERVICE_ACCOUNT, 1.5, human="carol", told=False)
    twice.ordinary()
    assert twice.broken() == {"unapproved"}
    denied = History(approval={"required": 1, "serviceAccounts": True})
    denied.decide(SERVICE_ACCOUNT, 1.2, human="dave", yes=False, told=False)
    denied.decide("bob", 1.5, told=False)
    denied.ordinary()
    assert denied.broken() == {"unapproved"}
    # Under a rule naming groups, the ServiceAccount's groups are its token's: the product may
    # have refused its deny, which then denied nothing for sure.
    grouped = History(approval={"required": 1, "serviceAccounts": True, "groups": ["shop-devs"]})
    grouped.decide(SERVICE_ACCOUNT, 1.2, human="dave", yes=False, told=False)
    grouped.decide("bob", 1.5, told=False)
    grouped.ordinary()
    assert grouped.broken() == set()


def test_unapproved_reads_the_rule_the_call_was_planned_under() -> None:
    """The rule is dropped after the plan: the call still needs what it was planned under."""
    story = History(approval={"required": 1})
    story.ask()
    story.spec(2, 1.5, manifest())
    story.process("step2", 1.6, generation=2)
    story.effect(story.send("step2", at=2.0))
    assert story.broken() == {"unapproved"}


def test_after_not_executed_sees_an_effect_after_a_true_not_executed_stood() -> None:
    """alice says "not executed" while nothing had happened, it stands, and the held request
    then takes effect."""
    story = History()
    story.ask()
    sent = story.send(at=2.0, known=False)
    story.question(3.0)
    story.decide("alice", 3.0, kind="settle", yes=False)
    story.event("loop.reconciled", 3.0, actor="alice", action="1:0", verdict="abandoned")
    story.effect(sent, at=4.0)
    assert story.broken() == {"after-not-executed"}


def test_after_not_executed_sees_the_confirmers_not_executed_from_when_the_chain_has_it() -> None:
    """The confirmer says "not executed" (it is told nothing: its decision stands from the
    chain's record of it), and the held request then takes effect."""
    story = History()
    story.ask()
    sent = story.send(at=2.0, known=False)
    story.question(3.0, to="shop-confirmer")
    confirmer = "shop-confirmer"
    story.books.decisions.append(
        Decision(3.0, "settle", confirmer, confirmer, "1:0", "p1", False, source="confirmer")
    )
    settled = {"action": "1:0", "verdict": "abandoned", "source": "confirmer"}
    story.event("loop.reconciled", 3.0, actor=confirmer, **settled)
    assert story.broken() == set()
    story.effect(sent, at=4.0)
    assert story.broken() == {"after-not-executed"}


def _a_confirmer_asked_of_an_order(*, taken: bool, executed: bool) -> History:
    """step1 sends the order (its outcome unknown to it: a 503), which the shop took or not;
    the product's HTTP confirmer is asked about it and the shop's answer that reached it said
    ``executed`` (booked as the confirmer's decision about the call the product asked of, true
    or false by the shop's ledger), and the chain records the confirmer's settlement so."""
    story = History()
    story.ask()
    sent = story.send(at=2.0, known=False)
    if taken:
        story.effect(sent)
    confirmer = "http-confirmer"
    story.question(40.0, to=confirmer)
    story.books.decisions.append(
        Decision(
            40.0,
            "settle",
            confirmer,
            confirmer,
            "1:0",
            "p1",
            executed,
            truthful=executed == taken,
            source="confirmer",
        )
    )
    verdict = "executed" if executed else "abandoned"
    story.event(
        "loop.reconciled",
        40.0,
        actor=confirmer,
        action="1:0",
        verdict=verdict,
        idempotencyKey="kg-1",
        source="confirmer",
    )
    return story


def test_confirmed_sees_a_confirmers_settlement_the_shops_ledger_says_was_false() -> None:
    """The shop told the truth of what it was asked, yet the confirmer's "not executed" of an
    order the shop took (or "executed" of one it never took) stands on the chain: the product
    asked about another call than the one it settled. A true verdict breaks nothing, and a
    false one the chain never took (refused as too early) settled nothing."""
    for taken, executed in ((True, True), (False, False)):
        assert _a_confirmer_asked_of_an_order(taken=taken, executed=executed).broken() == set()
    assert _a_confirmer_asked_of_an_order(taken=True, executed=False).broken() == {"confirmed"}
    assert _a_confirmer_asked_of_an_order(taken=False, executed=True).broken() == {"confirmed"}
    unrecorded = _a_confirmer_asked_of_an_order(taken=True, executed=False)
    unrecorded.records.events = [
        e for e in unrecorded.records.events if e.type != "loop.reconciled"
    ]
    assert "confirmed" not in unrecorded.broken()


def test_confirmed_leaves_a_persons_wrong_settlement_to_the_person() -> None:
    """alice's wrong "not executed" (people err here) is hers, not the product's."""
    story = History()
    story.ask()
    story.effect(story.send(at=2.0, known=False))
    story.question(3.0)
    story.decide("alice", 3.0, kind="settle", yes=False, truthful=False)
    story.event(
        "loop.reconciled",
        3.0,
        actor="alice",
        action="1:0",
        verdict="abandoned",
        idempotencyKey="kg-1",
    )
    assert "confirmed" not in story.broken()


def test_after_not_executed_leaves_a_wrong_not_executed_to_the_other_checkers() -> None:
    """alice says "not executed" of a call that had already taken effect: that promise is
    about a true one; the later second effect is "twice"."""
    story = History()
    story.ask()
    sent = story.send(at=2.0, known=False)
    story.effect(sent)
    story.question(3.0)
    story.decide("alice", 3.0, kind="settle", yes=False, truthful=False)
    story.event("loop.reconciled", 3.0, actor="alice", action="1:0", verdict="abandoned")
    story.effect(sent, at=4.0)
    assert story.broken() == {"twice"}


def test_told_not_run_sees_an_effect_of_a_call_recorded_as_not_run() -> None:
    """The run recorded an error for the action whose request took effect."""
    story = History()
    story.ask()
    story.effect(story.send(at=2.0))
    story.event("loop.action_started", 1.5, action="1:0", idempotencyKey="kg-1")
    story.event("loop.action_completed", 3.0, action="1:0", status="error")
    assert story.broken() == {"told-not-run"}


def test_told_not_run_sees_a_call_sent_after_its_action_was_recorded_as_not_run() -> None:
    """A stale process sends its old plan's call after the run recorded the action refused
    (the shop refuses it too): the record said the call was over, and it went out again. The
    same story without that late send keeps the promise."""
    story = History()
    story.ask()
    story.send(at=2.0, refused=True)
    story.event("loop.action_started", 1.5, action="1:0", idempotencyKey="kg-1")
    story.event("loop.action_completed", 3.0, action="1:0", status="refused")
    assert story.broken() == set()
    story.send("step1", at=4.0, refused=True)
    assert story.broken() == {"told-not-run"}


def test_unasked_sees_an_unknown_outcome_nobody_was_asked_about() -> None:
    """A request whose answer never came, and a run that finished without asking anyone."""
    story = History()
    story.ask()
    story.effect(story.send(at=2.0, known=False))
    assert story.broken() == {"unasked"}


def test_unasked_counts_no_question_asked_before_the_request_left() -> None:
    story = History()
    story.ask()
    story.question(1.5)
    story.effect(story.send(at=2.0, known=False))
    assert story.broken() == {"unasked"}


def test_unasked_takes_an_executed_that_stood_before_the_request_left_as_its_answer() -> None:
    """alice settles the call "executed" while a held-up process has not sent it yet (the store
    takes "executed" at once: nothing a thawed process can do makes it less true); the process
    then sends it and never learns the answer: the settlement answers it. A settlement refused
    (never stood) or a "not executed" answers nothing."""
    story = History()
    story.ask()
    story.question(1.5)
    story.decide("alice", 1.6, kind="settle", yes=True)
    story.event("loop.reconciled", 1.6, actor="alice", action="1:0", verdict="executed")
    story.effect(story.send(at=2.0, known=False))
    assert "unasked" not in story.broken()
    refused = History()
    refused.ask()
    refused.question(1.5)
    refused.decide("alice", 1.6, kind="settle", yes=True, accepted=False, told=False)
    refused.effect(refused.send(at=2.0, known=False))
    assert "unasked" in refused.broken()


def test_unasked_takes_the_confirmers_executed_on_the_chain_as_the_answer_to_a_later_part() -> None:
    """The confirmer says "executed" of a composite call whose first request took effect (it is
    told nothing: its word stands from the chain's record of it); the held-up process then sends
    the call's next request and never hears back: the confirmer's word answers it, once the
    chain has it."""
    story = History()
    story.ask()
    story.effect(story.send(at=2.0, known=False))
    confirmer = "shop-confirmer"
    story.books.decisions.append(
        Decision(3.0, "settle", confirmer, confirmer, "1:0", "p1", True, source="confirmer")
    )
    story.effect(story.send(at=4.0, known=False))
    assert "unasked" in story.broken()  # the chain does not have it (yet)
    settled = {"action": "1:0", "verdict": "executed", "source": "confirmer"}
    story.event("loop.reconciled", 3.0, actor=confirmer, **settled)
    assert "unasked" not in story.broken()


def test_waiting_sees_a_run_that_never_finished() -> None:
    story = History().ordinary()
    story.records.finished, story.records.shown = False, "Stopped awaiting_approval"
    assert story.broken() == {"waiting"}


def test_audit_sees_a_decision_missing_from_the_chain() -> None:
    """The product told bob his approval was recorded; the chain has no trace of it."""
    story = History().ordinary()
    story.decide("bob", 1.5)
    assert story.broken() == {"audit"}


def test_audit_sees_a_decision_on_the_chain_that_nobody_made() -> None:
    """The chain records bob's approval twice; bob approved once (the second is a copy of his
    entry, appended by alice)."""
    story = History().ordinary()
    story.decide("bob", 1.5)
    story.decide("bob", 1.6, move="copy", human="alice", told=False)
    story.event("loop.approved", 1.5, actor="bob", action="1:0")
    story.event("loop.approved", 1.7, actor="bob", action="1:0")
    assert story.broken() == {"audit"}


def test_audit_sees_a_settlement_of_the_store_not_on_the_chain_or_a_broken_chain() -> None:
    story = History().ordinary()
    story.records.keys["kg-1"] = KeyView("completed", "bob", "human")
    assert story.broken() == {"audit"}
    story = History().ordinary()
    story.records.chain_problems.append("event 3: hash does not match")
    assert story.broken() == {"audit"}


def test_audit_sees_a_settlement_on_the_chain_that_nobody_made() -> None:
    """The chain records bob settling the order as executed; nobody settled anything."""
    story = History().ordinary()
    story.event("loop.reconciled", 4.0, actor="bob", action="1:0", verdict="executed")
    assert story.broken() == {"audit"}


def test_audit_sees_a_write_that_took_effect_with_no_end_of_its_call_on_the_chain() -> None:
    """The order took effect and its action started, but the chain never says how its call
    ended (its completion skipped as a repeat of another action's, say); a late end noted by
    key, or a settlement of its key, is such an end; a run still waiting is ``waiting``'s."""
    story = History().ordinary()
    story.records.events = [e for e in story.records.events if e.type != "loop.action_completed"]
    assert story.broken() == {"audit"}
    story.event("loop.late_result", 5.0, action="1:0", idempotencyKey="kg-1", status="ok")
    assert story.broken() == set()
    story = History().ordinary()
    story.records.events = [e for e in story.records.events if e.type != "loop.action_completed"]
    story.records.finished = False
    assert story.broken() == {"waiting"}
    # A completion of the same action id before this call started (another plan's) is no end.
    story = History().ordinary()
    story.records.events = [e for e in story.records.events if e.type == "loop.plan_saved"]
    story.event("loop.action_completed", 1.2, action="1:0", status="ok")
    story.event("loop.action_started", 1.5, action="1:0", idempotencyKey="kg-1")
    assert story.broken() == {"audit"}


def test_budget_sees_the_model_asked_past_the_iterations_allowed() -> None:
    story = History().ordinary()
    story.books.max_iterations = 1
    story.ask(at=5.0, iteration=2, args=None)
    assert story.broken() == {"budget"}


def test_budget_sees_more_tokens_than_the_budget_and_one_call_allow() -> None:
    """A token budget may be passed by the one call that crossed it, never by more."""
    story = History().ordinary()
    story.books.max_tokens, story.books.call_tokens = 100, 10
    story.records.tokens = 110
    assert story.broken() == set()
    story.records.tokens = 111
    assert story.broken() == {"budget"}


def _a_plan_past_the_token_budget(tokens: int, *, read: bool = False) -> History:
    """Iteration 1 planned and verified (100 tokens each), iteration 2's plan (its answer 150
    tokens: 350 in all) sent by step1 under a token budget of ``tokens``: place_order a WRITE,
    or a READ."""
    story = History()
    story.books.specs[0] = SpecVersion(
        1,
        0.0,
        {**manifest(**({"sideEffect": "READ"} if read else {})), "budget": {"tokens": tokens}},
    )
    story.ask(at=0.5, args={"sku": "B2", "qty": 1, "ref": "p0"}, tokens=100)
    story.ask(at=0.8, phase="verify", args=None, tokens=100)
    story.ask(at=1.0, iteration=2, tokens=150)
    story.effect(story.send(at=2.0), noted=False)
    story.event("loop.action_started", 1.5, action="2:0", idempotencyKey="kg-1")
    story.event("loop.action_completed", 3.0, action="2:0", status="ok")
    return story


def test_spent_sees_a_call_of_the_plan_whose_answer_crossed_the_token_budget() -> None:
    """The model's answer for iteration 2 took the run to 350 tokens: with a budget of 350 its
    order may go; with 349 the answer is paid for and nothing of its plan runs, a READ no more
    than a WRITE (the product judged by its own record would see no such thing: the world
    counts what its model returned)."""
    assert _a_plan_past_the_token_budget(350).broken() == set()
    assert _a_plan_past_the_token_budget(349).broken() == {"spent"}
    assert _a_plan_past_the_token_budget(349, read=True).broken() == {"spent"}


def test_spent_counts_one_answer_for_each_plan_and_verdict() -> None:
    """A plan asked twice (its first asker died before saving it) is recorded once: the
    cheapest answer of each plan and verdict counts, so two answers of 200 tokens for one plan
    leave a budget of 250 unspent, and pass one of 199."""
    for budget, broken in ((250, set()), (199, {"spent"})):
        story = History()
        story.books.specs[0] = SpecVersion(1, 0.0, {**manifest(), "budget": {"tokens": budget}})
        story.process("step0", 0.0)
        story.ask("step0", at=0.2, tokens=200)
        story.ask(at=1.0, tokens=200)
        story.effect(story.send(at=2.0))
        assert story.broken() == broken


def test_spent_judges_each_process_by_the_budget_it_was_given() -> None:
    """A budget raised after the plan (generation 2) lets the step given it send; lowered
    after the plan, it holds back the step given it, not one still on the spec it started
    with."""
    raised = _a_plan_past_the_token_budget(300)
    raised.spec(2, 1.2, {**manifest(), "budget": {"tokens": 1800}})
    raised.books.processes["step1"].generation = 2
    assert raised.broken() == set()
    lowered = _a_plan_past_the_token_budget(1800)
    lowered.spec(2, 1.2, {**manifest(), "budget": {"tokens": 300}})
    assert lowered.broken() == set()
    lowered.books.processes["step1"].generation = 2
    assert lowered.broken() == {"spent"}


def test_spent_sees_the_model_asked_once_a_budget_was_used_up() -> None:
    """After iteration 1's plan and verdict used 200 tokens of a budget of 150, the model is
    asked nothing more; with a limit of one iteration, no plan of a second is asked for."""
    story = History()
    story.books.specs[0] = SpecVersion(1, 0.0, {**manifest(), "budget": {"tokens": 150}})
    story.ask(at=0.5, args=None, tokens=100)
    story.ask(at=0.8, phase="verify", args=None, tokens=100)
    assert story.broken() == set()
    story.ask(at=1.0, iteration=2, args=None, tokens=100)
    assert story.broken() == {"spent"}
    story = History()
    story.books.specs[0] = SpecVersion(1, 0.0, {**manifest(), "budget": {"maxIterations": 1}})
    story.ask(at=0.5, args=None)
    story.ask(at=0.8, phase="verify", args=None)
    assert story.broken() == set()
    story.ask(at=1.0, iteration=2, args=None)
    assert story.broken() == {"spent"}


def _asked_near_the_budget(tokens: int, *, estimate: int, dollars: str | None = None) -> History:
    """Iteration 1 planned and verified (140 tokens each: 100 of input, 40 of output, by the
    model's count), then the model asked to plan iteration 2 (100 input tokens again), the
    product's estimate of that question's input having been at least ``estimate`` (0: not
    known), under a token budget of ``tokens`` (or a dollar budget, the model at $3 and $15
    per million input and output tokens)."""
    story = History()
    budget: dict[str, Any] = {"tokens": tokens}
    prices: dict[str, Any] = {}
    if dollars is not None:
        budget = {"dollars": dollars}
        prices = {"pricing": {"inputPerMillionTokens": "3", "outputPerMillionTokens": "15"}}
    story.books.specs[0] = SpecVersion(1, 0.0, {**manifest(), "budget": budget, **prices})
    story.ask(at=0.5, args=None, tokens=140, output=40)
    story.ask(at=0.8, phase="verify", args=None, tokens=140, output=40)
    story.books.asks.append(
        Ask(
            1.0,
            "step1",
            "plan",
            2,
            (),
            tokens=140,
            order=story.books.next_order(),
            output_tokens=40,
            estimate=estimate,
        )
    )
    return story


def test_spent_sees_the_model_asked_a_question_whose_input_alone_passes_the_budget() -> None:
    """280 tokens used and the next question's input 100 tokens by the model's count: the
    product refuses it under a budget below 380 (the pre-call check), its estimate never less
    than the model's count here (300 at least). With a budget of 380 the call may be made (and
    its output may take the run past it); under 380 it is asked past its budget. The same for
    dollars: $0.0018 used, and the input alone at $3 a million is $0.0003."""
    assert _asked_near_the_budget(380, estimate=300).broken() == set()
    assert _asked_near_the_budget(379, estimate=300).broken() == {"spent"}
    said = _asked_near_the_budget(379, estimate=300)
    lines = {str(v) for v in judge(said.books, said.records)}
    assert any("after 280 tokens, its input alone (100 tokens) passing" in v for v in lines), lines
    assert _asked_near_the_budget(1, estimate=300, dollars="0.0021").broken() == set()
    assert _asked_near_the_budget(1, estimate=300, dollars="0.00209").broken() == {"spent"}


def test_spent_holds_only_what_the_products_estimate_can_have_seen_against_it() -> None:
    """The product decides on its estimate of the input: where that can have been as low as 60
    tokens (the model counting 100), only 60 is held against it (a budget of 340 is kept,
    one of 339 passed); where the world does not know the estimate, the question is judged
    as before, by what was used only."""
    assert _asked_near_the_budget(340, estimate=60).broken() == set()
    assert _asked_near_the_budget(339, estimate=60).broken() == {"spent"}
    assert _asked_near_the_budget(281, estimate=0).broken() == set()
    assert _asked_near_the_budget(279, estimate=0).broken() == {"spent"}


def _answers_priced(dollars: str, *, tokens: int | None = None, priced: bool = True) -> History:
    """Iteration 1 planned and verified, iteration 2's plan sent by step1, under a spec whose
    model costs $3 and $15 per million input and output tokens, with a dollar budget of
    ``dollars`` (and a token budget of ``tokens``; no prices unless ``priced``). Each answer
    was 100 input tokens (cached or not, as the model counts them) and 40 output tokens:
    $0.0009 each at these prices, $0.0027 for the three; at the input price alone (output
    priced as input) $0.00042 each."""
    story = History()
    budget: dict[str, Any] = {"dollars": dollars}
    if tokens is not None:
        budget["tokens"] = tokens
    pricing = {"inputPerMillionTokens": "3", "outputPerMillionTokens": "15"}
    prices = {"pricing": pricing} if priced else {}
    story.books.specs[0] = SpecVersion(1, 0.0, {**manifest(), "budget": budget, **prices})
    story.ask(at=0.5, args={"sku": "B2", "qty": 1, "ref": "p0"}, tokens=140, output=40)
    story.ask(at=0.8, phase="verify", args=None, tokens=140, output=40)
    story.ask(at=1.0, iteration=2, tokens=140, output=40)
    story.effect(story.send(at=2.0), noted=False)
    story.event("loop.action_started", 1.5, action="2:0", idempotencyKey="kg-1")
    story.event("loop.action_completed", 3.0, action="2:0", status="ok")
    return story


def test_spent_prices_each_answer_at_the_spec_s_prices_against_its_dollar_budget() -> None:
    """The three answers before iteration 2's order cost $0.0027 at the spec's prices (output
    dearer than input): a dollar budget of $0.0027 lets the order go, one of $0.0026 holds it
    back, and the model asked once more after them is asked past it. The world prices the
    model's own record of each answer's tokens, so a product that priced output as input
    ($0.00126 for the three), or counted its records' dollars as spent, passes no such
    budget; the product's records of its usage are not read (they say nothing here)."""
    assert _answers_priced("0.0027").broken() == set()
    assert _answers_priced("0.0026").broken() == {"spent"}
    asked = _answers_priced("0.0027")
    asked.ask(at=4.0, phase="verify", iteration=2, args=None, tokens=140, output=40)
    asked.ask(at=5.0, iteration=3, args=None, tokens=140, output=40)
    assert asked.broken() == {"spent"}
    said = {str(v) for v in judge(asked.books, asked.records)}
    assert any("after $0.0036, its budget $0.0027" in line for line in said), said


def test_spent_judges_dollars_only_where_the_spec_states_the_model_s_prices() -> None:
    """A dollar budget without ``pricing`` is the product's to refuse (``cost_unknown``): the
    world has no price to judge it by. Tokens and dollars are judged each on its own: a token
    budget the answers pass breaks the promise whatever the dollars say."""
    assert _answers_priced("0.0001", priced=False).broken() == set()
    assert _answers_priced("1", tokens=419).broken() == {"spent"}
    assert _answers_priced("1", tokens=420).broken() == set()


def test_replanned_sees_a_step_asked_for_again_after_its_plan_was_acted_on() -> None:
    """step1 planned iteration 1 and sent its order; step2, started after, asks the model for
    iteration 1 again (a resume that forgot the saved plan)."""
    story = History().ordinary()
    story.process("step2", 5.0)
    story.ask("step2", at=5.0)
    assert story.broken() == {"replanned"}


def test_replanned_lets_a_held_up_process_retry_its_own_model_call() -> None:
    """A process that started before the plan was acted on may still be asking (its answer can
    no longer be saved)."""
    story = History()
    story.process("step0", 0.0)
    story.ask("step0", at=0.5)
    story.ask()
    story.effect(story.send(at=2.0))
    story.ask("step0", at=3.0)
    assert "replanned" not in story.broken()


def test_altered_sees_a_call_sent_otherwise_than_planned_or_a_plan_nobody_made() -> None:
    story = History()
    story.ask()
    story.effect(story.send(args={**ORDER, "qty": 9}))
    assert story.broken() == {"altered"}
    story = History().ordinary()
    story.records.planned.append(PlannedAction("1:1", "place_order", {"sku": "Z9", "ref": "x"}))
    assert story.broken() == {"altered"}


# The chart's admission policies, as operator-mode people meet them

ALICE = User("alice", ("shop-devs",))
BOB = User("bob", ("payments-approvers",))
ENTRY = {"by": "bob", "groups": ["payments-approvers"], "approved": True}
BASE = {"runName": "r", "action": "1:0", "tool": "pay", "idempotencyKey": "k"}


class Monitor:
    """A monitor's ticks as the world saw them, written by hand: tick N's process ``tickN``
    plans the order (``p1@tN``) and sends it; the records of each tick are its own."""

    def __init__(self) -> None:
        self.story = History()
        self.books = self.story.books
        self.records: dict[int, Records] = {}

    def tick(self, number: int, at: float, *, known: bool = True, taken: bool = True) -> int:
        name = f"tick{number}"
        self.story.process(name, at)
        self.books.processes[name].run = f"restock.tick-{number}"
        args = {**ORDER, "ref": tick_ref("p1", f"restock.tick-{number}")}
        self.story.ask(name, at + 0.5, args=args)
        self.books.asks[-1] = Ask(
            at + 0.5,
            name,
            "plan",
            1,
            self.books.asks[-1].intents,
            order=self.books.asks[-1].order,
            run=f"restock.tick-{number}",
        )
        sent = self.story.send(name, at + 1.0, key=f"kg-{number}", known=known, args=args)
        if taken:
            self.story.effect(sent, noted=False)
        records = Records(finished=True)
        records.planned.append(PlannedAction("1:0", "place_order", args))
        for kind, moment, data in (
            ("loop.plan_saved", at + 0.5, {"actions": [{"idempotencyKey": f"kg-{number}"}]}),
            ("loop.action_started", at + 0.9, {"action": "1:0", "idempotencyKey": f"kg-{number}"}),
            ("loop.action_completed", at + 1.2, {"action": "1:0", "status": "ok"}),
        ):
            stamp = self.books.stamp(moment)
            records.events.append(
                Event(
                    len(records.events) + 1,
                    kind,
                    "keelgate",
                    self.books.true_of_stamp(stamp),
                    stamp,
                    data,
                )
            )
        self.records[number] = records
        return sent

    def settle(self, number: int, at: float, *, accepted: bool = True) -> None:
        self.books.decisions.append(
            Decision(
                at,
                "settle",
                "alice",
                "alice",
                "1:0",
                tick_ref("p1", f"restock.tick-{number}"),
                True,
                accepted_at=at if accepted else None,
            )
        )

    def broken(self, *, over: bool = True) -> list[str]:
        return [
            f"{v.rule} {v.detail}"
            for v in judge_ticks(self.books, self.records, over=over, shown="restock.tick-2")
        ]


def test_a_tick_ref_names_its_call_and_its_tick() -> None:
    """The same call planned in tick 2 is the world's call ``p1@t2``: told apart from tick 1's,
    read back as the call ``p1`` of tick 2; a ref of no tick is tick 0."""
    assert tick_ref("p1", "restock.tick-2") == "p1@t2"
    assert tick_of("p1@t2") == ("p1", 2)
    assert tick_of("p1") == ("p1", 0)


def test_ticks_that_each_place_the_order_once_keep_every_promise() -> None:
    """A monitor restocking each tick places the same order once a tick: the world's books of
    each tick see it once, and the ticks together break nothing, however many there are."""
    monitor = Monitor()
    monitor.tick(1, 0.0)
    monitor.tick(2, 60.0)
    monitor.tick(3, 120.0)
    assert monitor.broken() == []


def test_again_sees_a_tick_placing_a_call_past_a_tick_whose_request_was_unknown() -> None:
    """Tick 1's order left and its sender never learned what it came to; nobody settled it;
    tick 2 then placed the same order: judged per tick, each tick is clean (one send each),
    and ``again`` names the tick that placed it again."""
    monitor = Monitor()
    monitor.tick(1, 0.0, known=False)
    monitor.books.questions.append(Question(1.5, "alice", "1:0", "p1@t1"))
    monitor.tick(2, 60.0)
    broken = monitor.broken()
    assert [b.split()[0] for b in broken] == ["again"], broken
    assert "p1@t2 (request) sent by tick2 at 61.0 while p1@t1" in broken[0]


def test_again_lets_the_next_tick_go_once_the_unknown_was_settled_or_refused() -> None:
    """Settled (a person's settlement that stood, before the next tick sent), or answered with
    a definite refusal, the earlier tick's request no longer stops the next tick; a settlement
    that never stood, or came after, does not count."""
    settled = Monitor()
    settled.tick(1, 0.0, known=False)
    settled.books.questions.append(Question(1.5, "alice", "1:0", "p1@t1"))
    settled.settle(1, 30.0)
    settled.tick(2, 60.0)
    assert settled.broken() == []
    late = Monitor()
    late.tick(1, 0.0, known=False)
    late.books.questions.append(Question(1.5, "alice", "1:0", "p1@t1"))
    late.settle(1, 30.0, accepted=False)
    late.tick(2, 60.0)
    late.settle(1, 90.0)
    assert [b.split()[0] for b in late.broken()] == ["again"]


def test_each_tick_is_judged_on_its_own_books_and_the_monitor_for_waiting() -> None:
    """A tick whose order the shop took twice breaks ``twice`` in that tick (named), not the
    others; a monitor whose last tick is not over is ``waiting``."""
    monitor = Monitor()
    monitor.tick(1, 0.0)
    sent = monitor.tick(2, 60.0)
    monitor.story.effect(sent, at=62.0, noted=False)
    broken = monitor.broken(over=False)
    assert sorted(b.split()[0] for b in broken) == ["twice", "waiting"], broken
    assert any(b.startswith("twice tick 2: p1@t2") for b in broken), broken


def test_admission_lets_through_what_the_chart_lets_through() -> None:
    """A person's own entry with their own groups, added at the end; a deny after someone
    else's approval; the one-decision form by its own author; a ServiceAccount where the rule
    lets ServiceAccounts decide."""
    assert admitted("Approval", BASE, {**BASE, "decisions": [ENTRY]}, BOB) == ""
    deny = {"by": "alice", "groups": [], "approved": False}
    one = {**BASE, "decisions": [ENTRY]}
    assert admitted("Approval", one, {**BASE, "decisions": [ENTRY, deny]}, ALICE) == ""
    assert admitted("Approval", BASE, {**BASE, "approved": True, "by": "bob"}, BOB) == ""
    robot = User("system:serviceaccount:shop:robot")
    entry = {"by": robot.name, "approved": True}
    lets = {"serviceAccounts": True}
    assert admitted("Approval", BASE, {**BASE, "decisions": [entry]}, robot, status=lets) == ""


def test_admission_refuses_what_the_chart_refuses() -> None:
    """An entry in someone else's name or with a group one is not in; an entry removed; a
    byte-equal copy of someone's entry; an old entry moved to another place; two entries in one
    request; an identity of one's own; a decision on a Settled Approval, by a ServiceAccount
    the rule does not count, or an approval while one's own counts; the one-decision form in
    another's name, or changed once set; a Reconciliation decided in another's name, or
    changed once set."""
    assert admitted("Approval", BASE, {**BASE, "decisions": [ENTRY]}, ALICE)
    wrong_group = {"by": "bob", "groups": ["shop-devs"], "approved": True}
    assert admitted("Approval", BASE, {**BASE, "decisions": [wrong_group]}, BOB)
    one = {**BASE, "decisions": [ENTRY]}
    assert admitted("Approval", one, {**BASE, "decisions": []}, BOB)
    assert admitted("Approval", one, {**BASE, "decisions": [ENTRY, dict(ENTRY)]}, ALICE)
    deny = {"by": "bob", "groups": [], "approved": False}
    old = {**BASE, "decisions": [ENTRY, deny]}
    assert admitted("Approval", old, {**BASE, "decisions": [deny, ENTRY]}, ALICE)
    mine = {"by": "alice", "approved": True}
    assert admitted("Approval", BASE, {**BASE, "decisions": [mine, dict(mine)]}, ALICE)
    assert admitted("Approval", BASE, {**BASE, "decisions": [{**mine, "id": "7"}]}, ALICE)
    settled = {"phase": "Settled"}
    assert admitted("Approval", BASE, {**BASE, "decisions": [mine]}, ALICE, status=settled)
    robot = User("system:serviceaccount:shop:robot")
    assert admitted("Approval", BASE, {**BASE, "decisions": [{"by": robot.name}]}, robot)
    counts = {"approvedBy": ["bob"]}
    assert admitted("Approval", one, {**BASE, "decisions": [ENTRY, ENTRY]}, BOB, status=counts)
    assert admitted("Approval", BASE, {**BASE, "approved": True, "by": "bob"}, ALICE)
    decided = {**BASE, "approved": True, "by": "bob"}
    assert admitted("Approval", decided, {**BASE, "approved": False, "by": "bob"}, BOB)
    settle = {"runName": "r", "action": "1:0", "tool": "pay", "idempotencyKey": "k"}
    assert admitted("Reconciliation", settle, {**settle, "executed": True, "by": "bob"}, ALICE)
    done = {**settle, "executed": True, "by": "bob"}
    assert admitted("Reconciliation", done, {**settle, "executed": False, "by": "bob"}, BOB)
    assert admitted("Reconciliation", settle, done, BOB) == ""


def test_admission_refuses_the_rest_of_what_the_chart_refuses() -> None:
    """A field the operator set changed; the one-decision form with no name, or taken back; an
    identity given by hand; more entries than the CRD holds; a second deny by one person; a
    ninth decision by one person. Each refusal names what it refuses."""
    assert "cannot change" in admitted("Approval", BASE, {**BASE, "tool": "refund"}, BOB)
    assert "spec.by" in admitted("Approval", BASE, {**BASE, "approved": True, "by": " "}, BOB)
    decided = {**BASE, "approved": True, "by": "bob"}
    assert "spec.approved" in admitted("Approval", decided, dict(BASE), BOB)
    assert "decisionId" in admitted("Approval", BASE, {**BASE, "decisionId": "7"}, BOB)
    full = [{"by": f"p{i}", "approved": True, "id": str(i)} for i in range(MAX_DECISIONS)]
    more = {**BASE, "decisions": [*full, {"by": "bob", "approved": True}]}
    assert "at most" in admitted("Approval", {**BASE, "decisions": full}, more, BOB)
    denied = [{"by": "bob", "approved": False, "id": "1"}]
    again = {**BASE, "decisions": [*denied, {"by": "bob", "approved": False}]}
    assert "denied it already" in admitted("Approval", {**BASE, "decisions": denied}, again, BOB)
    eight = [{"by": "bob", "approved": True, "id": str(i)} for i in range(8)]
    ninth = {**BASE, "decisions": [*eight, {"by": "bob", "approved": True}]}
    assert "8 approvals" in admitted("Approval", {**BASE, "decisions": eight}, ninth, BOB)


def test_admission_keeps_an_approval_being_deleted_as_it_is_and_its_finalizer_the_operators() -> (
    None
):
    """As the chart's approval-finalizer policy: nothing is added to or changed on an Approval
    being deleted (bob's entry, allowed on a live one, is refused); alice may not remove its
    finalizer keelgate.dev/decisions, a cluster admin (system:masters) may; keeping it, or
    another finalizer's removal, is nobody's concern."""
    grown = {**BASE, "decisions": [ENTRY]}
    assert "being deleted" in admitted("Approval", BASE, grown, BOB, deleting=True)
    assert admitted("Approval", BASE, grown, BOB, deleting=False) == ""
    assert admitted("Approval", grown, dict(grown), BOB, deleting=True) == ""
    held = [DECISIONS_FINALIZER, "example.com/other"]
    assert "holds the approval" in finalizer_refusal(held, ["example.com/other"], ALICE)
    assert finalizer_refusal(held, [], User("root", ("system:masters",))) == ""
    assert finalizer_refusal(held, [DECISIONS_FINALIZER], ALICE) == ""


def test_admission_gives_each_added_decision_its_identity_and_the_definition_shown() -> None:
    """As the chart's mutating policy: the entry added gets the resourceVersion it was added to
    as its id and, unless it states one, the definition the Approval showed; the entries there
    before are left as they were; the one-decision form gets its decisionId."""
    one = {**BASE, "decisions": [{**ENTRY, "id": "3"}]}
    mine = {"by": "alice", "approved": False}
    after = mutated(
        "Approval", one, {**BASE, "decisions": [*one["decisions"], mine]}, version="9", shown="d1"
    )
    assert after["decisions"] == [{**ENTRY, "id": "3"}, {**mine, "id": "9", "definition": "d1"}]
    stated = {**mine, "definition": "d0"}
    after = mutated("Approval", BASE, {**BASE, "decisions": [stated]}, version="4", shown="d1")
    assert after["decisions"] == [{**stated, "id": "4"}]
    after = mutated(
        "Approval", BASE, {**BASE, "approved": True, "by": "bob"}, version="5", shown=""
    )
    assert after["decisionId"] == "5"


def _rejected_twice(budget: Mapping[str, Any] | None) -> History:
    """step1 plans iteration 1 and the verifier rejects it, then iteration 2, rejected too,
    under a spec whose budget is ``budget`` (None: no budget named)."""
    story = History()
    story.books.specs[0] = SpecVersion(
        1, 0.0, {**manifest(), **({} if budget is None else {"budget": dict(budget)})}
    )
    for iteration in (1, 2):
        story.ask(at=iteration, iteration=iteration, args=None)
        story.ask(
            at=iteration + 0.5, iteration=iteration, phase="verify", args=None, verdict="reject"
        )
    return story


def test_rejected_sees_a_run_plan_on_after_the_rejection_that_reached_its_limit() -> None:
    """A limit of two rejections: the second stops the run for good, so the model asked for
    iteration 3's plan breaks the promise (a loop that stops only once the limit is passed);
    under a limit of three, or with the model not asked again, nothing is broken."""
    stopped = _rejected_twice({"maxVerifierRejections": 2})
    assert stopped.broken() == set()
    stopped.ask(at=3.0, iteration=3, args=None)
    assert stopped.broken() == {"rejected"}
    going_on = _rejected_twice({"maxVerifierRejections": 3})
    going_on.ask(at=3.0, iteration=3, args=None)
    assert going_on.broken() == set()


def test_rejected_reads_no_limit_named_as_three_and_a_null_as_none() -> None:
    """A spec naming no limit has the contract's default of three (two rejections leave the
    run going, a third stops it); ``maxVerifierRejections: null`` is no limit at all."""
    default = _rejected_twice(None)
    default.ask(at=3.0, iteration=3, args=None)
    assert default.broken() == set()
    default.ask(at=3.5, iteration=3, phase="verify", args=None, verdict="reject")
    default.ask(at=4.0, iteration=4, args=None)
    assert default.broken() == {"rejected"}
    unlimited = _rejected_twice({"maxVerifierRejections": None})
    unlimited.ask(at=3.0, iteration=3, args=None)
    assert unlimited.broken() == set()


def test_rejected_lets_a_raised_limit_resume_and_meets_a_lowered_one_at_the_next_rejection() -> (
    None
):
    """Stopped at a limit of two, the run goes on for a step given a spec raising it to three
    (and not for one still on the old spec). A limit lowered to one after a rejection recorded
    under three stops nothing at once (the run met no rejection under it): the run plans on,
    and it is the next rejection that stops it."""
    raised = _rejected_twice({"maxVerifierRejections": 2})
    raised.spec(2, 2.8, {**manifest(), "budget": {"maxVerifierRejections": 3}})
    raised.process("step2", 2.9, generation=2)
    raised.ask("step2", at=3.0, iteration=3, args=None)
    assert raised.broken() == set()
    raised.process("step3", 3.1, generation=1)
    raised.ask("step3", at=3.2, iteration=3, args=None)
    assert raised.broken() == {"rejected"}
    lowered = _rejected_twice({"maxVerifierRejections": 3})
    lowered.spec(2, 2.8, {**manifest(), "budget": {"maxVerifierRejections": 1}})
    lowered.process("step2", 2.9, generation=2)
    lowered.ask("step2", at=3.0, iteration=3, args=None)
    assert lowered.broken() == set()
    lowered.ask("step2", at=3.5, iteration=3, phase="verify", args=None, verdict="reject")
    lowered.ask("step2", at=4.0, iteration=4, args=None)
    assert lowered.broken() == {"rejected"}


def test_rejected_counts_an_iteration_only_where_every_verdict_given_was_a_rejection() -> None:
    """Iteration 2 was judged twice (its first verdict's asker died before saving it), once
    accepted: the run may have recorded the acceptance, so only one rejection is sure and a
    limit of two does not stop it."""
    story = _rejected_twice({"maxVerifierRejections": 2})
    story.process("step0", 0.0)
    story.ask("step0", at=2.7, iteration=2, phase="verify", args=None)
    story.ask(at=3.0, iteration=3, args=None)
    assert story.broken() == set()


def test_a_person_is_shown_the_tool_as_the_step_that_stopped_the_run_to_ask_defined_it() -> None:
    """step1 (the POST) stopped the run for an approval (exit 3); the owner then made the tool
    a DELETE, and step2, started under it, lost its store and ended (exit 5) having recorded
    nothing. ``keelgate pending`` still shows step1's stop: the person approves the POST, and
    the oracle judges the approval so (it took step2's DELETE before: seed
    15482323029717145780, monitor, an approval of the POST read as none)."""
    story = History()
    story.spec(2, 1.0, manifest(http={"method": "DELETE", "url": "http://shop.sim/orders"}))
    story.books.processes["step1"].ended, story.books.processes["step1"].code = 0.5, 3
    story.process("step2", 1.5, generation=2)
    story.books.processes["step2"].ended, story.books.processes["step2"].code = 1.6, 5
    assert story.books.shown("place_order", 2.0, None) == ORDERS
    story.books.processes["step2"].code = 3  # had step2 stopped the run, it would show its own
    assert story.books.shown("place_order", 2.0, None) == "DELETE http://shop.sim/orders"
