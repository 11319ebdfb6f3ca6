"""The decision inbox's HTML: the inbox, the runs, one run; rendered on the server.

Why it exists: the pages must work without any script (a form posts, the server answers with a
page), load nothing from outside (one stylesheet and one script, both served by the inbox), and
be readable without colour (every state is a word; colour only repeats it). The script only
swaps in a fresh ``<main>`` when the server says something changed, or fills a page's shell.

Every link and form is under ``root``: "" for a page the script reads with its key in a header,
``/k/KEY`` for a page read with the key in its address (no JavaScript), so that following a
link keeps the way the page was read (``sessions.py``). ``shell`` is what a request with the
cookie alone gets: no data and no form token, only what lets the script fill it.

It must never render a value without escaping it, and never render a control that would fail:
a decision the user may not make shows why instead of a button.

Why one module past 500 lines: every page is built of the same few parts (a run's row, a
decision's form, the shell), read together so that a form and the page that shows it never
disagree; what the pages show is ``views.py``'s.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import urlencode

from keelgate.cli.plugin.ui.views import RunPage, RunRow, Waiting, moment_passed
from keelgate.kube.naming import ATTEMPT_LABEL, STEP_LABEL

PHASES = ("Pending", "Running", "Stopped", "Succeeded", "Failed")


def e(value: object) -> str:
    return escape(str(value), quote=True)


def layout(
    *,
    title: str,
    user: str,
    current: str,
    main: str,
    root: str = "",
    live: bool = True,
    shell: bool = False,
) -> str:
    nav = "".join(
        f'<a href="{e(root)}{href}"{" aria-current=page" if href == current else ""}>{e(label)}</a>'
        for href, label in (("/", "Inbox"), ("/runs", "Runs"))
    )
    who = f"Signed in to the cluster as <strong>{e(user)}</strong>" if user else ""
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)} · Keelgate</title>"
        '<link rel="stylesheet" href="/static/ui.css">'
        '<script src="/static/ui.js" defer></script></head>'
        f'<body data-live="{"on" if live else "off"}"{" data-shell=1" if shell else ""}>'
        '<a class="skip" href="#content">Skip to content</a>'
        f'<header><span class="brand">Keelgate</span><nav aria-label="Pages">{nav}</nav>'
        f'<span class="who" id="who">{who}</span>'
        '<span class="live" id="live" role="status" aria-live="polite">Live: connecting</span>'
        "</header>"
        f'<main id="content" tabindex="-1">{main}</main></body></html>'
    )


def shell() -> str:
    """The page a request with the cookie alone gets: the script fills it with the page's key
    from this browser; a tab without it (or without JavaScript) reads how to sign in."""
    return layout(
        title="Inbox",
        user="",
        current="",
        shell=True,
        main=(
            '<p class="note" id="shell-note">Loading the inbox… If this stays, this browser is '
            "not signed in to it: open the newest sign-in address <code>kubectl keelgate "
            "ui</code> printed in its terminal (each address works once).</p>"
        ),
    )


def flash(said: str, error: str) -> str:
    shown = ""
    if said:
        shown += f'<p class="flash ok" role="status"><strong>Done:</strong> {e(said)}</p>'
    if error:
        shown += f'<p class="flash error" role="alert"><strong>Not done:</strong> {e(error)}</p>'
    return shown


def inbox(
    items: Sequence[Waiting],
    *,
    csrf: str,
    scope: str,
    said: str = "",
    error: str = "",
    root: str = "",
) -> str:
    """What waits for the user, then, apart, what waits for others: each of those says in one
    line why it is not the user's to decide (RBAC, or the run's rule in force)."""
    yours = [i for i in items if i.yours]
    others = [i for i in items if not i.yours]
    count = f"{len(yours)} waiting for you"
    if others:
        count += f", {len(others)} for others"
    head = (
        f"<h1>Inbox <span class=count>({e(count)})</span></h1>"
        f'<p class="scope">Decisions waiting for a person in {e(scope)}, oldest first.</p>'
        f"{flash(said, error)}"
    )
    if not items:
        return head + '<p class="empty">Nothing waits for a decision.</p>'
    shown = head
    if yours:
        batch = _batch_form(yours, csrf, root)
        listed = "".join(_item(i, csrf, root, batch=bool(batch)) for i in yours)
        shown += batch + f'<ol class="items">{listed}</ol>'
    else:
        shown += '<p class="empty" id="none-yours">Nothing waits for you to decide.</p>'
    if others:
        listed = "".join(_item(i, csrf, root) for i in others)
        shown += (
            f'<section class="others" aria-labelledby="others-t"><h2 id="others-t">'
            f"Waiting for others ({len(others)}): you cannot decide these</h2>"
            f'<ol class="items others">{listed}</ol></section>'
        )
    return shown


def _batch_form(items: Sequence[Waiting], csrf: str, root: str) -> str:
    """Approve or deny several approvals at once: each approval's checkbox (in its item, tied to
    this form) carries the Idempotency-Key of the call it shows, and each becomes a decision of
    its own, refused if the call is no longer that one. Only approvals you may decide."""
    if not any(i.kind == "Approval" and i.yours for i in items):
        return ""
    return (
        f'<form method="post" action="{e(root)}/decide-many" id="batch" class="batch" '
        'aria-label="Decide the selected approvals">'
        f'<input type="hidden" name="csrf" value="{e(csrf)}">'
        "<h2>Selected approvals</h2>"
        '<p class="note">Tick approvals below, then approve or deny them together: each is '
        "recorded as your own decision on the call it shows.</p>"
        '<label for="batch-note">Note for each (why, for the audit trail; one line)</label>'
        '<input type="text" id="batch-note" name="note" maxlength="500" autocomplete="off">'
        '<div class="buttons">'
        '<button type="submit" name="choice" value="approve" class="yes">'
        "Approve selected</button>"
        '<button type="submit" name="choice" value="deny" class="no">Deny selected</button>'
        "</div></form>"
    )


def _item(item: Waiting, csrf: str, root: str, *, batch: bool = False) -> str:
    unknown = item.kind == "Reconciliation"
    what = "Unknown outcome" if unknown else "Approval"
    run_href = f"{e(root)}/runs/{e(item.namespace)}/{e(item.run)}"
    facts = [
        ("Run", f'<a href="{run_href}">{e(item.namespace)}/{e(item.run)}</a>'),
        ("Action", e(item.action)),
        ("Tool", f"<code>{e(item.tool)}</code>"),
        ("Side effect", e(item.side_effect or "unknown")),
        ("Waiting for", e(item.waited)),
    ]
    if item.key:
        facts.append(("Idempotency-Key", f"<code>{e(item.key)}</code>"))
    if not unknown and item.asks:
        facts.append(("Needs", e(item.asks)))
    if not unknown and item.progress:
        who = f" ({', '.join(item.approved_by)})" if item.approved_by else ""
        facts.append(("Approvals so far", f"{e(item.progress)}{e(who)}"))
    if not unknown and item.notes:
        said = "".join(f"<li>{e(line)}</li>" for line in item.notes)
        facts.append(("What they said", f'<ul class="notes">{said}</ul>'))
    if not unknown and item.expires_at:
        facts.append(
            (
                "The first approval expires",
                f"at {e(item.expires_at)} (it is asked for again unless the call has run)",
            )
        )
    if unknown:
        facts.append(
            (
                "Not executed may be settled",
                "now"
                if not item.not_executed_after or moment_passed(item.not_executed_after)
                else f"after {e(item.not_executed_after)}",
            )
        )
    facts.append(("Operator says", e(item.said or "nothing yet")))
    if item.args is not None:
        args = f'<pre class="args">{e(json.dumps(item.args, indent=2, sort_keys=True))}</pre>'
    else:
        args = f'<p class="note">Not shown: {e(item.args_unavailable)}</p>'
    facts.append(("Arguments as recorded", args))
    rows = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    title = f"{what}: {item.tool} in {item.namespace}/{item.run}, action {item.action}"
    pick = ""
    if batch and not unknown and item.yours:
        pick = (
            f'<p class="pick"><input type="checkbox" form="batch" name="pick" '
            f'id="{e(item.ident)}-pick" value="{e(item.pick)}"> '
            f'<label for="{e(item.ident)}-pick">Select for the batch ({e(title)})</label></p>'
        )
    return (
        f'<li class="item {"unknown" if unknown else "approval"}" id="{e(item.ident)}">'
        f'<article aria-labelledby="{e(item.ident)}-t">'
        f'<h2 id="{e(item.ident)}-t"><span class="tag">{e(what)}</span> {e(item.tool)} '
        f'<span class="sub">{e(item.namespace)}/{e(item.run)} · {e(item.action)}</span></h2>'
        f'<dl class="facts">{rows}</dl>{pick}'
        f"{_decision_form(item, csrf, title, root)}</article></li>"
    )


def _decision_form(item: Waiting, csrf: str, title: str, root: str) -> str:
    if not item.may:
        return (
            f'<p class="forbidden" role="note"><strong>You may not decide this</strong> '
            f"(forbidden: {e(item.why_not)}). Ask for Keelgate's edit role in "
            f"{e(item.namespace)}.</p>"
        )
    if item.not_yours and not item.may_deny:
        return (
            f'<p class="apart" role="note" id="{e(item.ident)}-why"><strong>Not yours to '
            f"decide:</strong> {e(item.not_yours)}</p>"
        )
    unknown = item.kind == "Reconciliation"
    note_id = f"{item.ident}-note"
    early = unknown and item.not_executed_after and not moment_passed(item.not_executed_after)
    if unknown:
        buttons = (
            '<button type="submit" name="choice" value="executed" class="yes">'
            "Executed: it took effect</button>"
            '<button type="submit" name="choice" value="not-executed" class="no"'
            + (
                f' disabled aria-describedby="{e(item.ident)}-early"'
                f' data-enable-at="{e(item.not_executed_after)}"'
                if early
                else ""
            )
            + ">Not executed: abandon it</button>"
        )
    elif item.not_yours:  # theirs to deny only (the creator, who approved already)
        buttons = '<button type="submit" name="choice" value="deny" class="no">Deny</button>'
    else:
        buttons = (
            '<button type="submit" name="choice" value="approve" class="yes">Approve</button>'
            '<button type="submit" name="choice" value="deny" class="no">Deny</button>'
        )
    apart = (
        f'<p class="apart" role="note" id="{e(item.ident)}-why"><strong>You cannot approve '
        f"this:</strong> {e(item.not_yours)}</p>"
        if item.not_yours
        else ""
    )
    needs = "; a deny needs one, the rule asks why" if item.reason_to_deny else ""
    hint = (
        f'<p class="note" id="{e(item.ident)}-early">The call may still be sent until '
        f"{e(item.not_executed_after)}: Not executed is refused before then.</p>"
        if early
        else ""
    )
    hidden = "".join(
        f'<input type="hidden" name="{k}" value="{e(v)}">'
        for k, v in (
            ("csrf", csrf),
            ("kind", item.kind),
            ("namespace", item.namespace),
            ("run", item.run),
            ("action", item.action),
            ("key", item.key),
        )
    )
    return (
        f'{apart}<form method="post" action="{e(root)}/decide" class="decide" '
        f'aria-label="Decide: {e(title)}">'
        f'{hidden}<label for="{e(note_id)}">Note (why, for the audit trail; one line'
        f"{e(needs)})</label>"
        f'<input type="text" id="{e(note_id)}" name="note" maxlength="500" autocomplete="off">'
        f'<div class="buttons">{buttons}</div>{hint}</form>'
    )


def runs(
    rows: Sequence[RunRow],
    *,
    namespace: str,
    phase: str,
    namespaces: Iterable[str],
    root: str = "",
) -> str:
    options = "".join(
        f'<option value="{e(n)}"{" selected" if n == namespace else ""}>{e(n or "all")}</option>'
        for n in ("", *sorted(set(namespaces)))
    )
    phases = "".join(
        f'<option value="{e(p)}"{" selected" if p == phase else ""}>{e(p or "all")}</option>'
        for p in ("", *PHASES)
    )
    filters = (
        f'<form method="get" action="{e(root)}/runs" class="filters" aria-label="Filter runs">'
        f'<label for="f-ns">Namespace</label><select id="f-ns" name="namespace">{options}</select>'
        f'<label for="f-phase">Phase</label><select id="f-phase" name="phase">{phases}</select>'
        '<button type="submit">Filter</button></form>'
    )
    if not rows:
        return f"<h1>Runs</h1>{filters}<p class=empty>No runs.</p>"
    head = "".join(
        f'<th scope="col">{h}</th>'
        for h in (
            "Namespace",
            "Run",
            "Phase",
            "Reason",
            "Iteration",
            "Budgets used",
            "Waiting",
            "Age",
        )
    )
    body = "".join(_run_row(r, root) for r in rows)
    return (
        f"<h1>Runs</h1>{filters}<table class=runs><caption>{len(rows)} runs</caption>"
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )


def _run_row(row: RunRow, root: str) -> str:
    budgets = ", ".join(
        f"{what} {used}/{limit}" if limit else f"{what} {used}" for what, used, limit in row.budgets
    )
    href = f"{e(root)}/runs/{e(row.namespace)}/{e(row.name)}"
    return (
        f'<tr><td>{e(row.namespace)}</td><td><a href="{href}">{e(row.name)}</a></td>'
        f'<td><span class="phase {e(row.phase.lower())}">{e(row.phase)}</span></td>'
        f"<td>{e(row.reason)}</td><td>{row.iteration}</td><td>{e(budgets)}</td>"
        f"<td>{row.waiting}</td><td>{e(row.age)}</td></tr>"
    )


def run_page(page: RunPage, *, root: str = "") -> str:
    run = page.run
    meta, status = run["metadata"], run.get("status") or {}
    name = f"{meta.get('namespace', '')}/{meta['name']}"
    phase = str(status.get("phase") or "Pending")
    summary = (
        f'<h1>Run {e(name)} <span class="phase {e(phase.lower())}">{e(phase)}</span></h1>'
        f'<p class="summary">Stop reason: <strong>{e(status.get("stopReason") or "none")}</strong>'
        f" · iteration {e(status.get('iteration') or 0)}"
        f' · <a href="{e(root)}/?{e(urlencode({"run": meta["name"]}))}">inbox</a></p>'
    )
    conditions = "".join(
        f"<tr><th scope=row>{e(c.get('type', ''))}</th><td>{e(c.get('status', ''))}</td>"
        f"<td>{e(c.get('reason', ''))}</td><td>{e(c.get('message', ''))}</td></tr>"
        for c in page.conditions
    )
    cond_table = (
        "<h2>Conditions</h2><table class=conditions><thead><tr><th scope=col>Type</th>"
        "<th scope=col>Status</th><th scope=col>Reason</th><th scope=col>Message</th></tr>"
        f"</thead><tbody>{conditions or '<tr><td colspan=4>none yet</td></tr>'}</tbody></table>"
    )
    return summary + cond_table + _timeline(page) + _decisions(page.decisions) + _trail(page)


def _timeline(page: RunPage) -> str:
    """Iterations with their actions (keys and outcomes) from the audit trail, and the step pods."""
    pods = "".join(
        f"<li>step {e(_label(p, STEP_LABEL))}, attempt "
        f"{e(_label(p, ATTEMPT_LABEL))}: pod <code>{e(p['metadata']['name'])}</code>, "
        f"{e(_pod_state(p))}</li>"
        for p in page.pods
    )
    steps = f"<h2>Steps (pods)</h2><ol class=pods>{pods or '<li>none kept</li>'}</ol>"
    iterations: dict[str, list[str]] = {}
    for event in page.recorded.events:
        data = event.get("data") or {}
        kind = str(event.get("type", ""))
        iteration = str(data.get("iteration") or str(data.get("action", "")).split(":")[0] or "")
        line = _event_line(kind, data, str(event.get("actor", "")))
        if line and iteration:
            iterations.setdefault(iteration, []).append(line)
    if not iterations:
        why = page.recorded.unavailable or "no iteration recorded yet"
        return steps + f"<h2>Iterations</h2><p class=note>{e(why)}</p>"
    blocks = "".join(
        f"<li><h3>Iteration {e(i)}</h3><ul>{''.join(f'<li>{x}</li>' for x in lines)}</ul></li>"
        for i, lines in iterations.items()
    )
    return steps + f"<h2>Iterations</h2><ol class=timeline>{blocks}</ol>"


def _event_line(kind: str, data: Mapping[str, Any], actor: str) -> str:
    action, tool = e(data.get("action", "")), e(data.get("tool", ""))
    key = data.get("idempotencyKey")
    keyed = f" (key <code>{e(key)}</code>)" if key else ""
    if kind == "loop.plan_saved":
        planned = ", ".join(
            f"{e(a.get('action', ''))} {e(a.get('tool', ''))}" for a in data.get("actions") or ()
        )
        return f"planned: {planned or ('done' if data.get('done') else 'nothing')}"
    if kind == "loop.action_started":
        return f"{action} {tool} started, {e(data.get('sideEffect', ''))}{keyed}"
    if kind == "loop.action_completed":
        replay = ", replayed" if data.get("replayed") else ""
        return f"{action} {tool}: <strong>{e(data.get('status', ''))}</strong>{replay}"
    if kind in ("loop.reconciled", "loop.approved", "loop.denied"):
        who = e(data.get("by") or actor)
        verdict = e(data.get("verdict") or kind.split(".")[1])
        # An approval of several is one of them: "approved by bob (1 of 2)", never more.
        counted = data.get("approvals"), data.get("required")
        count = f" ({e(counted[0])} of {e(counted[1])})" if None not in counted else ""
        why = f": {e(data['note'])}" if data.get("note") else ""
        return f"{action} {tool}: <strong>{verdict}</strong> by {who}{count}{why}"
    if kind == "loop.call_changed":
        changed = ", ".join(e(p) for p in data.get("changed") or ())
        voided = ", ".join(e(p) for p in data.get("voided") or ())
        lost = f"; the approvals of {voided} no longer count" if voided else ""
        return f"{action} {tool}: the tool changed before its call ({changed}){lost}"
    if kind == "loop.verified":
        return f"verified: {e(data.get('verdict', ''))}"
    if kind == "loop.late_result":
        return f"{action} {tool}: a late result arrived"
    return ""


def _decisions(decisions: Sequence[Mapping[str, Any]]) -> str:
    if not decisions:
        return ""
    rows = "".join(
        f"<tr><td>{e(d['kind'])}</td><td>{e((d.get('spec') or {}).get('action', ''))}</td>"
        f"<td>{e((d.get('spec') or {}).get('tool', ''))}</td>"
        f"<td>{e((d.get('status') or {}).get('phase', 'Pending'))}</td>"
        f"<td>{e((d.get('status') or {}).get('verdict', ''))}"
        f"{_progress(d.get('status') or {})}</td>"
        f"<td>{e((d.get('status') or {}).get('settledBy') or (d.get('spec') or {}).get('by', ''))}"
        "</td></tr>"
        for d in decisions
    )
    return (
        "<h2>Decisions</h2><table class=decisions><thead><tr><th scope=col>Kind</th>"
        "<th scope=col>Action</th><th scope=col>Tool</th><th scope=col>Phase</th>"
        f"<th scope=col>Verdict</th><th scope=col>By</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _progress(status: Mapping[str, Any]) -> str:
    """ " (1 of 2)" for an Approval of several, as its status counts it (what the store holds,
    never the entries of its spec); "" otherwise."""
    progress = str(status.get("progress") or "")
    if not progress or progress.endswith(" of 1"):
        return ""
    return f" ({e(progress)})"


def _trail(page: RunPage) -> str:
    recorded = page.recorded
    if recorded.unavailable:
        return f"<h2>Audit trail</h2><p class=note>Not shown: {e(recorded.unavailable)}</p>"
    if recorded.verified:
        verdict = '<p class="verdict ok" role="status"><strong>Chain verified:</strong> '
        verdict += f"{len(recorded.events)} events, every link intact.</p>"
    else:
        problems = "".join(f"<li>{e(p)}</li>" for p in recorded.problems)
        verdict = (
            '<div class="verdict bad" role="alert"><strong>Chain broken:</strong>'
            f"<ul>{problems}</ul></div>"
        )
    rows = "".join(
        f"<tr><td>{e(ev.get('seq', ''))}</td><td>{e(ev.get('at', ''))}</td>"
        f"<td>{e(ev.get('type', ''))}</td><td>{e(ev.get('actor', ''))}</td>"
        f"<td>{e(_writer(ev))}</td>"
        f"<td><code>{e(str(ev.get('hash', ''))[:12])}</code></td></tr>"
        for ev in recorded.events
    )
    return (
        f"<h2>Audit trail</h2>{verdict}<table class=trail><thead><tr><th scope=col>#</th>"
        "<th scope=col>At</th><th scope=col>Event</th><th scope=col>Actor</th>"
        "<th scope=col>Written by</th>"
        f"<th scope=col>Hash</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _writer(event: Mapping[str, Any]) -> str:
    """The database role that wrote an event and what it is, as the store recorded them; a
    dash where the store records no writer (SQLite, memory, older events)."""
    writer = event.get("writer")
    if not writer:
        return "-"
    return f"{writer} ({event.get('writerKind') or '?'})"


def _label(pod: Mapping[str, Any], key: str) -> str:
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(key, "?"))


def _pod_state(pod: Mapping[str, Any]) -> str:
    status = pod.get("status") or {}
    for state in status.get("containerStatuses") or ():
        terminated = (state.get("state") or {}).get("terminated")
        if terminated:
            return f"{status.get('phase', '')}, exit code {terminated.get('exitCode')}"
    return str(status.get("phase") or "Pending")


def not_found(what: str, *, root: str = "") -> str:
    return f"<h1>Not found</h1><p>{e(what)}</p><p><a href='{e(root)}/'>Back to the inbox</a></p>"
