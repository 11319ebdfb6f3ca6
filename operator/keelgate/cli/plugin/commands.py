"""``kubectl keelgate`` subcommands (contract section 4): runs seen and settled in a cluster.

``status``, ``reconcile``, ``approve``, ``resume`` and ``logs`` act on the AgentRun and its
objects through the API server, as the user of the kubeconfig context; ``audit`` reads the
run's hash-chained trail from the store, where it lives (the cluster never holds it), exactly as
``keelgate audit`` does. Decisions are merge patches of ``spec`` that the operator then carries
out: the plugin never settles anything in the store itself, so the admission policy, RBAC and
the CRDs' rules see every decision. It must refuse bad input before any request, never write a
decision the user did not give or in another name than their own, and never print a Secret, a
store password or a tool's argument.

Why one module past 500 lines: it is the typer app's command list; each command is a thin shell
(options, checks, one call into ``client`` and ``view``), and the shells read best side by side.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any

import typer

from keelgate.cli.commands import (
    DollarsOption,
    MaxIterationsOption,
    MaxVerifierRejectionsOption,
    OutputFormat,
    OutputOption,
    TimeoutOption,
    TokensOption,
    _decimal,
    _decision,
)
from keelgate.cli.help import App
from keelgate.cli.plugin import standing, view
from keelgate.cli.plugin.client import ClusterClient, PluginApi, Refused
from keelgate.cli.plugin.target import Target, namespace_only, resolve
from keelgate.cli.render import Console
from keelgate.core.approvals import refusal
from keelgate.core.loop import check_actor
from keelgate.core.types import ApprovalRule
from keelgate.errors import InputError, SettleError, SettleTooEarly
from keelgate.kube.naming import approval_round
from keelgate.kube.settle_window import TOO_EARLY
from keelgate.kube.times import now

#: How a command reaches the cluster; tests put a fake here.
connect: Callable[[Target], PluginApi] = ClusterClient

_ACTION = re.compile(r"^[0-9]+:[0-9]+$")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        Console().say(f"kubectl-keelgate {version('keelgate')}")
        raise typer.Exit(0)


app = App(
    name="kubectl keelgate",
    help="Keelgate runs in a cluster: see where a run stands, settle its decisions, raise its "
    "budgets, read its step pods' logs and its audit trail.",
    epilog=(
        "Flags as kubectl's: --kubeconfig, --context, -n/--namespace (before or after the "
        "command); --as/--as-group impersonate, as kubectl's; KUBECONFIG is honoured. Exit codes: "
        "0 ok (status: succeeded or under way); 3 status of a run stopped until someone acts; "
        "1 failed or refused; 2 bad input; 5 the API server (or the store, for audit) cannot "
        "be reached; 130 interrupted."
    ),
)


@dataclass(frozen=True)
class KubeFlags:
    """kubectl's flags, as given before the command (``kubectl keelgate -n shop status x``)."""

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None


KubeconfigOption = Annotated[
    str | None,
    typer.Option("--kubeconfig", help="The kubeconfig file (default: KUBECONFIG, ~/.kube/config)."),
]
ContextOption = Annotated[
    str | None, typer.Option("--context", help="The kubeconfig context (default: the current).")
]
NamespaceOption = Annotated[
    str | None,
    typer.Option("--namespace", "-n", help="The run's namespace (default: the context's)."),
]


@app.callback()
def _main(
    ctx: typer.Context,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    namespace: NamespaceOption = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Keelgate runs in a cluster (the kubectl plugin)."""
    ctx.obj = KubeFlags(kubeconfig, context, namespace)


def duration(flag: str, text: str) -> int:
    """Seconds of a kubectl-style duration: 30s, 5m, 2h (or a whole number of seconds)."""
    units = {"s": 1, "m": 60, "h": 3600}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    if not number.isdigit() or int(number) <= 0:
        raise InputError(flag, f"{text!r}: give a duration such as 30s, 5m or 2h")
    return int(number) * units[unit]


def _given(flag: str, before: str | None, after: str | None) -> str | None:
    """A flag given before the command, after it, or both alike; both, unalike, is refused
    (which one was meant cannot be guessed, and a decision must not land in the wrong place)."""
    if before is not None and after is not None and before != after:
        raise InputError(flag, f"given twice, as {before!r} and {after!r}: give it once")
    return after if after is not None else before


def _flags(
    ctx: typer.Context, kubeconfig: str | None, context: str | None, namespace: str | None
) -> KubeFlags:
    outer = ctx.obj if isinstance(ctx.obj, KubeFlags) else KubeFlags()
    return KubeFlags(
        _given("--kubeconfig", outer.kubeconfig, kubeconfig),
        _given("--context", outer.context, context),
        _given("--namespace", outer.namespace, namespace),
    )


def _api(
    ctx: typer.Context, kubeconfig: str | None, context: str | None, namespace: str | None
) -> PluginApi:
    flags = _flags(ctx, kubeconfig, context, namespace)
    return connect(resolve(flags.kubeconfig, flags.context, flags.namespace))


# status


@app.command("status")
def status_command(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(help="The AgentRun's name.")],
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    namespace: NamespaceOption = None,
    output: OutputOption = OutputFormat.text,
) -> int:
    """Where a run stands, as a tree, and what to run next.

    Phase, stop, usage, conditions, its step pod, the actions waiting for a person (with their
    Reconciliation or Approval). Exit 0 succeeded or under way, 1 failed, 3 stopped until
    someone acts.
    """
    api = _api(ctx, kubeconfig, context, namespace)
    body = api.agentrun(run)
    reconciliations = api.decisions("Reconciliation", run)
    approvals = api.decisions("Approval", run)
    pod_name = str(((body.get("status") or {}).get("step") or {}).get("pod") or "")
    pod: Mapping[str, Any] | None = None
    if pod_name:
        try:
            pod = api.pod(pod_name)
        except Refused as refused:  # a user who may read runs but not pods still sees the run
            pod = {"status": {"phase": f"not readable ({refused})"}}
    document = view.report(body, reconciliations, approvals, pod, api.target)
    console = Console()
    if output is OutputFormat.json:
        console.json(document)
    else:
        view.print_tree(console.out, view.tree(document))
    return view.exit_code(document["phase"])


# reconcile and approve


@dataclass(frozen=True)
class _Kind:
    """What differs between settling an unknown outcome and deciding an approval."""

    name: str  # the object's kind
    field: str  # the spec field holding the decision
    yes: str  # the verdicts, as the operator writes them into status
    no: str

    @property
    def plural(self) -> str:
        return f"{self.name.lower()}s"

    def verdict(self, decision: bool) -> str:
        return self.yes if decision else self.no


RECONCILIATION = _Kind("Reconciliation", "executed", "executed", "abandoned")
APPROVAL = _Kind("Approval", "approved", "approved", "denied")

NoteOption = Annotated[
    str | None, typer.Option("--note", help="Why, for the audit trail's readers (spec.note).")
]


@app.command("reconcile")
def reconcile_command(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(help="The AgentRun's name.")],
    action: Annotated[str, typer.Argument(help="The action's id, e.g. 3:0.")],
    did: Annotated[
        bool, typer.Option("--executed", help="It took effect: record it as done.")
    ] = False,
    did_not: Annotated[
        bool, typer.Option("--not-executed", help="It did not: abandon it, never retried.")
    ] = False,
    note: NoteOption = None,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    namespace: NamespaceOption = None,
    output: OutputOption = OutputFormat.text,
) -> int:
    """Settle an unknown outcome: --executed records it done, --not-executed abandons it.

    Patches the Reconciliation's spec.executed, with spec.by your own user name (from the API
    server, as `kubectl auth whoami`) and spec.decidedAt (now), once the API server says you
    may patch it. --not-executed is refused until the call can no longer be sent; one written
    earlier is refused by the operator (DecidedTooEarly): its maker then runs this again, with
    --not-executed once they have looked again, or --executed if it ran.
    """
    executed = _decision(did, did_not, "--executed", "--not-executed", "whether it took effect")
    api = _api(ctx, kubeconfig, context, namespace)
    return _decide(api, RECONCILIATION, run, action, executed, note, output)


@app.command("approve")
def approve_command(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(help="The AgentRun's name.")],
    action: Annotated[str, typer.Argument(help="The action's id, e.g. 2:0.")],
    yes: Annotated[bool, typer.Option("--approve", help="Let the action run.")] = False,
    no: Annotated[bool, typer.Option("--deny", help="Never run it; the model is told.")] = False,
    note: NoteOption = None,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    namespace: NamespaceOption = None,
    output: OutputOption = OutputFormat.text,
) -> int:
    """Decide a pending approval: --approve lets the action run, --deny never runs it.

    Patches the Approval's spec.approved, with spec.by your own user name (from the API
    server, as `kubectl auth whoami`) once the API server says you may patch it.
    """
    approved = _decision(yes, no, "--approve", "--deny", "whether the action may run")
    api = _api(ctx, kubeconfig, context, namespace)
    return _decide(api, APPROVAL, run, action, approved, note, output)


@dataclass(frozen=True)
class Decided:
    """A decision written (or found already made, ``already``): what the user is told."""

    run: str
    action: str
    tool: str
    verdict: str
    by: str
    name: str
    already: bool
    # An approval of several: the count once it is recorded ("1 of 2"); "" otherwise.
    progress: str = ""


def decide(
    api: PluginApi,
    kind: _Kind,
    run: str,
    action: str,
    decision: bool,
    note: str | None,
    *,
    key: str = "",
) -> Decided:
    """Record the user's decision on the run's action, in their own name, once the API server
    says they may: every check of ``kubectl keelgate reconcile|approve``, for any front end
    (the command line, the decision inbox). ``key``: the Idempotency-Key of the call the user
    was shown (the inbox): an Approval for another call is refused. Raises the CLI's errors;
    writes nothing on one."""
    if not _ACTION.match(action):
        raise InputError("ACTION", f"{action!r} is not an action id (iteration:index, e.g. 3:0)")
    if note is not None and any(ord(c) < 32 and c not in "\t" for c in note):
        raise InputError("--note", "must be one line")
    user, groups = api.identity()
    check_actor(user, field="your user name")
    objects = api.decisions(kind.name, run)
    found = _asked_on(api, kind, run, action, objects)
    if found is None:
        api.agentrun(run)  # no such run says so (exit 2) before "no such action" would
        undecided = [
            f"{o['spec'].get('action')} ({o['metadata']['name']})"
            for o in objects
            if o["spec"].get(kind.field) is None
            and (o.get("status") or {}).get("phase") != "Settled"
        ]
        waiting = f"; waiting: {', '.join(undecided)}" if undecided else "; none is waiting"
        raise InputError("ACTION", f"run {run!r} has no {kind.name} for action {action}{waiting}")
    name = str(found["metadata"]["name"])
    tool = str(found["spec"].get("tool", ""))
    verdict = kind.verdict(decision)
    if kind is APPROVAL:
        return _approve(
            api,
            found,
            run,
            action,
            decision,
            note,
            user,
            groups,
            key,
            name=name,
            tool=tool,
            verdict=verdict,
        )
    early = _written_too_early(found)
    if early:
        # Its "not executed" never counts: only its maker may write it again or correct it.
        _only_its_maker(found, run, action, user, early)
    else:
        earlier = _decided_already(found, kind, run, action, decision)
        if earlier:  # the same decision again (a retried command): nothing to do, and fine
            return Decided(run, action, tool, verdict, earlier, name, already=True)
    if not decision:
        _refuse_before_the_deadline(api, found, run, action)
    _may_patch(api, kind, name, user)
    # When the user looked (this host's clock, to the second): the operator counts a "not
    # executed" only if it was written after the call's write deadline, and this says so.
    patch: dict[str, Any] = {kind.field: decision, "by": user, "decidedAt": now()}
    if note is not None:
        patch["note"] = note
    api.patch_spec(kind.name, name, patch)
    return Decided(run, action, tool, verdict, user, name, already=False)


def _asked_on(
    api: PluginApi, kind: _Kind, run: str, action: str, objects: Sequence[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The object a decision on ``action`` goes to: its Reconciliation; or the Approval of the
    round the run asks in now (its status, which the operator writes, names the round: an
    action asked afresh has one Approval a round, and a decision on an earlier round's counts
    for nothing), else the first round's, else any (to say how it was decided)."""
    mine = [o for o in objects if str(o["spec"].get("action")) == action]
    if kind is not APPROVAL or len(mine) < 2:
        return mine[0] if mine else None
    asked, _ = standing.asked_of(api.agentrun(run), action)
    wanted = int((asked or {}).get("round") or 1)
    return next(
        (o for o in mine if approval_round(o) == wanted),
        next((o for o in mine if approval_round(o) == 1), mine[0]),
    )


def _approve(
    api: PluginApi,
    found: Mapping[str, Any],
    run: str,
    action: str,
    decision: bool,
    note: str | None,
    user: str,
    groups: tuple[str, ...],
    key: str,
    *,
    name: str,
    tool: str,
    verdict: str,
) -> Decided:
    """Add the user's decision to the Approval's spec.decisions (their name, the groups the
    API server authenticated them in, which admission checks again, the moment, and the
    definition of the call they were shown): unless the same decision of theirs is there
    already and counts, or the Approval is decided the other way. A decision the rule in force
    cannot count (``keelgate.core.approvals.refusal``, the judge the operator asks too) is
    refused before anything is written, in one line. ``name``, ``tool`` and ``verdict`` are
    the Approval's, the tool's and the decision's, as ``decide`` read them from ``found``."""
    spec, status = found.get("spec") or {}, found.get("status") or {}
    wanted = str(spec.get("idempotencyKey") or "")
    if key and wanted and key != wanted:
        raise SettleError(
            run,
            action,
            f"was shown as the call with Idempotency-Key {key}, but approval {name} is for "
            f"{wanted}: its arguments are not the ones shown; look again",
        )
    if status.get("phase") == "Settled" and status.get("askedAgainAs"):
        raise SettleError(
            run,
            action,
            f"approval {name} expired (no approval on it can count any more) and the action "
            f"is asked afresh on approval {status['askedAgainAs']}: run this command again "
            "once it is there; nothing was changed",
        )
    if status.get("phase") == "Settled":
        shown = str(status.get("verdict") or "settled")
        by = str(status.get("settledBy") or "someone")
        if shown == verdict and (not decision or user in (status.get("approvedBy") or ())):
            return Decided(run, action, tool, verdict, by, name, already=True)
        raise SettleError(
            run,
            action,
            f"already decided: {shown} by {by} (approval {name}); a decision cannot change",
        )
    asked, rule, creator = _asked(api, run, action)
    counted = standing.counted_of(found, asked)
    progress = str(status.get("progress") or "")
    if decision and user in counted:
        return Decided(run, action, tool, verdict, user, name, already=True, progress=progress)
    why = refusal(
        rule,
        approved=decision,
        by=user,
        groups=groups,
        creator=creator,
        counted=counted,
        note=note or "",
    )
    if why is not None:
        raise SettleError(run, action, f"{why}; nothing was changed")
    definition = str(asked.get("definition") or status.get("definition") or "")
    if standing.made_already(spec, status, user, decision, definition):
        # A retried command: the operator has yet to record the same decision of theirs.
        return Decided(run, action, tool, verdict, user, name, already=True, progress=progress)
    _may_patch(api, APPROVAL, name, user)
    entry: dict[str, Any] = {
        "by": user,
        "groups": list(groups),
        "approved": decision,
        "at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if definition:
        entry["definition"] = definition
    if note is not None:
        entry["note"] = note
    api.append_decision(name, entry, first="decisions" not in spec)
    progress = ""
    if decision and rule.required > 1:
        progress = f"{len(counted) + 1} of {rule.required}"
    return Decided(run, action, tool, verdict, user, name, already=False, progress=progress)


def _asked(api: PluginApi, run: str, action: str) -> tuple[Mapping[str, Any], ApprovalRule, str]:
    """What the run asks of ``action`` now: its entry of ``status.pendingApprovals`` (the rule
    in force, the definition the call is bound to, who counts), the rule, and the run's
    creator. A run that does not wait for it refuses the decision, in one line."""
    body = api.agentrun(run)
    asked, rule = standing.asked_of(body, action)
    if asked is None:
        raise SettleError(run, action, f"{standing.not_waiting(body)}; nothing was changed")
    return asked, rule, standing.creator_of(body)


def _may_patch(api: PluginApi, kind: _Kind, name: str, user: str) -> None:
    """Refuse, before anything is written, a decision the API server would not let the user
    write (a SelfSubjectAccessReview): one clear line naming the role to ask for, instead of
    the API server's 403 after the fact."""
    allowed, reason = api.may("patch", kind.plural, name)
    if not allowed:
        why = f" ({reason})" if reason else ""
        raise Refused(
            f"{user} may not patch {kind.name.lower()} {name} in namespace "
            f"{api.target.namespace}{why}: ask for Keelgate's edit role there; nothing was changed",
            status=403,
        )


def _decide(
    api: PluginApi,
    kind: _Kind,
    run: str,
    action: str,
    decision: bool,
    note: str | None,
    output: OutputFormat,
) -> int:
    done = decide(api, kind, run, action, decision, note)
    return _show_decided(api, kind, done, output)


def _refuse_before_the_deadline(
    api: PluginApi, found: Mapping[str, Any], run: str, action: str
) -> None:
    """Refuse "not executed" while the call may still be sent (``SettleTooEarly``, exit 4, as
    ``keelgate reconcile`` does): a process held up between its claim and its send could still
    send it until its write deadline, which the run's status names for each unknown action
    (``notExecutedAfter``). The moment is the store's; this checks it on this host's clock, and
    the operator, which settles in the store, holds a decision written too early until then and
    then refuses it (``DecidedTooEarly``: the call may have gone out after the person looked)."""
    after = str((found.get("status") or {}).get("notExecutedAfter") or "")
    if not after:
        after = not_executed_after(api.agentrun(run), action)
    if not after:
        return
    try:
        moment = dt.datetime.strptime(after, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return  # not a moment this code can read: the operator's settlement decides
    left = (moment - dt.datetime.now(dt.UTC)).total_seconds()
    if left > 0:
        raise SettleTooEarly(run, action, not_before=after, retry_after=left)


def not_executed_after(run: Mapping[str, Any], action: str) -> str:
    """The moment from which the run's unknown ``action`` may be settled "not executed", as the
    AgentRun's status names it ("" when it names none)."""
    for unknown in (run.get("status") or {}).get("unknownActions") or []:
        if str(unknown.get("action")) == action:
            return str(unknown.get("notExecutedAfter") or "")
    return ""


def _written_too_early(found: Mapping[str, Any]) -> str:
    """How the Reconciliation's "not executed" shows it will never count ("" when it does not):
    the operator met it before the call's write deadline and holds it (``heldGeneration``,
    this very generation), or refused it as written too early (``Stalled``, reason
    ``DecidedTooEarly``, answering this generation: a newer one is yet to be looked at). Its
    maker may write it again after the deadline, or correct it to executed, until it is
    settled."""
    spec, status = found.get("spec") or {}, found.get("status") or {}
    if spec.get("executed") is not False or status.get("phase") == "Settled":
        return ""
    generation = int((found.get("metadata") or {}).get("generation") or 0)
    if generation and status.get("heldGeneration") == generation:
        return "held: it was written before the call could no longer be sent"
    for shown in status.get("conditions") or ():
        if shown.get("type") != "Stalled" or shown.get("status") != "True":
            continue
        answers = int(shown.get("observedGeneration") or generation)
        if shown.get("reason") == TOO_EARLY and answers == generation:
            return "refused: it was written before the call could no longer be sent"
    return ""


def _only_its_maker(found: Mapping[str, Any], run: str, action: str, user: str, early: str) -> None:
    """Refuse, before anything is written, anyone but the maker of a "not executed" that will
    never count (``early`` says how it shows that): writing it again or correcting it is its
    maker's alone (the admission policy refuses anyone else, and ``by`` never changes)."""
    maker = str((found.get("spec") or {}).get("by") or "")
    if maker == user:
        return
    name = found["metadata"]["name"]
    raise Refused(
        f"not executed by {maker or 'someone'} on reconciliation {name} ({run} {action}) is "
        f"{early}; only {maker or 'its maker'}, who made it, may write it again or correct it "
        "to executed; nothing was changed",
        status=403,
    )


def _decided_already(
    found: Mapping[str, Any], kind: _Kind, run: str, action: str, decision: bool
) -> str:
    """Who already made this very decision ("" if nobody decided yet); a different decision
    already made is refused: a decision cannot change."""
    spec, status = found.get("spec") or {}, found.get("status") or {}
    earlier = spec.get(kind.field)
    if earlier is None and status.get("phase") != "Settled":
        return ""
    if earlier is not None:
        verdict, by = kind.verdict(bool(earlier)), str(spec.get("by") or "someone")
    else:  # settled elsewhere: a confirmer, or `keelgate reconcile --store`
        verdict = str(status.get("verdict") or "settled")
        by = str(status.get("settledBy") or status.get("source") or "someone")
    if verdict == kind.verdict(decision):
        return by
    raise SettleError(
        run,
        action,
        f"already decided: {verdict} by {by} ({kind.name.lower()} "
        f"{found['metadata']['name']}); a decision cannot change",
    )


def _show_decided(api: PluginApi, kind: _Kind, done: Decided, output: OutputFormat) -> int:
    """Show the decision made (or found already made): a line for a person, with where to
    follow the operator carrying it out, or JSON; exit 0."""
    console = Console()
    if output is OutputFormat.json:
        console.json(
            {
                "run": done.run,
                "action": done.action,
                "tool": done.tool,
                "verdict": done.verdict,
                "by": done.by,
                kind.name.lower(): done.name,
                "already": done.already,
                **({"progress": done.progress} if done.progress else {}),
            }
        )
        return 0
    already = "already " if done.already else ""
    count = f" ({done.progress})" if done.progress else ""
    console.say(
        f"{done.run} {done.action} ({done.tool}): {already}{done.verdict} by {done.by}{count} "
        f"({kind.name.lower()} {done.name})",
        style="green",
    )
    if not done.already:
        console.say(
            f"  the operator carries it out: kubectl keelgate status {done.run}"
            f"{api.target.flags()}",
            style="dim",
        )
    return 0


# resume


@app.command("resume")
def resume_command(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(help="The AgentRun's name.")],
    tokens: TokensOption = None,
    dollars: DollarsOption = None,
    max_iterations: MaxIterationsOption = None,
    timeout: TimeoutOption = None,
    max_verifier_rejections: MaxVerifierRejectionsOption = None,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    namespace: NamespaceOption = None,
    output: OutputOption = OutputFormat.text,
) -> int:
    """Raise the named budgets to the given totals; the operator resumes the run.

    A merge patch of the AgentRun's spec.budget: the operator resumes a run a budget stopped,
    and a saved plan runs without asking the model again.
    """
    total_dollars = _decimal("--dollars", dollars)
    wanted: dict[str, Any] = {}
    if tokens is not None:
        wanted["tokens"] = tokens
    if total_dollars is not None:
        wanted["dollars"] = format(total_dollars, "f")  # the CRD's decimal string: no exponent
    if max_iterations is not None:
        wanted["maxIterations"] = max_iterations
    if timeout is not None:
        wanted["timeoutSeconds"] = int(timeout) if timeout == int(timeout) else timeout
    if max_verifier_rejections is not None:
        wanted["maxVerifierRejections"] = max_verifier_rejections
    if not wanted:
        raise InputError(
            "--tokens/--dollars/--max-iterations/--timeout",
            "name at least one budget to raise (each is a new total)",
        )
    api = _api(ctx, kubeconfig, context, namespace)
    body = api.agentrun(run)
    status = body.get("status") or {}
    phase, reason = str(status.get("phase") or ""), str(status.get("stopReason") or "")
    console = Console()
    if phase == "Succeeded" or (phase == "Failed" and reason == "failed"):
        why = "it met its goal" if phase == "Succeeded" else "it failed, which is final"
        console.warn(f"{run} has finished: {why}; nothing to resume, its spec is left as it is")
        return view.exit_code(phase)
    budget = dict((body.get("spec") or {}).get("budget") or {})
    changes = {f: (budget.get(f), v) for f, v in wanted.items() if not _same(budget.get(f), v)}
    for warning in _not_more(wanted, status):
        console.warn(warning)
    if changes:
        api.patch_spec("AgentRun", run, {"budget": {f: new for f, (_, new) in changes.items()}})
    if status.get("unknownActions") or status.get("pendingApprovals"):
        console.warn(f"{run} also waits for a person: kubectl keelgate status {run} says who")
    if (body.get("spec") or {}).get("suspend"):
        console.warn(f"{run} is suspended (spec.suspend is true): no step starts until it is not")
    if output is OutputFormat.json:
        console.json(
            {
                "run": run,
                "changed": {f: {"from": old, "to": new} for f, (old, new) in changes.items()},
            }
        )
        return 0
    if not changes:
        console.say(f"{run}: spec.budget already holds these totals; nothing changed")
        return 0
    said = ", ".join(f"spec.budget.{f} {_shown(old)} → {new}" for f, (old, new) in changes.items())
    console.say(f"{run}: {said}", style="green")
    console.say(
        f"  the operator resumes a run its budget stopped: "
        f"kubectl keelgate status {run}{api.target.flags()}",
        style="dim",
    )
    return 0


def _same(old: Any, new: Any) -> bool:
    if old is None:
        return False
    try:
        return Decimal(str(old)) == Decimal(str(new))
    except ArithmeticError:
        return False


def _shown(value: Any) -> str:
    return "unlimited" if value is None else str(value)


def _not_more(wanted: Mapping[str, Any], status: Mapping[str, Any]) -> list[str]:
    """A warning for each new total that is not above what the run has already used."""
    usage = status.get("usage") or {}
    used: dict[str, tuple[str, Decimal]] = {
        "tokens": (
            "--tokens",
            Decimal(int(usage.get("inputTokens") or 0) + int(usage.get("outputTokens") or 0)),
        ),
        "dollars": ("--dollars", Decimal(str(usage.get("dollars") or "0"))),
        "maxIterations": ("--max-iterations", Decimal(int(status.get("iteration") or 0))),
        "timeoutSeconds": ("--timeout", Decimal(str(usage.get("activeSeconds") or 0))),
    }
    warnings = []
    for field, total in wanted.items():
        if field in used and Decimal(str(total)) <= used[field][1]:
            flag, spent = used[field]
            warnings.append(f"{flag} {total} is a new total, not more: {spent} is already used")
    return warnings


# audit


StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar="KEELGATE_STORE",
        help="The operator's store URL, postgresql://... (env KEELGATE_STORE): the trail is "
        "kept there, not in the cluster.",
    ),
]


@app.command("audit")
def audit_command(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(help="The run's name (its AgentRun may be deleted).")],
    check: Annotated[
        bool, typer.Option("--verify", help="Check every link; exit 1 if the chain is broken.")
    ] = False,
    store: StoreOption = None,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    namespace: NamespaceOption = None,
    output: OutputOption = OutputFormat.text,
    key: Annotated[
        str,
        typer.Option(
            "--key",
            help="With --verify: a PEM public key; check the heads the operator signed.",
        ),
    ] = "",
) -> int:
    """The run's hash-chained audit trail, from the operator's store (--store).

    Read as `keelgate audit` reads it; the namespace (the tenant) comes from -n or the
    context, and the API server is not asked (a deleted run's trail is still there).
    """
    if not store:
        raise InputError(
            "--store",
            "the audit trail is kept in the operator's store, not in the cluster: give "
            "--store postgresql://... or KEELGATE_STORE (reachable from here, e.g. through "
            "kubectl port-forward)",
        )
    flags = _flags(ctx, kubeconfig, context, namespace)
    tenant = namespace_only(flags.kubeconfig, flags.context, flags.namespace)
    from keelgate.cli.audit_tools import audit_command as keelgate_audit

    return int(keelgate_audit(run, check, tenant, store, output, key))
