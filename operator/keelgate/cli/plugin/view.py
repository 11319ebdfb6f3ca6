"""What ``kubectl keelgate status`` and ``logs`` show: a run's state as one document, and as a tree.

``report`` gathers what the cluster says about a run (its status, conditions, current step pod,
Reconciliations and Approvals) into one JSON document, the same one ``--output json`` prints;
``tree`` draws that document for a person, ending with the commands to run next. Both are pure:
they never talk to a cluster. Nothing here may show a tool's argument or a secret: AgentRun
status, Reconciliations and Approvals hold neither, and a pod's log lines go through the
redactor (``keelgate.core.redaction``) before they are shown.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console as RichConsole
from rich.text import Text
from rich.tree import Tree

from keelgate.cli.plugin.target import Target
from keelgate.core.exits import EXIT_FAILED, EXIT_OK, EXIT_RESUMABLE, STEP_MEANINGS
from keelgate.core.redaction import redact_text
from keelgate.kube.controller.pod_ends import classify
from keelgate.kube.naming import (
    ATTEMPT_LABEL,
    STEP_LABEL,
    action_object_name,
    approval_round,
)

JSON = dict[str, Any]

PHASE_STYLE = {
    "Succeeded": "bold green",
    "Stopped": "bold yellow",
    "Failed": "bold red",
    "Running": "bold blue",
    "Pending": "bold blue",
}

#: The budget flag of `kubectl keelgate resume` that lifts each budget stop.
BUDGET_FLAGS = {
    "token_budget": "--tokens N",
    "dollar_budget": "--dollars D",
    "max_iterations": "--max-iterations N",
    "timeout": "--timeout S",
    "verifier_rejections": "--max-verifier-rejections N",
}


def exit_code(phase: str) -> int:
    """What kubectl users expect: 0 for a run that succeeded or is under way (Pending, Running:
    nothing is wrong), 1 failed, 3 stopped until someone acts (a person's decision, a budget,
    a stall)."""
    if phase in ("Succeeded", "Running", "Pending"):
        return EXIT_OK
    return EXIT_FAILED if phase == "Failed" else EXIT_RESUMABLE


# Step pods


def step_and_attempt(pod: Mapping[str, Any]) -> tuple[int, int]:
    """A step pod's (step, attempt), from its labels (else its name ``<run>-s<N>-a<M>``)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    try:
        return int(labels[STEP_LABEL]), int(labels[ATTEMPT_LABEL])
    except (KeyError, ValueError):
        found = re.search(r"-s(\d+)-a(\d+)$", str(meta.get("name", "")))
        return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def in_order(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Step pods in the order they ran: by step, then attempt (numbers, not text: s10 > s9)."""
    return sorted(pods, key=lambda p: (*step_and_attempt(p), str(p["metadata"]["name"])))


def pod_finished(pod: Mapping[str, Any]) -> bool:
    """Whether a step pod has ended (its log will not grow)."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def pod_end(pod: Mapping[str, Any]) -> tuple[str, int | None]:
    """How a step pod ended, in words, and its exit code (None while it runs or never ran)."""
    status = pod.get("status") or {}
    containers = status.get("containerStatuses") or []
    state = (containers[0].get("state") or {}) if containers else {}
    terminated = state.get("terminated")
    if terminated:
        code = terminated.get("exitCode")
        words = classify(pod).words
        if isinstance(code, int):
            meaning = STEP_MEANINGS.get(code)
            if meaning is None and code > 128:
                meaning = "killed by signal 9 (SIGKILL)" if code == 137 else f"signal {code - 128}"
            return (f"{words}: {meaning}" if meaning else words), code
        return words, None
    phase = str(status.get("phase") or "Pending")
    if phase in ("Pending", "Running"):
        waiting = (state.get("waiting") or {}).get("reason")
        return (f"{phase.lower()} ({waiting})" if waiting else phase.lower()), None
    return classify(pod).words, None


def log_lines(text: str) -> list[str]:
    """A pod's log as lines fit to show: anything shaped like a password masked."""
    return [redact_text(line) for line in text.splitlines()]


# Status


def report(
    run: Mapping[str, Any],
    reconciliations: Sequence[Mapping[str, Any]],
    approvals: Sequence[Mapping[str, Any]],
    pod: Mapping[str, Any] | None,
    target: Target,
) -> JSON:
    """Everything ``status`` says about a run, as one JSON document."""
    meta, spec = run.get("metadata") or {}, run.get("spec") or {}
    status = run.get("status") or {}
    name = str(meta.get("name", ""))
    phase = str(status.get("phase") or "Pending")
    rec_by_action = {str(r["spec"].get("action")): r for r in reconciliations}
    # The first round's Approval of each action (a later round's is named by its round).
    app_by_action = {str(a["spec"].get("action")): a for a in approvals if approval_round(a) == 1}
    unknown = [
        {
            "action": str(u.get("action", "")),
            "tool": str(u.get("tool", "")),
            "idempotencyKey": str(u.get("idempotencyKey", "")),
            "reconciliation": _object_name(rec_by_action, name, u),
        }
        for u in status.get("unknownActions") or []
    ]
    pending = [
        {
            "action": str(p.get("action", "")),
            "tool": str(p.get("tool", "")),
            "approval": _object_name(app_by_action, name, p),
        }
        for p in status.get("pendingApprovals") or []
    ]
    step = dict(status.get("step") or {})
    step_view: JSON = {
        "number": step.get("number"),
        "attempt": step.get("attempt"),
        "pod": step.get("pod", ""),
        "state": step.get("state", ""),
    }
    if step.get("pod"):
        if pod is None:
            step_view["podState"] = "gone" if step.get("state") == "Ended" else "not created yet"
        else:
            step_view["podState"], step_view["exitCode"] = pod_end(pod)
    conditions = [
        {k: c.get(k, "") for k in ("type", "status", "reason", "message")}
        for c in status.get("conditions") or []
    ]
    stalled = any(c["type"] == "Stalled" and c["status"] == "True" for c in conditions)
    document: JSON = {
        "run": name,
        "namespace": str(meta.get("namespace", target.namespace)),
        "loop": str(spec.get("loop") or "task"),
        "phase": phase,
        "stopReason": str(status.get("stopReason") or ""),
        "resumable": bool(status.get("resumable")),
        "stalled": stalled,
        "suspended": bool(spec.get("suspend")),
        "message": str(status.get("message") or ""),
        "answer": status.get("answer"),
        "iteration": int(status.get("iteration") or 0),
        "usage": dict(status.get("usage") or {}),
        "observedGeneration": status.get("observedGeneration"),
        "generation": meta.get("generation"),
        "step": step_view,
        "conditions": conditions,
        "actions": _actions(reconciliations, approvals),
        "unknownActions": unknown,
        "pendingApprovals": pending,
    }
    document["next"] = next_commands(document, target)
    return document


def _object_name(found: Mapping[str, Mapping[str, Any]], run: str, item: Mapping[str, Any]) -> str:
    """The object the operator made for an action (whatever its name: one made before an
    upgrade keeps an earlier release's; an action asked afresh, its round's); its computed name
    while it is being made."""
    action, tool = str(item.get("action", "")), str(item.get("tool", ""))
    round = int(item.get("round") or 1)  # an action asked afresh: its round's own Approval
    obj = found.get(action) if round == 1 else None
    if obj is not None:
        return str(obj["metadata"]["name"])
    return action_object_name(run, action, tool, round=round)


def _actions(
    reconciliations: Sequence[Mapping[str, Any]], approvals: Sequence[Mapping[str, Any]]
) -> list[JSON]:
    """Every decision the run has asked for, settled or not, by action."""
    rows: list[JSON] = []
    for kind, objects, field in (
        ("reconciliation", reconciliations, "executed"),
        ("approval", approvals, "approved"),
    ):
        for obj in objects:
            spec, status = obj.get("spec") or {}, obj.get("status") or {}
            rows.append(
                {
                    "action": str(spec.get("action", "")),
                    "tool": str(spec.get("tool", "")),
                    "kind": kind,
                    "name": str(obj["metadata"]["name"]),
                    "phase": str(status.get("phase") or "Pending"),
                    "decided": spec.get(field),
                    "verdict": str(status.get("verdict") or ""),
                    "by": str(status.get("settledBy") or spec.get("by") or ""),
                    "source": str(status.get("source") or ""),
                    # An approval's count so far ("1 of 2"), who counts, when the first expires.
                    "progress": str(status.get("progress") or ""),
                    "approvedBy": [str(b) for b in status.get("approvedBy") or ()],
                    "expiresAt": str(status.get("expiresAt") or ""),
                    # What the operator says of it: a decision it refused, and why.
                    "message": str(status.get("message") or ""),
                }
            )
    rows.sort(key=lambda r: (_iteration(r["action"]), r["action"], r["kind"]))
    return rows


def _iteration(action: str) -> int:
    head = action.partition(":")[0]
    return int(head) if head.isdigit() else 0


def next_commands(document: Mapping[str, Any], target: Target) -> list[str]:
    """What a person can run next, as commands to paste (comments say what each does)."""
    run, flags = document["run"], target.flags()
    phase, reason = document["phase"], document["stopReason"]
    commands: list[str] = []
    for u in document["unknownActions"]:
        action = u["action"]
        commands += [
            f"kubectl keelgate reconcile {run} {action} --executed{flags}"
            "      # ask the system it changes first: it happened",
            f"kubectl keelgate reconcile {run} {action} --not-executed{flags}"
            "  # it did not: never retried under its key",
        ]
    for p in document["pendingApprovals"]:
        action = p["action"]
        commands += [
            f"kubectl keelgate approve {run} {action} --approve{flags}  # let it run",
            f"kubectl keelgate approve {run} {action} --deny{flags}     # never run it",
        ]
    if commands:
        return commands
    if document["stalled"]:
        return [
            f"kubectl keelgate logs {run}{flags}  # why its steps fail",
            f"kubectl edit agentrun {run}{flags}  # any change to the spec tries again",
        ]
    if document["suspended"] and phase not in ("Succeeded", "Failed"):
        return [
            f"kubectl patch agentrun {run}{flags} --type merge "
            """-p '{"spec":{"suspend":false}}'  # continue"""
        ]
    if reason in BUDGET_FLAGS and phase != "Succeeded":
        return [f"kubectl keelgate resume {run} {BUDGET_FLAGS[reason]}{flags}  # new total"]
    if reason == "cost_unknown":
        return [f"kubectl edit agentrun {run}{flags}  # state the model's price: spec.pricing"]
    if phase in ("Pending", "Running"):
        return [
            f"kubectl wait --for=condition=Succeeded agentrun/{run}{flags}",
            f"kubectl keelgate logs {run}{flags}",
        ]
    return [
        f"kubectl keelgate audit {run} --verify{flags} --store URL  # the trail, from the store",
        f"kubectl keelgate logs {run}{flags}",
    ]


def print_tree(out: RichConsole, drawn: Tree) -> None:
    """On a terminal a long line wraps inside its branch; into a pipe or a file nothing is cut
    or wrapped (rich would crop at 80 columns), so grep and a pager see whole lines."""
    if out.is_terminal:
        out.print(drawn, soft_wrap=False)
    else:
        RichConsole(file=sys.stdout, width=4096, highlight=False, soft_wrap=False).print(drawn)


def tree(document: Mapping[str, Any]) -> Tree:
    """The report as a tree a person reads top to bottom."""
    phase = document["phase"]
    title = Text(f"AgentRun {document['namespace']}/{document['run']}  ", style="bold")
    title += Text(phase, style=PHASE_STYLE.get(phase, "bold"))
    if document["stopReason"]:
        title += Text(f"  {document['stopReason']}")
    if document["resumable"]:
        title += Text(" (resumable)", style="dim")
    if document["stalled"]:
        title += Text(" (stalled)", style="bold red")
    root = Tree(title)
    if document["message"]:
        root.add(Text("message: ", style="bold") + Text(document["message"]))
    if document["answer"]:
        root.add(Text("answer: ", style="bold") + Text(str(document["answer"])))
    usage = document["usage"]
    tokens_in, tokens_out = int(usage.get("inputTokens") or 0), int(usage.get("outputTokens") or 0)
    root.add(
        Text(
            f"iteration {document['iteration']} · tokens {tokens_in + tokens_out} "
            f"(in {tokens_in} / out {tokens_out}) · ${usage.get('dollars', '0')} · "
            f"active {float(usage.get('activeSeconds') or 0):.1f}s",
            style="dim",
        )
    )
    generation, observed = document["generation"], document["observedGeneration"]
    if isinstance(generation, int) and isinstance(observed, int) and observed < generation:
        root.add(
            Text(
                f"the operator has not acted on the latest spec yet (generation {generation}, "
                f"observed {observed}): what follows may be about to change",
                style="yellow",
            )
        )
    if document["suspended"]:
        root.add(Text("suspended: spec.suspend is true (no new step starts)", style="yellow"))
    step = document["step"]
    if step.get("pod"):
        root.add(
            Text("step ", style="bold")
            + Text(
                f"{step.get('number')}, attempt {step.get('attempt')}: pod {step['pod']}, "
                f"{step.get('podState', '')}"
            )
        )
    conditions = root.add(Text("conditions", style="bold"))
    for c in document["conditions"]:
        style = "yellow" if c["type"] in ("OutcomeUnknown", "AwaitingApproval") else ""
        if c["status"] != "True":
            style = "dim"
        line = Text(f"{c['type']}={c['status']}", style=style) + Text(f"  {c['reason']}")
        if c["message"]:
            line += Text(f": {c['message']}", style="dim")
        conditions.add(line)
    _add_actions(root, document)
    following = root.add(Text("next", style="bold"))
    for command in document["next"]:
        following.add(Text(command))
    return root


def _add_actions(root: Tree, document: Mapping[str, Any]) -> None:
    """Actions that asked for a person, by iteration: the undecided ones first in the eye."""
    unknown = {u["action"]: u for u in document["unknownActions"]}
    pending = {p["action"]: p for p in document["pendingApprovals"]}
    rows: list[JSON] = list(document["actions"])
    listed = {(r["action"], r["kind"]) for r in rows}
    # An unknown outcome or a pending approval whose object is still being made.
    for action, u in unknown.items():
        if (action, "reconciliation") not in listed:
            rows.append(_undecided(action, u["tool"], "reconciliation", u["reconciliation"]))
    for action, p in pending.items():
        if (action, "approval") not in listed:
            rows.append(_undecided(action, p["tool"], "approval", p["approval"]))
    if not rows:
        return
    actions = root.add(Text("actions that asked for a person", style="bold"))
    iterations: dict[int, Tree] = {}
    for row in sorted(rows, key=lambda r: (_iteration(r["action"]), r["action"], r["kind"])):
        number = _iteration(row["action"])
        if number not in iterations:
            iterations[number] = actions.add(Text(f"iteration {number}", style="bold"))
        node = iterations[number]
        head = Text(f"{row['action']} {row['tool']}: ")
        if row["kind"] == "reconciliation" and row["action"] in unknown and not row["verdict"]:
            head += Text("outcome unknown", style="bold yellow")
            key = unknown[row["action"]]["idempotencyKey"]
            extra = f" (Idempotency-Key {key})" if key else ""
        elif row["kind"] == "approval" and row["action"] in pending and not row["verdict"]:
            head += Text("awaiting approval", style="bold yellow")
            extra = _count(row)
        elif row["verdict"]:
            head += Text(row["verdict"], style="green" if row["verdict"] != "denied" else "")
            source = f", {row['source']}" if row.get("source") == "confirmer" else ""
            extra = f" by {row['by']}{source}" if row["by"] else ""
        else:
            head += Text("decided, not yet applied by the operator", style="dim")
            extra = f" by {row['by']}" if row["by"] else ""
        shown = node.add(head + Text(f"{extra} → {row['kind']} {row['name']}", style=""))
        said = str(row.get("message") or "")
        if "not counted:" in said:
            # A decision the operator refused stays in sight, with its reason.
            shown.add(Text("not counted: " + said.split("not counted:", 1)[1].strip(), "yellow"))


def _count(row: Mapping[str, Any]) -> str:
    """ " (1 of 2: bob; the first expires at ...)" for an approval that needs more than one,
    or whose approvals expire; "" for one that waits for its one approval."""
    progress = str(row.get("progress") or "")
    expires = str(row.get("expiresAt") or "")
    if not progress or (progress.endswith(" of 1") and not expires):
        return ""
    said = progress
    if row.get("approvedBy"):
        said += f": {', '.join(row['approvedBy'])}"
    if expires:
        said += f"; the first expires at {expires}"
    return f" ({said})"


def _undecided(action: str, tool: str, kind: str, name: str) -> JSON:
    return {"action": action, "tool": tool, "kind": kind, "name": name, "verdict": "", "by": ""}
