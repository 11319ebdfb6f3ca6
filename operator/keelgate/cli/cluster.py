"""``keelgate step`` and ``keelgate operator``: the two programs that run inside a cluster.

``step`` is what a step pod runs: one step of a run from the spec its operator recorded in the
store, then exit with a code the operator reads (0 the step ended and the run goes on, or met
its goal; 3 a resumable stop; 1 a failed stop; 2 bad input; 4 another process drives the run;
5 the store could not be reached), the outcome as one JSON line last on stdout and, where the
kubelet provides one, in the termination message. Its start-up imports neither kopf nor a
Kubernetes client.

``operator`` is the image's entrypoint: the kopf operator (``keelgate.kube.operator``), imported
only when it runs. It refuses a store whose owner liveness works on one host only.
This module must never print a secret (the store URL is shown redacted, if at all).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from keelgate.cli.commands import StoreOption, app
from keelgate.core.types import Outcome, RunPhase
from keelgate.errors import InputError
from keelgate.stores import DEFAULT_URL, check_store_url, redacted

EXIT_CONTINUE = 0
EXIT_FAILED = 1
EXIT_RESUMABLE = 3


def step_exit_code(outcome: Outcome) -> int:
    """0 when the run goes on (or met its goal), 3 for a resumable stop, 1 for a failure."""
    if outcome.phase in (RunPhase.RUNNING, RunPhase.SUCCEEDED):
        return EXIT_CONTINUE
    return EXIT_RESUMABLE if outcome.resumable else EXIT_FAILED


def _load_confirmer(reference: str, url: str = "") -> Any:
    if reference and url:
        raise InputError("--confirmer", "give --confirmer or --confirmer-url, not both")
    if url:
        from keelgate.adapters.confirmers import HttpConfirmer

        return HttpConfirmer(url)
    if not reference:
        return None
    from keelgate.adapters.loading import load_callable

    found = load_callable(reference, field="--confirmer")
    # A confirmer object, or a class / factory making one.
    return found if hasattr(found, "confirm") else found()


@app.command("step")
def step_command(
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="The run's namespace.")],
    run: Annotated[str, typer.Option("--run", help="The run's name.")],
    store: StoreOption = DEFAULT_URL,
    confirmer: Annotated[
        str,
        typer.Option(help="Trusted code asking the system of record: 'pkg.module:object'."),
    ] = "",
    confirmer_url: Annotated[
        str,
        typer.Option(
            "--confirmer-url",
            help="Ask the system of record: GET this URL ({idempotencyKey}, {tool}, {action}, "
            "{run}, {tenant} filled in) answering JSON {executed: true|false}.",
        ),
    ] = "",
    late_call_grace: Annotated[
        float,
        typer.Option(
            "--late-call-grace",
            min=0,
            help="Seconds to wait, before exiting, for a timed-out call still running.",
        ),
    ] = 30.0,
    termination_log: Annotated[
        Path, typer.Option(help="Where the kubelet reads the termination message.")
    ] = Path("/dev/termination-log"),
) -> int:
    """Run one step of a run (one iteration, less if it stops) in a step pod, and exit."""
    from keelgate.runners.step import StepRunner
    from keelgate.stores._holds import wait_for_running_calls

    check_store_url(store)
    sys.path.insert(0, str(Path.cwd()))
    runner = StepRunner(store=store, confirmer=_load_confirmer(confirmer, confirmer_url))
    try:
        # A store that cannot be reached is exit 5, another driver of the run (RunBusy, a lost
        # checkpoint race) exit 4, bad input exit 2: the CLI's one error table.
        outcome = runner.step(namespace, run)
    finally:
        # A call that timed out may still end and be recorded; cut off, it stays unknown.
        wait_for_running_calls(late_call_grace)
    line = json.dumps(outcome.to_json(), sort_keys=True)
    print(line, flush=True)
    if termination_log.is_file() and os.access(termination_log, os.W_OK):
        termination_log.write_text(line[:4096], encoding="utf-8")
    return step_exit_code(outcome)


@app.command("operator")
def operator_command(
    store: StoreOption = "",
    namespace: Annotated[
        list[str] | None,
        typer.Option(
            "--namespace", "-n", help="A namespace to watch (repeat for more; default: all)."
        ),
    ] = None,
    allow_failpoints: Annotated[
        bool,
        typer.Option(
            "--allow-failpoints",
            help="Forward the keelgate.dev/failpoints annotation into step pods (development "
            "clusters only).",
        ),
    ] = False,
    max_step_pods: Annotated[
        int, typer.Option("--max-step-pods", min=1, help="Step pods pending or running at once.")
    ] = 20,
    step_image: Annotated[
        str,
        typer.Option(
            "--step-image",
            envvar="KEELGATE_STEP_IMAGE",
            help="The image of step pods (spec.step.image overrides it per run).",
        ),
    ] = "ghcr.io/keelgate/keelgate:0.1.0",
    step_command: Annotated[
        str,
        typer.Option(
            "--step-command",
            envvar="KEELGATE_STEP_COMMAND",
            help="The program step pods start (the image's keelgate).",
        ),
    ] = "keelgate",
    store_secret: Annotated[
        str,
        typer.Option(
            "--store-secret",
            help="The Secret (in each run's namespace) whose key 'url' step pods read the "
            "store URL from.",
        ),
    ] = "keelgate-store",
    confirmer: Annotated[
        str,
        typer.Option(help="A confirmer step pods use: 'pkg.module:object' in the step image."),
    ] = "",
    confirmer_url: Annotated[
        str,
        typer.Option(
            "--confirmer-url",
            help="An HTTP confirmer step pods ask (see `keelgate step --help`).",
        ),
    ] = "",
    max_crashes: Annotated[
        int,
        typer.Option(
            "--max-crashes",
            min=1,
            help="Step pods in a row that die without recording a stop before the run stalls.",
        ),
    ] = 5,
    port: Annotated[int, typer.Option(help="Port of /metrics and /healthz.")] = 8080,
    bind: Annotated[str, typer.Option(help="Address /metrics and /healthz listen on.")] = "0.0.0.0",
    workers: Annotated[int, typer.Option(min=1, help="Reconciles at once.")] = 4,
    resync: Annotated[float, typer.Option(min=1, help="Seconds between full resyncs.")] = 30.0,
) -> int:
    """Run the Keelgate operator (kopf): AgentRuns become step pods, one per step."""
    if not store:
        raise InputError("--store", "the operator needs a PostgreSQL URL (env KEELGATE_STORE)")
    check_store_url(store)
    _load_confirmer("", confirmer_url)  # a malformed URL is refused here, not in every pod
    if confirmer and confirmer_url:
        raise InputError("--confirmer", "give --confirmer or --confirmer-url, not both")
    if not store.startswith(("postgresql:", "postgres:")):
        raise InputError(
            "--store",
            f"{redacted(store).split(':', 1)[0]}: owner liveness works on one host only; "
            "the operator and its step pods need PostgreSQL (postgresql://...)",
        )
    import asyncio
    import logging

    from keelgate.kube.api import ClusterApi
    from keelgate.kube.controller import ControllerSettings
    from keelgate.kube.operator import Operator, OperatorOptions
    from keelgate.kube.resources import StepPodSettings
    from keelgate.stores import open_stores

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    for noisy in ("kopf", "aiohttp", "kubernetes", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    options = OperatorOptions(
        namespaces=tuple(namespace or ()),
        controller=ControllerSettings(
            pods=StepPodSettings(
                image=step_image,
                command=tuple(step_command.split()),
                store_secret=store_secret,
                confirmer=confirmer,
                confirmer_url=confirmer_url,
            ),
            allow_failpoints=allow_failpoints,
            max_step_pods=max_step_pods,
            max_crashes=max_crashes,
        ),
        port=port,
        bind=bind,
        workers=workers,
        resync_seconds=resync,
    )
    stores = open_stores(store)
    try:
        operator = Operator(options, stores=stores, api=ClusterApi())
        asyncio.run(operator.run())
    finally:
        stores.close()
    return 0
