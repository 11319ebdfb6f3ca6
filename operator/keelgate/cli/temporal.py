"""``keelgate temporal-worker`` and ``keelgate temporal ...``: runs driven through Temporal.

The worker (``temporal-worker``) polls a task queue and runs Keelgate's workflow and activities
against its store. The client commands (``temporal run|resume|reconcile|approve|status``) speak
to the run's workflow and never open a store: a decision is carried out by a worker, through the
same ``Loop`` calls as ``keelgate reconcile`` and ``keelgate approve``. They print and exit as
their local twins do (0 goal met, 3 resumable stop, 1 failed, 2 bad input, 4 busy, 5 the
Temporal server or the worker's store cannot be reached).

The Temporal SDK is an extra: this module must never import it at import time, so ``keelgate``
without it works, and a Temporal command without it says in one line which extra to install.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

import typer

from keelgate.cli.commands import (
    DollarsOption,
    MaxIterationsOption,
    MaxVerifierRejectionsOption,
    OutputFormat,
    OutputOption,
    PricingOption,
    StoreOption,
    TimeoutOption,
    TokensOption,
    _decimal,
    _decision,
    _python_path,
    _show,
    _usable,
    app,
    read_manifest,
)
from keelgate.cli.help import App
from keelgate.cli.render import Console
from keelgate.core.approvals import check_groups
from keelgate.core.loop import check_actor
from keelgate.errors import InputError, MissingExtra
from keelgate.stores import DEFAULT_URL, redacted

#: How a run driven through Temporal is continued (shown in the hints under an outcome).
COMMAND = "keelgate temporal"

temporal_app = App(
    name="temporal",
    help="Drive runs through Temporal workflows (extra keelgate[temporal]); workers run them "
    "with `keelgate temporal-worker`.",
)
app.add_typer(temporal_app, name="temporal")

AddressOption = Annotated[
    str,
    typer.Option(
        "--address",
        envvar="TEMPORAL_ADDRESS",
        help="The Temporal server, HOST:PORT (env TEMPORAL_ADDRESS).",
    ),
]
TemporalNamespaceOption = Annotated[
    str,
    typer.Option(
        "--temporal-namespace",
        envvar="TEMPORAL_NAMESPACE",
        help="The Temporal namespace (env TEMPORAL_NAMESPACE); not the run's.",
    ),
]
NamespaceOption = Annotated[
    str, typer.Option("--namespace", "-n", help="The run's namespace (tenant).")
]
DEFAULT_ADDRESS = "localhost:7233"


def _sdk(command: str) -> ModuleType:
    """``keelgate.runners.temporal``, or one line saying which extra to install."""
    try:
        from keelgate.runners import temporal
    except ModuleNotFoundError as error:
        raise MissingExtra.of(error, field=command) or error from None
    return temporal


def _runner(
    command: str,
    address: str,
    temporal_namespace: str,
    *,
    task_queue: str = "",
    pricing: Path | None = None,
    settings: Any = None,
) -> Any:
    from keelgate.manifest import load_pricing

    module = _sdk(command)
    return module.TemporalRunner(
        address=address,
        task_queue=task_queue,
        namespace=temporal_namespace,
        pricing=None if pricing is None else load_pricing(pricing),
        settings=settings,
    )


@app.command("temporal-worker")
def worker_command(
    task_queue: Annotated[str, typer.Option("--task-queue", help="The task queue to poll.")],
    address: AddressOption = DEFAULT_ADDRESS,
    store: StoreOption = DEFAULT_URL,
    temporal_namespace: TemporalNamespaceOption = "default",
    confirmer: Annotated[
        str, typer.Option(help="Trusted code asking the system of record: 'pkg.module:object'.")
    ] = "",
    confirmer_url: Annotated[
        str,
        typer.Option(
            "--confirmer-url", help="An HTTP confirmer to ask (see `keelgate step --help`)."
        ),
    ] = "",
    max_concurrent: Annotated[
        int, typer.Option("--max-concurrent", min=1, help="Activities (drives) at once.")
    ] = 8,
    late_call_grace: Annotated[
        float,
        typer.Option(
            "--late-call-grace",
            min=0,
            help="Seconds to wait, on exit, for a timed-out call still running (default 30).",
        ),
    ] = 30.0,
) -> int:
    """A Temporal worker: runs Keelgate's workflow and its loops as activities on --store."""
    import logging

    from keelgate.cli.step import load_confirmer
    from keelgate.core.redaction import log_to_stderr
    from keelgate.stores._holds import wait_for_running_calls

    module = _sdk("keelgate temporal-worker")
    # A long-running process: its log lines need times, as the operator's do. An attempt that
    # ends in a Keelgate error (a busy run, a failed stop) is logged by the SDK as a warning.
    log_to_stderr(logging.INFO, "%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    if not task_queue.strip():
        raise InputError("--task-queue", "name the task queue to poll")
    _usable(store)
    _python_path()
    found = load_confirmer(confirmer, confirmer_url)
    console = Console()

    def ready() -> None:
        console.err.print(
            f"keelgate temporal-worker: polling {task_queue} at {address} "
            f"(namespace {temporal_namespace}, store {redacted(store)})"
        )

    try:
        module.serve_forever(
            address=address,
            task_queue=task_queue,
            store=store,
            namespace=temporal_namespace,
            confirmer=found,
            max_concurrent=max_concurrent,
            ready=ready,
        )
    finally:
        # A call that timed out may still end and be recorded; cut off, it stays unknown.
        wait_for_running_calls(late_call_grace)
    return 0


@temporal_app.command("run")
def run_command(
    file: Annotated[
        Path,
        typer.Option("--file", "-f", metavar="FILE", help="AgentRun manifest (YAML; '-': stdin)."),
    ],
    task_queue: Annotated[
        str, typer.Option("--task-queue", help="The task queue its workers poll.")
    ],
    address: AddressOption = DEFAULT_ADDRESS,
    temporal_namespace: TemporalNamespaceOption = "default",
    heartbeat_timeout: Annotated[
        float,
        typer.Option(
            "--heartbeat-timeout",
            min=0.5,
            help="Seconds without a heartbeat before a worker is taken as dead and its drive "
            "retried elsewhere.",
        ),
    ] = 5.0,
    max_attempts: Annotated[
        int,
        typer.Option(
            "--max-attempts", min=1, help="Attempts of one drive before the workflow waits."
        ),
    ] = 10,
    pricing: PricingOption = None,
    output: OutputOption = OutputFormat.text,
) -> int:
    """Start the run's workflow (or find the one driving it) and show the run's next stop."""
    agentrun, folder = read_manifest(file)
    spec = replace(agentrun.to_loop_spec(), source_dir=str(folder))
    _python_path(folder)
    module = _sdk("keelgate temporal run")
    settings = module.Settings(heartbeat_timeout=heartbeat_timeout, max_attempts=max_attempts)
    runner = _runner(
        "keelgate temporal run",
        address,
        temporal_namespace,
        task_queue=task_queue,
        pricing=pricing,
        settings=settings,
    )
    return _shown(runner.run(spec), output)


@temporal_app.command("resume")
def resume_command(
    run: Annotated[str, typer.Argument(help="The run's name.")],
    tokens: TokensOption = None,
    dollars: DollarsOption = None,
    max_iterations: MaxIterationsOption = None,
    timeout: TimeoutOption = None,
    max_verifier_rejections: MaxVerifierRejectionsOption = None,
    namespace: NamespaceOption = "default",
    address: AddressOption = DEFAULT_ADDRESS,
    temporal_namespace: TemporalNamespaceOption = "default",
    pricing: PricingOption = None,
    output: OutputOption = OutputFormat.text,
) -> int:
    """Raise the named budgets to new totals (as `keelgate resume`), continue, show the stop."""
    total = _decimal("--dollars", dollars)
    runner = _runner("keelgate temporal resume", address, temporal_namespace, pricing=pricing)
    module = _sdk("keelgate temporal resume")
    done = runner.resume(
        namespace,
        run,
        tokens=tokens,
        dollars=total,
        max_iterations=max_iterations,
        timeout_seconds=timeout,
        max_verifier_rejections=max_verifier_rejections,
    )
    for warning in done.get("warnings") or ():
        Console().warn(warning)
    stopped = runner.wait(module.workflow_id(namespace, run), after=int(done["stops"]))
    return _shown(module.stop_outcome(stopped), output)


def _shown(outcome: Any, output: OutputFormat) -> int:
    """``_show`` with hints for this group: a run is found by its namespace, not a store."""
    scope = "" if outcome.tenant == "default" else f" -n {outcome.tenant}"
    return _show(outcome, output, command=COMMAND, scope=scope)


@temporal_app.command("reconcile")
def reconcile_command(
    run: Annotated[str, typer.Argument(help="The run's name.")],
    action: Annotated[str, typer.Argument(help="The action's id, e.g. 3:0.")],
    by: Annotated[str, typer.Option("--by", help="Who decides (recorded in the audit chain).")],
    did: Annotated[
        bool, typer.Option("--executed", help="It took effect: record it as done.")
    ] = False,
    did_not: Annotated[
        bool, typer.Option("--not-executed", help="It did not: abandon it, never retried.")
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="Then wait for the run's next stop and show it.")
    ] = False,
    namespace: NamespaceOption = "default",
    address: AddressOption = DEFAULT_ADDRESS,
    temporal_namespace: TemporalNamespaceOption = "default",
    output: OutputOption = OutputFormat.text,
) -> int:
    """Settle an unknown outcome; the workflow then continues the run."""
    executed = _decision(did, did_not, "--executed", "--not-executed", "whether it took effect")
    check_actor(by, field="--by")
    runner = _runner("keelgate temporal reconcile", address, temporal_namespace)
    done = runner.reconcile(namespace, run, action, executed=executed, by=by)
    return _decided(runner, namespace, done, wait=wait, output=output)


@temporal_app.command("approve")
def approve_command(
    run: Annotated[str, typer.Argument(help="The run's name.")],
    action: Annotated[str, typer.Argument(help="The action's id, e.g. 2:0.")],
    by: Annotated[str, typer.Option("--by", help="Who decides (recorded in the audit chain).")],
    yes: Annotated[bool, typer.Option("--approve", help="Let the action run.")] = False,
    no: Annotated[bool, typer.Option("--deny", help="Never run it; the model is told.")] = False,
    groups: Annotated[
        list[str] | None,
        typer.Option("--group", help="A group the person deciding is in (repeat for each)."),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Then wait for the run's next stop and show it.")
    ] = False,
    namespace: NamespaceOption = "default",
    address: AddressOption = DEFAULT_ADDRESS,
    temporal_namespace: TemporalNamespaceOption = "default",
    output: OutputOption = OutputFormat.text,
) -> int:
    """Approve or deny an action awaiting approval; the workflow then continues the run (once
    the tool's rule has its approvals)."""
    approve = _decision(yes, no, "--approve", "--deny", "whether the action may run")
    check_actor(by, field="--by")
    named = check_groups(groups or (), field="--group")
    runner = _runner("keelgate temporal approve", address, temporal_namespace)
    done = runner.approve(namespace, run, action, approved=approve, by=by, groups=named)
    return _decided(runner, namespace, done, wait=wait, output=output)


def _decided(
    runner: Any, namespace: str, done: dict[str, Any], *, wait: bool, output: OutputFormat
) -> int:
    module = _sdk(COMMAND)
    run = str(done["run"])
    if wait:
        stopped = runner.wait(module.workflow_id(namespace, run), after=int(done["stops"]))
        return _shown(module.stop_outcome(stopped), output)
    console = Console()
    fields = {k: done[k] for k in ("run", "action", "tool", "verdict", "by")}
    if output is OutputFormat.json:
        console.json(fields)
        return 0
    console.say(
        f"{run} {done['action']} ({done['tool']}): {done['verdict']} by {done['by']}",
        style="green",
    )
    console.say(
        f"  the workflow continues the run; where it stands: {COMMAND} status {run}"
        + ("" if namespace == "default" else f" -n {namespace}"),
        style="dim",
    )
    return 0


@temporal_app.command("status")
def status_command(
    run: Annotated[str, typer.Argument(help="The run's name.")],
    namespace: NamespaceOption = "default",
    address: AddressOption = DEFAULT_ADDRESS,
    temporal_namespace: TemporalNamespaceOption = "default",
    output: OutputOption = OutputFormat.text,
) -> int:
    """Show where a run driven through Temporal stands, without waiting."""
    runner = _runner("keelgate temporal status", address, temporal_namespace)
    stopped = runner.status(namespace, run)
    if stopped.error is not None:
        Console().warn(
            f"its last drive was given up: {stopped.error}; `{COMMAND} resume {run}` tries again"
        )
    if stopped.outcome is None:  # its first drive is under way
        if output is OutputFormat.json:
            Console().json({"run": run, "phase": "Running", "stopReason": ""})
        else:
            Console().say(f"{run}  Running  (no stop yet)")
        return 0
    return _shown(stopped.outcome, output)


__all__ = ["COMMAND", "temporal_app"]
