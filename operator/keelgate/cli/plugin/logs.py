"""``kubectl keelgate logs RUN [-f] [--tail N] [--since D]``: a run's step pods' logs in the order
they ran, each headed by how its pod ended; with ``-f``, then the run as it goes on, one step pod
after another, until it is at rest.

Why it exists apart from ``kubectl logs``: a run is many pods (a step each, an attempt each),
and which one ran when, and how it ended, is the run's story. This module only reads, through
the API server as the kubeconfig's user; it must never print a Secret (step logs hold none of
Keelgate's; a tool of yours that prints its arguments prints them into its pod's log).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from keelgate.cli.commands import OutputFormat, OutputOption
from keelgate.cli.plugin import view
from keelgate.cli.plugin.client import NotFound, PluginApi, Refused
from keelgate.cli.plugin.commands import (
    ContextOption,
    KubeconfigOption,
    NamespaceOption,
    _api,
    app,
    duration,
)
from keelgate.cli.render import Console
from keelgate.errors import InputError, KeelgateError


@app.command("logs")
def logs_command(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(help="The AgentRun's name.")],
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    namespace: NamespaceOption = None,
    output: OutputOption = OutputFormat.text,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Then stream the run's step pods as they run, each new one in turn, until the "
            "run is at rest.",
        ),
    ] = False,
    tail: Annotated[
        int,
        typer.Option("--tail", help="Only the last N lines of each pod's log (-1: all)."),
    ] = -1,
    since: Annotated[
        str | None,
        typer.Option("--since", help="Only lines newer than this: 30s, 5m, 2h."),
    ] = None,
) -> int:
    """The step pods' logs in the order they ran, each headed by how its pod ended.

    Ordered by step, then attempt; read through the API server (pods/log). With -f, then
    follows the run: the running pod's log as it is written, and each next step pod's.
    """
    if tail < -1:
        raise InputError("--tail", "must be -1 (all) or a number of lines")
    since_seconds = duration("--since", since) if since is not None else None
    if follow and output is OutputFormat.json:
        raise InputError("--follow", "streams text: not with -o json")
    limit = None if tail == -1 else tail
    api = _api(ctx, kubeconfig, context, namespace)
    pods = view.in_order(api.step_pods(run))
    if not pods:
        api.agentrun(run)  # no such run says so (exit 2)
    console = Console()
    unreadable: list[str] = []
    shown: list[dict[str, Any]] = []
    for pod in pods:
        name = str(pod["metadata"]["name"])
        step, attempt = view.step_and_attempt(pod)
        ended, code = view.pod_end(pod)
        lines: list[str] = []
        trouble = ""
        if follow and not view.pod_finished(pod):
            continue  # followed below, from its start
        if (pod.get("status") or {}).get("containerStatuses"):
            try:
                lines = view.log_lines(api.pod_log(name, tail=limit, since=since_seconds))
            except (Refused, NotFound) as error:
                trouble = str(error)
                unreadable.append(name)
        else:
            trouble = "no log: its container never started"
        shown.append(
            {
                "pod": name,
                "step": step,
                "attempt": attempt,
                "ended": ended,
                "exitCode": code,
                "log": lines,
                **({"error": trouble} if trouble else {}),
            }
        )
        if output is OutputFormat.text:
            console.say(f"==> {name} (step {step}, attempt {attempt}): {ended}", style="bold")
            for line in lines:
                console.out.print(line, markup=False, highlight=False)
            if trouble:
                console.say(f"    ({trouble})", style="dim")
    if output is OutputFormat.json:
        console.json({"run": run, "pods": shown})
    elif not pods and not follow:
        console.say(f"{run} has no step pods (yet)")
    if follow:
        _follow(
            api,
            run,
            {str(p["metadata"]["name"]) for p in pods if view.pod_finished(p)},
            limit,
            console,
        )
    if unreadable:
        raise KeelgateError(f"could not read the log of {', '.join(unreadable)}")
    return 0


#: How often `logs -f` looks for the run's next step pod.
FOLLOW_POLL = 1.0


def _follow(api: PluginApi, run: str, done: set[str], tail: int | None, console: Console) -> None:
    """Stream each step pod of ``run`` not yet shown, in order, as it runs; stop once the run
    is at rest (no pod running and its phase Succeeded, Failed or Stopped)."""
    while True:
        fresh = [
            p for p in view.in_order(api.step_pods(run)) if str(p["metadata"]["name"]) not in done
        ]
        started = [p for p in fresh if (p.get("status") or {}).get("containerStatuses")]
        if started:
            pod = started[0]
            name = str(pod["metadata"]["name"])
            step, attempt = view.step_and_attempt(pod)
            console.say(f"==> {name} (step {step}, attempt {attempt}): following", style="bold")
            for line in api.follow_log(name, tail=tail):
                console.out.print(line, markup=False, highlight=False)
            finished = api.pod(name) or pod
            ended, _ = view.pod_end(finished)
            console.say(f"<== {name}: {ended}", style="dim")
            done.add(name)
            continue
        if not fresh:
            phase = str((api.agentrun(run).get("status") or {}).get("phase") or "")
            if phase in ("Succeeded", "Failed", "Stopped"):
                console.say(f"{run} is {phase}: nothing more to follow", style="dim")
                return
        time.sleep(FOLLOW_POLL)
