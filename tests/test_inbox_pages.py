"""The decision inbox's pages and reads without a browser: what a person may see and press.

The browser tests (e2e/tests/test_e2e_inbox.py) click through them on the control plane; these
check the rules each page must keep whatever the data: secrets redacted, every value escaped,
no button for a decision the user may not make, "not executed" offered only once it may be.
"""

from __future__ import annotations

import datetime as dt
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from keelgate.adapters.models.scripted import ScriptedModel
from keelgate.adapters.tools.python import PythonTool
from keelgate.cli import main
from keelgate.cli.plugin.target import Target
from keelgate.cli.plugin.ui import pages
from keelgate.cli.plugin.ui import views as views_module
from keelgate.cli.plugin.ui.views import Recorded, RunPage, Views, Waiting, _plan_args
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.redaction import REDACTED
from keelgate.core.spec import LoopSpec
from keelgate.core.types import ApprovalRule, SideEffect
from keelgate.stores.sqlite import SQLiteStore
from test_kubectl_plugin import FakeCluster, bob_approved_alices_payout, kubeconfig

ROOT = Path(__file__).resolve().parents[1]


def _waiting(**changes: object) -> Waiting:
    fields: dict[str, object] = {
        "kind": "Reconciliation",
        "namespace": "shop",
        "name": "restock-1-place-order",
        "run": "restock",
        "action": "1:0",
        "tool": "place_order",
        "side_effect": "WRITE",
        "key": "kg-abc",
        "created": "2026-12-05T08:00:00Z",
        "waited": "3m",
        "not_executed_after": "",
        "said": "",
        "args": {"sku": "A1", "qty": 2},
        "args_unavailable": "",
        "may": True,
        "why_not": "",
    }
    fields.update(changes)
    return Waiting(**fields)  # type: ignore[arg-type]


def test_the_current_plans_arguments_are_found_by_action_id_and_redacted() -> None:
    """The write-ahead plan in a checkpoint gives each action's arguments, redacted, and the
    Idempotency-Key of each call (what a decision on them is bound to)."""
    state = {
        "plan": {
            "iteration": 2,
            "actions": [
                {"id": "2:0", "tool": "pay", "args": {"amount": 5, "token": "t"}, "key": "k"},
                {"id": "2:1", "tool": "look", "args": {}, "key": "k2"},
            ],
        }
    }
    assert _plan_args(state) == (
        {"2:0": {"amount": 5, "token": REDACTED}, "2:1": {}},
        {"2:0": "k", "2:1": "k2"},
    )
    assert _plan_args({}) == ({}, {})


def test_every_value_is_escaped() -> None:
    """A tool name or argument holding markup is shown as text, never run as a script."""
    html = pages.inbox(
        [_waiting(tool="<script>alert(1)</script>", args={"q": "<img src=x onerror=alert(1)>"})],
        csrf="c",
        scope="namespace shop",
    )
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;script&gt;" in html


def test_a_decision_the_user_may_not_make_shows_why_and_no_control() -> None:
    """No form and no button, but the word forbidden and the reason, for a user without patch."""
    html = pages.inbox(
        [_waiting(may=False, why_not="RBAC: no patch on reconciliations in shop")],
        csrf="c",
        scope="namespace shop",
    )
    assert "<form" not in html and "<button" not in html
    assert "You may not decide this" in html and "forbidden: RBAC: no patch" in html


def test_not_executed_is_offered_only_from_the_write_deadline_on() -> None:
    """Before the deadline the button is disabled, says when, and carries the moment for the
    page to enable it; after it, both buttons work; an approval has approve and deny."""
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    early = pages.inbox([_waiting(not_executed_after=soon)], csrf="c", scope="s")
    button = re.search(r'<button[^>]*value="not-executed"[^>]*>', early)
    assert button and "disabled" in button.group(0) and soon in button.group(0)
    assert f"until {soon}" in early
    past = "2026-01-01T00:00:00Z"
    later = pages.inbox([_waiting(not_executed_after=past)], csrf="c", scope="s")
    button = re.search(r'<button[^>]*value="not-executed"[^>]*>', later)
    assert button and "disabled" not in button.group(0)
    approval = pages.inbox([_waiting(kind="Approval")], csrf="c", scope="s")
    assert 'value="approve"' in approval and 'value="deny"' in approval
    assert 'value="executed"' not in approval


def test_each_form_carries_the_csrf_token_and_a_labelled_note() -> None:
    """The form posts the page's CSRF token; the note field has a label pointing at it."""
    html = pages.inbox([_waiting()], csrf="tok-123", scope="s")
    assert '<input type="hidden" name="csrf" value="tok-123">' in html
    field_id = re.search(r'<input type="text" id="([^"]+)" name="note"', html)
    assert field_id and f'<label for="{field_id.group(1)}">' in html


def test_the_page_loads_nothing_from_outside() -> None:
    """The layout names its stylesheet and script on its own origin, and nothing else."""
    html = pages.layout(title="Inbox", user="alice", current="/", main="")
    assert re.findall(r'(?:src|href)="([^"]+)"', html) == [
        "/static/ui.css",
        "/static/ui.js",
        "#content",
        "/",
        "/runs",
    ]


def test_a_runs_trail_is_walked_again_only_for_a_new_checkpoint_or_when_it_is_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run page's trail, read from a real SQLite store: verified; shown again from the
    last check while the run has no new checkpoint (a live page refreshes at every watch event);
    and a row changed behind the store's back shows as a broken chain once the check is
    TRAIL_TTL old."""
    for name in ("agentrun.yaml", "shop.py"):
        shutil.copy(ROOT / "examples" / "restock" / name, tmp_path / name)
    url = f"sqlite:///{tmp_path / 'kg.db'}"
    monkeypatch.chdir(tmp_path)
    assert main(["run", "-f", "agentrun.yaml", "--store", url]) == 0
    config = kubeconfig(tmp_path / "kubeconfig", server="https://127.0.0.1:9", me="shop")
    views = Views(Target(str(config), "me", "shop"), store=url)

    first = views.recorded("shop", "restock", trail=True)
    assert first.verified is True and len(first.events) > 5 and not first.problems
    assert views.recorded("shop", "restock", trail=True) is first
    with sqlite3.connect(tmp_path / "kg.db") as db:
        db.execute("UPDATE keelgate_audit SET actor = 'mallory' WHERE seq = 3")
    assert views.recorded("shop", "restock", trail=True) is first  # within TRAIL_TTL
    monkeypatch.setattr(views_module, "TRAIL_TTL", 0.0)
    again = views.recorded("shop", "restock", trail=True)
    assert again.verified is False and again.problems


def test_an_approval_shows_its_count_its_rule_and_when_its_first_approval_expires() -> None:
    """An approval needing two shows what it needs, "1 of 2" with who, when the first approval
    stops counting, and the Idempotency-Key of the call its arguments belong to."""
    html = pages.inbox(
        [
            _waiting(
                kind="Approval",
                key="kg-77",
                progress="1 of 2",
                approved_by=("bob",),
                expires_at="2030-03-17T17:47:40Z",
                asks="2 approvals from payments, not the run's creator",
            )
        ],
        csrf="c",
        scope="s",
    )
    for shown in (
        "<dt>Needs</dt><dd>2 approvals from payments, not the run&#x27;s creator</dd>",
        "<dt>Approvals so far</dt><dd>1 of 2 (bob)</dd>",
        "at 2030-03-17T17:47:40Z (it is asked for again unless the call has run)",
        "<code>kg-77</code>",
    ):
        assert shown in html, shown


def test_approvals_you_may_decide_can_be_ticked_for_one_batch_each_with_its_call() -> None:
    """A batch form (its own CSRF token, a labelled note, approve and deny) appears when an
    approval may be decided; each such approval has a labelled checkbox tied to it, carrying
    the approval and the key of the call it shows; an unknown outcome, or an approval you may
    not decide, has none; with none to tick there is no batch form."""
    items = [
        _waiting(kind="Approval", name="a-1-pay", run="a", key="kg-a"),
        _waiting(kind="Approval", name="b-1-pay", run="b", key="kg-b", may=False, why_not="x"),
        _waiting(kind="Reconciliation", name="c-1-pay", run="c", key="kg-c"),
    ]
    html = pages.inbox(items, csrf="tok", scope="s")
    batch = re.search(r'<form method="post" action="/decide-many" id="batch".*?</form>', html)
    assert batch, html
    assert '<input type="hidden" name="csrf" value="tok">' in batch.group(0)
    assert 'value="approve"' in batch.group(0) and 'value="deny"' in batch.group(0)
    assert '<label for="batch-note">' in batch.group(0)
    boxes = re.findall(
        r'<input type="checkbox" form="batch" name="pick" id="([^"]+)" value="([^"]+)">', html
    )
    assert boxes == [("approval-shop-a-1-pay-pick", "shop|a|1:0|kg-a")]
    assert '<label for="approval-shop-a-1-pay-pick">' in html
    alone = pages.inbox(items[1:], csrf="tok", scope="s")
    assert "decide-many" not in alone and 'type="checkbox"' not in alone


class ClusterViews(Views):
    """The inbox's reads over the plugin tests' fake API server, as its ``user``; no store."""

    def __init__(self, config: Path, cluster: FakeCluster) -> None:
        super().__init__(Target(str(config), "me", "shop"))
        self.cluster = cluster
        self._home = cluster  # type: ignore[assignment]

    def client(self, namespace: str) -> FakeCluster:  # type: ignore[override]
        return self.cluster

    def recorded(self, namespace: str, run: str, *, trail: bool) -> Recorded:
        return Recorded(unavailable="no store in this test")


def _alices_payout(tmp_path: Path) -> tuple[FakeCluster, Path]:
    """alice's run whose payment needs 2 of payments, not her, a reason to deny; bob approved
    it (1 of 2); and an unknown outcome of another run."""
    config = kubeconfig(tmp_path / "kubeconfig", server="https://127.0.0.1:9", me="shop")
    cluster = FakeCluster(target=Target(str(config), "me", "shop"))
    bob_approved_alices_payout(cluster)
    return cluster, config


def _inbox_as(cluster: FakeCluster, config: Path, user: str, *groups: str) -> list[Waiting]:
    cluster.user, cluster.groups = user, groups
    return ClusterViews(config, cluster).inbox()


def test_the_inbox_shows_what_waits_for_you_apart_from_what_you_cannot_decide(
    tmp_path: Path,
) -> None:
    """Read from the cluster as each person, by the run's rule in force (the one judge):
    carol may decide both; alice created the run, so its approval is shown apart with why
    and a Deny alone (a note needed: the rule asks a reason); dave, in no group the rule
    names, sees why and no control; bob approved already. The unknown outcome waits for each
    of them; the batch form offers only what is theirs. The count says both."""
    cluster, config = _alices_payout(tmp_path)
    carols = _inbox_as(cluster, config, "carol", "payments")
    assert [(i.kind, i.yours, i.not_yours) for i in carols] == [
        ("Approval", True, ""),
        ("Reconciliation", True, ""),
    ]
    html = pages.inbox(carols, csrf="c", scope="s")
    assert "(2 waiting for you)" in html and "Waiting for others" not in html
    assert 'name="pick" id="approval-shop-payout-1-send-payment-pick"' in html

    alices = _inbox_as(cluster, config, "alice", "payments")
    approval = alices[0]
    assert (approval.yours, approval.may_deny, approval.reason_to_deny) == (False, True, True)
    assert approval.not_yours == (
        "alice created the run, and its rule asks for someone else (2 approvals from payments, "
        "not the run's creator, a deny with its reason); you may deny it"
    )
    html = pages.inbox(alices, csrf="c", scope="s")
    assert "(1 waiting for you, 1 for others)" in html
    mine, _, apart = html.partition('<section class="others"')
    assert "reconcile" not in apart and 'value="executed"' in mine and "send_payment" not in mine
    assert "Waiting for others (1): you cannot decide these" in apart
    assert "<strong>You cannot approve this:</strong> alice created the run" in apart
    assert 'value="deny"' in apart and 'value="approve"' not in apart
    assert "a deny needs one, the rule asks why" in apart
    assert "decide-many" not in html and 'type="checkbox"' not in html

    (daves, _) = _inbox_as(cluster, config, "dave", "system:authenticated")
    assert (daves.yours, daves.may_deny) == (False, False)
    html = pages.inbox([daves], csrf="c", scope="s")
    assert "(0 waiting for you, 1 for others)" in html
    assert "Nothing waits for you to decide." in html
    assert "<strong>Not yours to decide:</strong> dave may not decide it: the rule asks" in html
    assert "<form" not in html and "<button" not in html

    (bobs, _) = _inbox_as(cluster, config, "bob", "payments")
    assert bobs.not_yours == "you approved it already (1 of 2): it waits for others"
    assert bobs.may_deny


def test_a_user_rbac_forbids_sees_everything_apart_with_rbacs_word(tmp_path: Path) -> None:
    """Someone who may read but not patch (the view role) has nothing waiting for them: each
    item is shown apart, forbidden, with the reason, and no control."""
    cluster, config = _alices_payout(tmp_path)
    cluster.allowed = False
    items = _inbox_as(cluster, config, "erin", "payments")
    assert [i.yours for i in items] == [False, False]
    html = pages.inbox(items, csrf="c", scope="s")
    assert "(0 waiting for you, 2 for others)" in html
    assert html.count("You may not decide this") == 2 and "<form" not in html
    assert html.count("(forbidden: no RBAC policy matched)") == 2  # RBAC's word, for each


def test_an_approval_shows_what_people_said_deciding_it_as_the_run_records_it() -> None:
    """bob's note on his approval (1 of 2) is on the run's record: carol's inbox shows it
    beside the count, redacted and escaped; a decision without a note adds nothing."""
    state = {
        "approvals": {
            "2:0": [
                {"approved": True, "by": "bob", "at": "t", "note": "sku <b>checked</b>"},
                {"approved": True, "by": "erin", "at": "t"},
                {"approved": False, "by": "dave", "at": "t", "note": "Bearer Zm9vYmFyYmF6cXV4MTIz"},
            ],
            "1:0": {"approved": True, "by": "al", "at": "t", "note": "old form"},
        }
    }
    notes = views_module._notes(state)
    assert notes["1:0"] == ("al approved: old form",)
    (bob, dave) = notes["2:0"]
    assert bob == "bob approved: sku <b>checked</b>"
    assert dave == "dave denied: Bearer [redacted]"
    html = pages.inbox([_waiting(kind="Approval", notes=notes["2:0"])], csrf="c", scope="s")
    assert "<dt>What they said</dt>" in html and "sku &lt;b&gt;checked&lt;/b&gt;" in html


def test_the_run_page_says_approved_by_bob_only_with_the_count_it_has(tmp_path: Path) -> None:
    """A run whose WRITE needs 2 of payments: bob's approval is recorded. Its page tells it as
    "approved by bob (1 of 2)" in the iteration (never a bare "approved by bob"), and the
    Approval's row shows Pending with 1 of 2 and no verdict; once carol approves too, the
    Settled row shows approved (2 of 2) by both (issue 46: the run page said "approved by bob"
    at 1 of 2)."""

    def place(args: object, *, idempotency_key: str | None) -> dict[str, bool]:
        return {"placed": True}

    rule = ApprovalRule(required=2, groups=("payments",))
    tool = PythonTool("place_order", place, SideEffect.WRITE, approval=rule)
    script = [{"actions": [{"tool": "place_order", "args": {"sku": "A1"}}]}, {"done": True}]
    stores = Stores.of(SQLiteStore(tmp_path / "kg.db"))
    loop = Loop(stores=stores, model=ScriptedModel(script), tools=[tool])
    spec = LoopSpec("shop", "restock", "Restock A1")
    try:
        loop.run_or_resume(spec)
        loop.approve("shop", "restock", "1:0", approved=True, by="bob", groups=("payments",))
        first = tuple(e.to_json() for e in loop.audit("shop", "restock"))
        loop.approve("shop", "restock", "1:0", approved=True, by="carol", groups=("payments",))
        both = tuple(e.to_json() for e in loop.audit("shop", "restock"))
    finally:
        stores.close()
    run = {"metadata": {"namespace": "shop", "name": "restock"}, "status": {"phase": "Stopped"}}

    def page(events: tuple[dict[str, object], ...], status: dict[str, object]) -> str:
        approval = {
            "kind": "Approval",
            "spec": {"action": "1:0", "tool": "place_order", "decisions": []},
            "status": status,
        }
        recorded = Recorded(events=events, verified=True)
        return pages.run_page(RunPage(run, (), (), (approval,), recorded))

    waiting = page(first, {"phase": "Pending", "verdict": "", "progress": "1 of 2"})
    assert "1:0 place_order: <strong>approved</strong> by bob (1 of 2)" in waiting
    assert "by bob</" not in waiting and "by bob<" not in waiting
    row = re.search(r"<table class=decisions>.*?</table>", waiting)
    assert row is not None
    cells = re.findall(r"<td>(.*?)</td>", row.group(0))
    assert cells == ["Approval", "1:0", "place_order", "Pending", " (1 of 2)", ""]

    settled = {
        "phase": "Settled",
        "verdict": "approved",
        "progress": "2 of 2",
        "settledBy": "bob, carol",
    }
    done = page(both, settled)
    assert "by carol (2 of 2)" in done and "by bob (1 of 2)" in done
    row = re.search(r"<table class=decisions>.*?</table>", done)
    assert row is not None
    cells = re.findall(r"<td>(.*?)</td>", row.group(0))
    assert cells[3:] == ["Settled", "approved (2 of 2)", "bob, carol"]


def test_an_approval_whose_deny_the_operator_refused_stays_waiting_in_the_inbox(
    tmp_path: Path,
) -> None:
    """dave, in no group the rule names (a typo in it), denied by hand and the operator refused
    it: the Approval stays Pending with the refusal in its message. carol's inbox still counts
    it as waiting for her, with the refusal shown, and dave sees it apart with why (issue 46:
    the inbox said "0 waiting" while the run still waited)."""
    cluster, config = _alices_payout(tmp_path)
    (approval,) = cluster.objects["Approval"]
    approval["spec"]["decisions"] = [{"by": "dave", "approved": False}]
    said = "0 of 2 approvals: waiting for 2 more; not counted: dave: dave may not decide it"
    approval["status"].update(decided=0, progress="0 of 2", approvedBy=[], message=said)
    carols = _inbox_as(cluster, config, "carol", "payments")
    assert [(i.kind, i.yours) for i in carols] == [("Approval", True), ("Reconciliation", True)]
    html = pages.inbox(carols, csrf="c", scope="s")
    assert "(2 waiting for you)" in html and "not counted: dave" in html
    (daves, _) = _inbox_as(cluster, config, "dave", "system:authenticated")
    assert not daves.yours and daves.not_yours.startswith("dave may not decide it")
