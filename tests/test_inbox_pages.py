"""The decision inbox's pages and reads without a browser: what a person may see and press.

The browser tests (e2e/tests/test_e2e_inbox.py) click through them on the control plane; these
check the rules each page must keep whatever the data: secrets redacted, every value escaped,
no button for a decision the user may not make, "not executed" offered only once it may be.
"""

from __future__ import annotations

import datetime as dt
import re

from keelgate.cli.plugin.ui import pages
from keelgate.cli.plugin.ui.views import REDACTED, Waiting, _plan_args, redact_args


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


def test_arguments_are_shown_with_every_secret_looking_part_redacted() -> None:
    """Keys named like secrets, API-key or bearer shaped strings and URL passwords are
    replaced, at any depth; everything else is shown as recorded."""
    shown = redact_args(
        {
            "sku": "A1",
            "api_key": "abc",
            "headers": {"Authorization": "x", "X-Trace": "t-1"},
            "note": "use sk-live_0123456789abcdef please",
            "callback": "https://bob:hunter2@example.com/hook",
            "items": [{"password": "p"}, 3],
        }
    )
    assert shown["sku"] == "A1" and shown["api_key"] == REDACTED
    assert shown["headers"] == {"Authorization": REDACTED, "X-Trace": "t-1"}
    assert "sk-live" not in shown["note"] and REDACTED in shown["note"]
    assert "hunter2" not in shown["callback"]
    assert shown["items"] == [{"password": REDACTED}, 3]


def test_the_current_plans_arguments_are_found_by_action_id_and_redacted() -> None:
    """The write-ahead plan in a checkpoint gives each action's arguments, redacted."""
    state = {
        "plan": {
            "iteration": 2,
            "actions": [
                {"id": "2:0", "tool": "pay", "args": {"amount": 5, "token": "t"}, "key": "k"},
                {"id": "2:1", "tool": "look", "args": {}, "key": "k2"},
            ],
        }
    }
    assert _plan_args(state) == {"2:0": {"amount": 5, "token": REDACTED}, "2:1": {}}
    assert _plan_args({}) == {}


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
    html = pages.layout(title="Inbox", user="alice", current="/", main="", csrf="c")
    assert re.findall(r'(?:src|href)="([^"]+)"', html) == [
        "/static/ui.css",
        "/static/ui.js",
        "#content",
        "/",
        "/runs",
    ]
