"""The subcommands of ``keelgate`` (contract section 4), and the options they share.

Each command opens the stores named by ``--store``, does one thing through the runner or the
loop, prints, and returns the exit code. Bad input is refused before any store is written.

Why one module past 500 lines: it is the typer app's command list with the options every group
shares (``audit``, ``tenant``, ``temporal`` and the operator's commands are in their own
modules): each command is a thin shell, and the shells read best side by side.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from keelgate.cli.driving import drive, driven_now
from keelgate.cli.examples import EXIT_CODES
from keelgate.cli.help import App
from keelgate.cli.listing import (
    GROUP,
    AllNamespacesOption,
    ListOutput,
    ListOutputOption,
    against,
    age,
    emit,
)
from keelgate.cli.render import Console
from keelgate.core.approvals import check_groups
from keelgate.core.exits import EXIT_BUSY, run_exit_code
from keelgate.core.loop import Loop, check_actor
from keelgate.core.monitor import tick_number
from keelgate.core.protocols import Stores
from keelgate.core.spec import Budget
from keelgate.core.types import Outcome, RunPhase
from keelgate.core.values import INT64_MAX, SECONDS_MAX
from keelgate.errors import InputError, StaleEpoch
from keelgate.stores import DEFAULT_URL, StoreUrl, open_existing, read_store_url, redacted

if TYPE_CHECKING:
    from keelgate.manifest import AgentRun


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        Console().say(f"keelgate {version('keelgate')}")
        raise typer.Exit(0)


app = App(
    name="keelgate",
    help="Run AI agent loops durably: a WRITE never runs twice and never runs unapproved.",
    epilog=EXIT_CODES,
)


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Run AI agent loops durably: a WRITE never runs twice and never runs unapproved."""


class OutputFormat(StrEnum):
    text = "text"
    json = "json"


StoreOption = Annotated[
    str,
    typer.Option(
        "--store",
        envvar="KEELGATE_STORE",
        help=(
            "Store URL: sqlite:///PATH or postgresql://... (env KEELGATE_STORE); "
            "exit 5 if it cannot be opened or reached."
        ),
    ),
]
NamespaceOption = Annotated[
    str | None,
    typer.Option("--namespace", "-n", help="The run's namespace (tenant); found if omitted."),
]
PricingOption = Annotated[
    Path | None,
    typer.Option(
        "--pricing",
        envvar="KEELGATE_PRICING",
        help="Pricing file: prices by model name, for manifests without spec.pricing.",
    ),
]


def complete_run(ctx: typer.Context, incomplete: str) -> list[str]:
    """The runs of the store the command line names so far, for a shell's TAB: nothing at all
    (never an error) if there is no store there, or it cannot be read. A SQLite store only: a
    TAB must never wait on a database server."""
    try:
        store = ctx.params.get("store") or os.environ.get("KEELGATE_STORE") or DEFAULT_URL
        if not store.startswith("sqlite:"):
            return []
        stores = open_existing(store, read_only=True)
        try:
            namespace = ctx.params.get("namespace")
            names = sorted({ref.run for ref in stores.checkpoints.runs(namespace)})
        finally:
            stores.close()
    except Exception:  # completion must never break the shell
        return []
    return [name for name in names if name.startswith(incomplete)]


RunArgument = Annotated[
    str, typer.Argument(help="The run's name.", autocompletion=complete_run, show_default=False)
]
OutputOption = Annotated[
    OutputFormat, typer.Option("--output", "-o", help="text, or json (one object, last line)")
]

# The budget flags of every `resume` (`keelgate`, `keelgate temporal`, `kubectl keelgate`): each
# a new total for one of the manifest's spec.budget fields (``--dollars`` read by ``_decimal``).
TokensOption = Annotated[
    int | None, typer.Option(min=1, max=INT64_MAX, help="New total token budget.")
]
DollarsOption = Annotated[str | None, typer.Option(help="New total dollar budget.")]
MaxIterationsOption = Annotated[
    int | None,
    typer.Option("--max-iterations", min=1, max=INT64_MAX, help="New iteration limit."),
]
TimeoutOption = Annotated[
    float | None,
    typer.Option(min=0.001, max=SECONDS_MAX, help="New active-time limit in seconds."),
]
MaxVerifierRejectionsOption = Annotated[
    int | None,
    typer.Option(
        "--max-verifier-rejections", min=1, max=INT64_MAX, help="New verifier-rejection limit."
    ),
]


def _show(
    outcome: Outcome, output: OutputFormat, *, command: str = "keelgate", scope: str = ""
) -> int:
    console = Console()
    if output is OutputFormat.json:
        console.json(outcome.to_json())
    else:
        console.outcome(outcome, command=command, scope=scope)
    return run_exit_code(outcome)


def _python_path(*directories: Path) -> None:
    """Python models and tools named in a manifest import from its folder and the cwd."""
    for directory in (Path.cwd(), *directories):
        entry = str(directory.resolve())
        if entry not in sys.path:
            sys.path.insert(0, entry)


def _usable(store: str) -> StoreUrl:
    """The store URL, read; a store the CLI cannot use is refused before anything is created or
    run."""
    read = read_store_url(store)
    if read.scheme == "memory":
        raise InputError("--store", "memory:// does not outlive one command; use sqlite:///PATH")
    return read


def _existing(store: str, *, read_only: bool = False) -> Stores:
    """Open a store that must already hold runs: a mistyped path is an error, not a new file.
    ``read_only``: the command only reads, so a store on read-only media is read there."""
    return open_existing(_usable(store), read_only=read_only)


def _find(stores: Stores, run: str, namespace: str | None, *, store: str) -> tuple[str, str]:
    """(tenant, run) for a run name; a monitor's own name means its latest tick. kubectl's
    spellings of an AgentRun (``agentrun/NAME``, ``agentrun.keelgate.dev/NAME``: what
    ``keelgate runs -o name`` prints) name it too."""
    kind, slash, name = run.partition("/")
    if slash and kind.lower() in ("agentrun", "agentruns", f"agentrun.{GROUP}"):
        run = name
    refs = stores.checkpoints.runs(namespace)
    exact = sorted({ref.tenant for ref in refs if ref.run == run})
    if not exact:
        ticks = [(n, ref) for ref in refs if (n := tick_number(run, ref.run)) is not None]
        if ticks:
            _, latest = max(ticks, key=lambda tick: tick[0])
            return latest.tenant, latest.run
        where = f" in namespace {namespace!r}" if namespace else ""
        raise InputError("RUN", f"no run named {run!r}{where} in {redacted(store)}")
    if len(exact) > 1:
        raise InputError("--namespace", f"run {run!r} exists in {', '.join(exact)}: name one")
    return exact[0], run


@contextmanager
def _opened(
    store: str, run: str, namespace: str | None, *, read_only: bool = False
) -> Iterator[tuple[Loop, str, str]]:
    """(a loop over the store, tenant, run) for a run that must exist; closed afterwards.
    ``read_only``: the command only reads (see ``_existing``)."""
    from keelgate.adapters.tracing import configured

    stores = _existing(store, read_only=read_only)
    tracer = configured()  # a settlement or approval shows in the run's trace, if traced
    try:
        tenant, name = _find(stores, run, namespace, store=store)
        yield Loop(stores=stores, tracer=tracer), tenant, name
    finally:
        stores.close()
        tracer.close()


T = TypeVar("T")

#: How often a person's decision is tried again when the run changed holders between reading
#: its epoch and writing the decision (nothing was written): a hand-over is rare and quick.
DECISION_TRIES = 3


def _decide(loop: Loop, tenant: str, run: str, decide: Callable[[], T]) -> T:
    """Write a person's decision (an approval, a settlement) into a run an operator may hold.

    A decision is not a driver's write: nobody who decides takes the run. It is written under
    the epoch the run is held under now (read from the store), so it lands beside the holder's
    own writes and the holder reads it, as it reads an Approval's; a driver that lost the run
    is still refused by the epoch it carries. Should the run change holders between the read
    and the write, the store refuses it with nothing written, and it is tried again under the
    new epoch."""
    owners = loop.stores.owners
    for tried in range(1, DECISION_TRIES + 1):
        if owners is not None:
            held = owners.holder_of(tenant, run)
            owners.carry(tenant, run, None if held is None else held.epoch)
        try:
            return decide()
        except StaleEpoch:
            if owners is None or tried == DECISION_TRIES:
                raise
    raise AssertionError("unreachable")  # the loop returns or raises


@app.command("run")
def run_command(
    file: Annotated[
        Path,
        typer.Option("--file", "-f", metavar="FILE", help="AgentRun manifest (YAML; '-': stdin)."),
    ],
    store: StoreOption = DEFAULT_URL,
    pricing: PricingOption = None,
    output: OutputOption = OutputFormat.text,
) -> int:
    """Run an AgentRun manifest in-process; run it again with the same store to resume."""
    agentrun, folder = read_manifest(file)
    read = _usable(store)  # before anything runs; the runner builds all before opening it
    spec = replace(agentrun.to_loop_spec(), source_dir=str(folder))
    _python_path(folder)
    return _show(drive(spec, store=read, new_tick=True, pricing=pricing), output)


#: The most a manifest may weigh: what the API server takes in one object (etcd's default
#: request limit, 1.5 MiB). A bigger one could never run in a cluster, and reading it would only
#: cost time and memory, so it is refused before it is read.
MAX_MANIFEST_BYTES = 1536 * 1024


def read_manifest(file: Path) -> tuple[AgentRun, Path]:
    """The manifest ``--file`` names (``-``: standard input), and the folder its Python code is
    imported from (the file's, or the current directory for stdin). Refused in one line naming
    ``--file``: a path that is no regular file, a manifest over ``MAX_MANIFEST_BYTES``."""
    from keelgate.manifest import load_agentrun

    if str(file) == "-":
        data = sys.stdin.buffer.read(MAX_MANIFEST_BYTES + 1)
        _check_size("standard input", len(data), more=len(data) > MAX_MANIFEST_BYTES)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError("--file", "standard input is not UTF-8 text") from None
        # A newline makes it text to the loader, never a path, however short it is.
        text = text if "\n" in text else text + "\n"
        return load_agentrun(text, source="--file (standard input)"), Path.cwd()
    check_manifest_file(file)
    _check_size(str(file), file.stat().st_size)
    return load_agentrun(file), file.parent.resolve()


def _check_size(name: str, size: int, *, more: bool = False) -> None:
    if size > MAX_MANIFEST_BYTES:
        weight = f"more than {size / 1048576:.1f} MiB" if more else f"{size / 1048576:.1f} MiB"
        raise InputError(
            "--file",
            f"{name} is {weight}: the API server takes at most 1.5 MiB in one object, so no "
            "cluster could run it; keep large data out of the manifest (a tool reads it)",
        )


def check_manifest_file(file: Path) -> None:
    """``--file`` names a manifest that can be read: a regular file (a FIFO would block the
    read, a device is no manifest)."""
    if file.is_dir():
        raise InputError("--file", f"{file} is a directory, not a manifest file")
    if not file.exists():
        raise InputError("--file", f"{file}: no such file")
    if not file.is_file():
        raise InputError("--file", f"{file} is not a regular file")


@app.command("resume")
def resume_command(
    run: RunArgument,
    tokens: TokensOption = None,
    dollars: DollarsOption = None,
    max_iterations: MaxIterationsOption = None,
    timeout: TimeoutOption = None,
    max_verifier_rejections: MaxVerifierRejectionsOption = None,
    namespace: NamespaceOption = None,
    store: StoreOption = DEFAULT_URL,
    pricing: PricingOption = None,
    output: OutputOption = OutputFormat.text,
) -> int:
    """Raise the named budgets to the given totals and continue the run to its next stop."""
    total_dollars = _decimal("--dollars", dollars)
    with _opened(store, run, namespace) as (loop, tenant, run):
        state = loop.state(tenant, run)
    from keelgate.runners.local import resumed_spec

    resumed = resumed_spec(
        state,
        tokens=tokens,
        dollars=total_dollars,
        max_iterations=max_iterations,
        timeout_seconds=timeout,
        max_verifier_rejections=max_verifier_rejections,
    )
    for warning in resumed.warnings:
        # Shown as it stands, with its own exit code; but a resume that does nothing says so.
        Console().warn(warning)
    saved, spec = state.spec, resumed.spec
    _python_path(*([Path(saved.source_dir)] if saved.source_dir else []))
    # A monitor tick is a run of its own: resuming it continues that tick, not a new one.
    return _show(drive(spec, store=store, new_tick=False, pricing=pricing), output)


def _decimal(field: str, text: str | None) -> Decimal | None:
    if text is None:
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise InputError(field, f"{text!r} is not a number") from None
    if not value.is_finite() or value < 0:
        raise InputError(field, f"{text!r} must be a non-negative number")
    return value


def _decision(yes: bool, no: bool, yes_flag: str, no_flag: str, question: str) -> bool:
    """Exactly one of a pair of flags. A decision cannot be undone, so one given both ways is
    refused rather than left to whichever flag came last."""
    if yes and no:
        raise InputError(f"{yes_flag}/{no_flag}", f"give one of {yes_flag} and {no_flag}, not both")
    if not (yes or no):
        raise InputError(f"{yes_flag}/{no_flag}", f"say {question}")
    return yes


@app.command("reconcile")
def reconcile_command(
    run: RunArgument,
    action: Annotated[str, typer.Argument(help="The action's id, e.g. 3:0.")],
    by: Annotated[str, typer.Option("--by", help="Who decides (recorded in the audit chain).")],
    did: Annotated[
        bool, typer.Option("--executed", help="It took effect: record it as done.")
    ] = False,
    did_not: Annotated[
        bool,
        typer.Option("--not-executed", help="It did not: abandon it, never retried."),
    ] = False,
    namespace: NamespaceOption = None,
    store: StoreOption = DEFAULT_URL,
    output: OutputOption = OutputFormat.text,
) -> int:
    """Settle an unknown outcome: --executed records it done, --not-executed abandons it."""
    executed = _decision(did, did_not, "--executed", "--not-executed", "whether it took effect")
    check_actor(by, field="--by")
    with _opened(store, run, namespace) as (loop, tenant, run):
        record = _decide(
            loop,
            tenant,
            run,
            lambda: loop.reconcile(tenant, run, action, executed=executed, by=by),
        )
    verdict = "executed" if executed else "abandoned"
    said = (
        "settled as executed" if executed else "settled as abandoned (never retried under its key)"
    )
    return _decided(run, action, record.tool, verdict, by, output, said=said)


def _decided(
    run: str,
    action: str,
    tool: str,
    verdict: str,
    by: str,
    output: OutputFormat,
    *,
    said: str = "",
    pending: Mapping[str, Any] | None = None,
) -> int:
    """What a person decided, for them or (--output json) for a script; ``pending``: the
    action still waits for more approvals (its pending approval, as status shows it)."""
    console = Console()
    if output is OutputFormat.json:
        document: dict[str, Any] = {
            "run": run,
            "action": action,
            "tool": tool,
            "verdict": verdict,
            "by": by,
        }
        if pending is not None:
            document["pending"] = dict(pending)
        console.json(document)
        return 0
    console.say(f"{run} {action} ({tool}): {said or verdict} by {by}", style="green")
    if pending is None:
        console.say(f"  continue with: keelgate resume {run}", style="dim")
    return 0


@app.command("approve")
def approve_command(
    run: RunArgument,
    action: Annotated[str, typer.Argument(help="The action's id, e.g. 2:0.")],
    by: Annotated[str, typer.Option("--by", help="Who decides (recorded in the audit chain).")],
    yes: Annotated[bool, typer.Option("--approve", help="Let the action run.")] = False,
    no: Annotated[bool, typer.Option("--deny", help="Never run it; the model is told.")] = False,
    groups: Annotated[
        list[str] | None,
        typer.Option(
            "--group",
            help="A group the person deciding is in (repeat for each): a tool's approval rule "
            "may count only people of given groups.",
        ),
    ] = None,
    note: Annotated[
        str,
        typer.Option(
            "--note",
            help="Why (one line): on the audit trail; a rule with reasonToDeny needs it to deny.",
        ),
    ] = "",
    namespace: NamespaceOption = None,
    store: StoreOption = DEFAULT_URL,
    output: OutputOption = OutputFormat.text,
) -> int:
    """Record one person's decision on an action awaiting approval: --deny never runs it (the
    model is told); it runs once its tool's rule has its approvals (one, unless the rule asks
    for more people, from given groups, not the run's creator)."""
    approve = _decision(yes, no, "--approve", "--deny", "whether the action may run")
    check_actor(by, field="--by")
    named = check_groups(groups or (), field="--group")
    if any(ord(c) < 32 and c != "\t" for c in note):
        raise InputError("--note", "must be one line")
    with _opened(store, run, namespace) as (loop, tenant, run):
        waiting = {p.action: p.tool for p in loop.state(tenant, run).pending}
        outcome = _decide(
            loop,
            tenant,
            run,
            lambda: loop.approve(
                tenant, run, action, approved=approve, by=by, groups=named, note=note
            ),
        )
    verdict = "approved" if approve else "denied"
    still = next((p for p in outcome.pending_approvals if p.action == action), None)
    said = ""
    if still is not None:
        left = still.required - still.approvals
        said = f"approved ({still.tally()}; waiting for {left} more)"
    return _decided(
        run,
        action,
        waiting.get(action, ""),
        verdict,
        by,
        output,
        said=said,
        pending=None if still is None else still.to_json(),
    )


@app.command("runs")
def runs_command(
    namespace: NamespaceOption = None,
    all_namespaces: AllNamespacesOption = False,
    store: StoreOption = DEFAULT_URL,
    output: ListOutputOption = ListOutput.text,
) -> int:
    """List the runs in the store and where each stands, as `kubectl get` lists things.

    Every namespace unless -n names one (-A: every namespace, whatever -n says). A run with no
    stop yet says whether a process drives it now (in progress) or its process is gone.
    """
    import datetime as dt

    if all_namespaces:
        namespace = None
    stores = _existing(store, read_only=True)
    try:
        loop = Loop(stores=stores)
        listed = [_listed(loop, ref.tenant, ref.run) for ref in stores.checkpoints.runs(namespace)]
        elsewhere = (
            sorted({r.tenant for r in stores.checkpoints.runs()})
            if namespace and not listed
            else []
        )
    finally:
        stores.close()
    if output is ListOutput.text and not listed and namespace:
        # Like kubectl: empty here is not empty everywhere, so say where the runs are.
        there = f" (namespaces with runs: {', '.join(elsewhere)})" if elsewhere else ""
        Console().say(f"no runs in namespace {namespace!r} in this store{there}")
        return 0
    now = dt.datetime.now(dt.UTC)
    header = ["NAME", "PHASE", "REASON", "ITERATION", "AGE"]
    if output is ListOutput.wide:
        header += ["TOKENS", "DOLLARS", "ACTIVE", "WAITING"]
    if namespace is None:
        header.insert(0, "NAMESPACE")
    wide, tenant = output is ListOutput.wide, namespace is None
    rows = [_run_row(run, now, wide=wide, tenant=tenant) for run in listed]
    document = {"runs": [run.to_json() for run in listed]}
    names = [f"agentrun.{GROUP}/{run.outcome.run}" for run in listed]
    if output is ListOutput.json:  # one object on the last line, as every command's
        Console().json(document)
    else:
        emit(output, document, names, header, rows, "no runs in this store")
    return 0


@dataclass(frozen=True)
class _Listed:
    """A run as ``keelgate runs`` lists it: where it stands, its budget, when it started and,
    with no stop yet, whether a process drives it now."""

    outcome: Outcome
    budget: Budget
    started: str | None
    driven: bool | None

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"namespace": self.outcome.tenant, **self.outcome.to_json()}
        document["startedAt"] = self.started
        if self.outcome.phase is RunPhase.RUNNING:
            document["drivenNow"] = self.driven
        return document


def _listed(loop: Loop, tenant: str, run: str) -> _Listed:
    state = loop.state(tenant, run)
    outcome = state.outcome()
    first = next(iter(loop.stores.audit.iter_events(tenant, run, page=1)), None)
    driven = driven_now(loop.stores, tenant, run) if outcome.phase is RunPhase.RUNNING else None
    return _Listed(outcome, state.spec.budget, first.at if first else None, driven)


def _run_row(run: _Listed, now: Any, *, wide: bool, tenant: bool) -> list[str]:
    o = run.outcome
    if o.phase is RunPhase.RUNNING:
        reason = "" if run.driven is None else "in progress" if run.driven else "process gone"
    else:
        reason = o.stop.reason.value
    row = [o.run, o.phase.value, reason, str(o.iteration), age(run.started, now)]
    if wide:
        budget, usage = run.budget, o.usage
        row += [
            against(usage.tokens, budget.tokens),
            against(usage.dollars, budget.dollars),
            against(
                f"{usage.active_seconds:.0f}s",
                None if budget.timeout_seconds is None else f"{budget.timeout_seconds:g}",
            ),
            str(len(o.unknown_actions) + len(o.pending_approvals)),
        ]
    if tenant:
        row.insert(0, o.tenant)
    return row


@app.command("status")
def status_command(
    run: RunArgument,
    namespace: NamespaceOption = None,
    store: StoreOption = DEFAULT_URL,
    output: OutputOption = OutputFormat.text,
) -> int:
    """Show where a run stands, without running it.

    A run with no stop recorded says whether another process drives it now (exit 4: leave it
    be) or none does (exit 3: resume continues it).
    """
    with _opened(store, run, namespace, read_only=True) as (loop, tenant, name):
        outcome = loop.outcome(tenant, name)
        driven = (
            driven_now(loop.stores, tenant, name) if outcome.phase is RunPhase.RUNNING else None
        )
    console = Console()
    if output is OutputFormat.json:
        document = outcome.to_json()
        if outcome.phase is RunPhase.RUNNING:
            document["drivenNow"] = driven
        console.json(document)
    else:
        console.outcome(outcome, driven=driven)
    # Driven elsewhere now: exit 4, the table's "busy in another process".
    return EXIT_BUSY if driven else run_exit_code(outcome)


class Shell(StrEnum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


@app.command("completion")
def completion_command(
    shell: Annotated[Shell, typer.Argument(help="bash, zsh or fish.", show_default=False)],
) -> int:
    """Print the shell completion script: commands, flags, and the store's run names.

    As `kubectl completion`: source it in the shell (see the examples). It asks `keelgate`
    itself for the words, so it stays right as keelgate changes.
    """
    from typer._completion_shared import get_completion_script

    from keelgate.cli import COMPLETE_VAR

    script = get_completion_script(prog_name="keelgate", complete_var=COMPLETE_VAR, shell=shell)
    sys.stdout.write(script.rstrip("\n") + "\n")
    return 0
