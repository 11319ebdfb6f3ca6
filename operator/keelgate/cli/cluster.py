"""``keelgate step`` and ``keelgate operator``: the two programs that run inside a cluster.

``step`` is what a step pod runs (``keelgate.cli.step``, which parses its own options on a
start-up path of its own; ``keelgate step`` normally reaches it without loading this module).

``operator`` is the image's entrypoint: the kopf operator (``keelgate.kube.runtime.operator``),
imported only when it runs. It refuses a store whose owner liveness works on one host only.
This module must never print a secret (the store URL is shown redacted, if at all).
"""

from __future__ import annotations

from typing import Annotated

import typer

from keelgate.cli import step
from keelgate.cli.commands import StoreOption, app
from keelgate.errors import InputError
from keelgate.stores import check_store_url, redacted


@app.command(
    "step",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
    help=step.DESCRIPTION + " (keelgate step --help: its options)",
)
def step_command(ctx: typer.Context) -> int:
    """A step pod's program; it parses its own options (``keelgate.cli.step``)."""
    return step.main(ctx.args)


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
    step.load_confirmer("", confirmer_url)  # a malformed URL is refused here, not in every pod
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
    from keelgate.kube.controller.context import ControllerSettings
    from keelgate.kube.resources import StepPodSettings
    from keelgate.kube.runtime.operator import Operator, OperatorOptions
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
