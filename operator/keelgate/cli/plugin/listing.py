"""``kubectl keelgate list`` and ``kubectl keelgate pending``: runs, and what waits for a person,
in a namespace or in every namespace the user may list (``-A``), as kubectl lists things.

Why it exists: the person who approves or settles wants one question answered, "what waits for
me?", across the namespaces they can see, oldest first, with the command that decides each; a
platform team wants the runs at a glance. Output is kubectl's: a table (``-o wide`` adds
columns), ``json`` and ``yaml`` (a List of the objects), ``name`` (``kind.group/name``). Both
exit 0 whenever they could list, even if nothing is found. This module only reads: it must never
write, and never show a tool's argument (the objects hold none).
"""

from __future__ import annotations

import datetime as dt
import shlex
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

import typer

from keelgate.cli.listing import (
    AllNamespacesOption,
    ListOutput,
    ListOutputOption,
    against,
    age,
    emit,
    span,
    table,
)
from keelgate.cli.plugin import standing
from keelgate.cli.plugin.client import PLURALS, PluginApi, Refused
from keelgate.cli.plugin.commands import (
    ContextOption,
    KubeconfigOption,
    NamespaceOption,
    _api,
    app,
)
from keelgate.cli.plugin.standing import Standing
from keelgate.cli.render import Console
from keelgate.kube.naming import GROUP
from keelgate.kube.times import parse_time

JSON = dict[str, Any]

#: ``age`` is the inbox's too (keelgate.cli.plugin.ui).
__all__ = ["age", "budget_use", "decided", "list_command", "pending_command", "waiting_count"]


@app.command("list")
def list_command(
    ctx: typer.Context,
    all_namespaces: AllNamespacesOption = False,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    namespace: NamespaceOption = None,
    output: ListOutputOption = ListOutput.text,
) -> int:
    """The runs (AgentRuns): phase, stop reason, iteration, age; -o wide adds tokens, dollars
    and active seconds used against their limits."""
    api = _api(ctx, kubeconfig, context, namespace)
    runs = sorted(
        _listed_everywhere(api, ("AgentRun",)) if all_namespaces else api.listed("AgentRun"),
        key=lambda r: (r["metadata"].get("namespace", ""), r["metadata"]["name"]),
    )
    now = dt.datetime.now(dt.UTC)
    header = ["NAME", "PHASE", "REASON", "ITERATION", "AGE"]
    if output is ListOutput.wide:
        header += ["TOKENS", "DOLLARS", "ACTIVE", "WAITING"]
    if all_namespaces:
        header.insert(0, "NAMESPACE")
    rows = []
    for run in runs:
        status = run.get("status") or {}
        row = [
            run["metadata"]["name"],
            str(status.get("phase") or "Pending"),
            str(status.get("stopReason") or ""),
            str(status.get("iteration") or 0),
            age(run["metadata"].get("creationTimestamp"), now),
        ]
        if output is ListOutput.wide:
            (_, tokens, most_tokens), (_, dollars, most_dollars), (_, active, longest) = budget_use(
                run
            )
            row += [
                against(tokens, most_tokens),
                against(dollars, most_dollars),
                against(f"{active}s", longest),
                str(waiting_count(run)),
            ]
        if all_namespaces:
            row.insert(0, run["metadata"].get("namespace", ""))
        rows.append(row)
    where = "any namespace" if all_namespaces else f"namespace {api.target.namespace}"
    emit(output, _list(runs), _names(runs), header, rows, f"No runs in {where}.")
    return 0


def budget_use(run: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(what, used, limit) of a run's tokens, dollars and active seconds, as its status and
    spec say them; the limit is "" when the budget sets none. The list's wide columns and the
    inbox's runs page show these."""
    status = run.get("status") or {}
    budget, usage = (run.get("spec") or {}).get("budget") or {}, status.get("usage") or {}
    tokens = int(usage.get("inputTokens") or 0) + int(usage.get("outputTokens") or 0)
    return [
        ("tokens", str(tokens), str(budget.get("tokens") or "")),
        ("dollars", str(usage.get("dollars") or "0"), str(budget.get("dollars") or "")),
        (
            "seconds",
            f"{float(usage.get('activeSeconds') or 0):.0f}",
            str(budget.get("timeoutSeconds") or ""),
        ),
    ]


def waiting_count(run: Mapping[str, Any]) -> int:
    """How many of the run's actions wait for a person (unknown outcomes and approvals)."""
    status = run.get("status") or {}
    return len(status.get("unknownActions") or []) + len(status.get("pendingApprovals") or [])


#: What decides each kind of waiting object, and how.
_DECIDE = {
    "Reconciliation": ("reconcile", "--executed|--not-executed"),
    "Approval": ("approve", "--approve|--deny"),
}


@app.command("pending")
def pending_command(
    ctx: typer.Context,
    all_namespaces: AllNamespacesOption = False,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    namespace: NamespaceOption = None,
    output: ListOutputOption = ListOutput.text,
) -> int:
    """What waits for a person, oldest first: unknown outcomes to settle (Reconciliations) and
    actions to approve (Approvals) not yet decided, each with the command that decides it;
    then, apart, what waits for others, with why you cannot decide it (the run's rule in
    force, as the operator judges it; or RBAC)."""
    api = _api(ctx, kubeconfig, context, namespace)
    kinds = ("Reconciliation", "Approval")
    found = _listed_everywhere(api, kinds) if all_namespaces else _here(api, kinds)
    waiting = [item for item in found if not decided(item)]
    waiting.sort(
        key=lambda i: (i["metadata"].get("creationTimestamp") or "", i["metadata"]["name"])
    )
    judged = _standings(api, waiting)
    now = dt.datetime.now(dt.UTC)
    header = ["KIND", "RUN", "ACTION", "TOOL", "WAITING", "APPROVALS", "EXPIRES", "DECIDE WITH"]
    if output is ListOutput.wide:
        header[7:7] = ["NAME", "KEY", "NOT EXECUTED AFTER", "NOT COUNTED"]
    if all_namespaces:
        header.insert(0, "NAMESPACE")
    yours: list[list[str]] = []
    others: list[list[str]] = []
    for index, item in enumerate(waiting):
        spec, meta = item.get("spec") or {}, item["metadata"]
        verb, choices = _DECIDE[item["kind"]]
        command = (
            f"kubectl keelgate {verb} {shlex.quote(str(spec.get('runName', '')))} "
            f"{spec.get('action', '')} {choices} -n {meta.get('namespace', '')}"
        )
        status = item.get("status") or {}
        row = [
            item["kind"].lower(),
            str(spec.get("runName", "")),
            str(spec.get("action", "")),
            str(spec.get("tool", "")),
            age(meta.get("creationTimestamp"), now),
            str(status.get("progress") or ""),
            expires_in(str(status.get("expiresAt") or ""), now),
            command,
        ]
        if output is ListOutput.wide:
            said = str(status.get("message") or "")
            row[7:7] = [
                meta["name"],
                str(spec.get("idempotencyKey", "")),
                str(status.get("notExecutedAfter", "")),
                said.split("not counted:", 1)[1].strip() if "not counted:" in said else "",
            ]
        if all_namespaces:
            row.insert(0, meta.get("namespace", ""))
        you = judged.get(index)
        if you is None or you.decide:
            yours.append(row)
        else:
            others.append([*row[:-1], you.why])
    where = "any namespace you may list" if all_namespaces else f"namespace {api.target.namespace}"
    document = _list(
        [
            {**item, "you": judged[index].to_json()} if index in judged else item
            for index, item in enumerate(waiting)
        ]
    )
    if output not in (ListOutput.text, ListOutput.wide) or not others:
        emit(
            output,
            document,
            _names(waiting),
            header,
            yours,
            f"Nothing waits for a person in {where}.",
        )
        return 0
    if yours:
        print(table([header, *yours]))
    else:
        print(f"Nothing waits for you in {where}.")
    print(f"\nWaiting for others ({len(others)}): you cannot decide these")
    print(table([[*header[:-1], "WHY NOT YOU"], *others]))
    return 0


def _standings(api: PluginApi, waiting: Sequence[JSON]) -> dict[int, Standing]:
    """Each waiting object's standing for the user (by its place in ``waiting``), as the
    inbox shows it: RBAC's word on patching it, and for an Approval the run's rule in force
    judged by the one judge. None is judged when the API server cannot say who the user is
    (said once on stderr), or an object whose run cannot be read (its namespace's runs are
    not listable): those stay listed as waiting."""
    if not waiting:
        return {}
    try:
        user, groups = api.identity()
    except Refused as refused:
        Console().warn(f"who you are is unknown ({refused}): what you may decide is not judged")
        return {}
    runs = _runs_of(api, waiting)
    may: dict[tuple[str, str], tuple[bool, str]] = {}
    judged: dict[int, Standing] = {}
    for index, item in enumerate(waiting):
        meta, spec = item["metadata"], item.get("spec") or {}
        where, kind = str(meta.get("namespace") or api.target.namespace), str(item["kind"])
        if (where, kind) not in may:
            may[(where, kind)] = api.may("patch", PLURALS[kind], "", namespace=where)
        allowed, reason = may[(where, kind)]
        if not allowed:
            judged[index] = standing.rbac_refused(where, kind, reason)
        elif kind != "Approval":
            judged[index] = Standing(True, True)
        elif where in runs:
            run = runs[where].get(str(spec.get("runName") or ""))
            judged[index] = standing.of_approval(item, run, user=user, groups=groups)
    return judged


def _runs_of(api: PluginApi, waiting: Sequence[JSON]) -> dict[str, dict[str, JSON]]:
    """The runs of the namespaces with a waiting Approval: namespace -> name -> AgentRun; a
    namespace whose runs the user may not list is left out."""
    wanted = {
        str(i["metadata"].get("namespace") or api.target.namespace)
        for i in waiting
        if i["kind"] == "Approval"
    }
    found: list[JSON] = []
    listed: set[str] = set()
    for where in sorted(wanted):
        try:
            found += api.listed("AgentRun", namespace=where)
        except Refused as refused:
            if refused.status != HTTPStatus.FORBIDDEN:
                raise
            continue
        listed.add(where)
    runs: dict[str, dict[str, JSON]] = {where: {} for where in listed}
    for run in found:
        where = str(run["metadata"].get("namespace") or api.target.namespace)
        runs.setdefault(where, {})[str(run["metadata"]["name"])] = run
    return runs


def _here(api: PluginApi, kinds: Sequence[str]) -> list[JSON]:
    return [item for kind in kinds for item in api.listed(kind)]


def _listed_everywhere(api: PluginApi, kinds: Sequence[str]) -> list[JSON]:
    """Every object of ``kinds`` in every namespace the user may list them in: at once, if
    they may list them cluster-wide; else namespace by namespace (the cluster's, when they may
    list namespaces, else the context's), said in one line on stderr, as a person with rights
    in their own namespaces only expects `-A` to mean "everywhere I can see"."""
    try:
        return [item for kind in kinds for item in api.listed(kind, all_namespaces=True)]
    except Refused as refused:
        if refused.status != HTTPStatus.FORBIDDEN:
            raise
        everywhere = refused
    try:
        candidates = api.namespaces()
    except Refused as refused:
        if refused.status != HTTPStatus.FORBIDDEN:
            raise
        candidates = [api.target.namespace]
    found: list[JSON] = []
    shown: list[str] = []
    for where in candidates:
        try:
            found += [item for kind in kinds for item in api.listed(kind, namespace=where)]
        except Refused as refused:
            if refused.status != HTTPStatus.FORBIDDEN:
                raise
            continue
        shown.append(where)
    if not shown:
        raise everywhere
    plurals = " and ".join(PLURALS[kind] for kind in kinds)
    Console().warn(
        f"you may not list {plurals} in every namespace; showing the namespaces you may list: "
        f"{', '.join(shown)}"
    )
    return found


def _list(items: Sequence[JSON]) -> JSON:
    """The objects as kubectl prints a list of them in json and yaml."""
    return {"apiVersion": "v1", "kind": "List", "items": list(items)}


def _names(items: Sequence[JSON]) -> list[str]:
    """``kind.group/name`` of each object, as ``kubectl get -o name`` prints them."""
    return [f"{item['kind'].lower()}.{GROUP}/{item['metadata']['name']}" for item in items]


def decided(item: Mapping[str, Any]) -> bool:
    """Whether nobody needs to act on the object any more: Settled, or (a Reconciliation)
    decided in spec and not refused (then it waits for the operator, not for a person). An
    Approval waits for people until the operator shows it Settled: a decision in its spec may
    yet be refused (not in the rule's groups, the run's creator, a ServiceAccount), and an
    action whose decision was refused must never drop out of sight."""
    status = item.get("status") or {}
    if status.get("phase") == "Settled":
        return True
    if item.get("kind") == "Approval":
        return False
    refused = any(
        c.get("type") == "Stalled" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    return "executed" in (item.get("spec") or {}) and not refused


def expires_in(when: str, now: dt.datetime) -> str:
    """When the first approval that counts stops counting, as "in 42m" ("" if never)."""
    moment = parse_time(when)
    if moment is None:
        return ""
    seconds = int((moment - now).total_seconds())
    return f"in {span(seconds)}" if seconds > 0 else "now"
