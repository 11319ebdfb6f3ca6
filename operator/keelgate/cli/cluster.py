"""``keelgate step`` and ``keelgate operator``: the two programs that run inside a cluster.

``step`` is what a step pod runs (``keelgate.cli.step``, which parses its own options on a
start-up path of its own; ``keelgate step`` normally reaches it without loading this module).

``operator`` is the image's entrypoint: the kopf operator (``keelgate.kube.runtime.operator``),
imported only when it runs. It refuses a store whose owner liveness works on one host only.
This module must never print a secret (the store URL is shown redacted, if at all).

Why one module past 500 lines: it is the operator command's thirty-odd options (each
option's help is part of the contract a user reads in ``--help``), their checks, and their
turning into the settings the operator runs with (its store, pod defaults, signer, notifier,
Lease); what runs lives in ``keelgate.cli.step`` and ``keelgate.kube.runtime``. Split, one
command's declarations and their meaning would sit in two places.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from keelgate.cli import step
from keelgate.cli.commands import StoreOption, app
from keelgate.errors import InputError, MissingExtra
from keelgate.stores import StoreUrl, read_store_url

if TYPE_CHECKING:
    from keelgate.kube.api import ClusterApi
    from keelgate.kube.runtime.leadership import LeaseSettings
    from keelgate.kube.runtime.operator import OperatorOptions
    from keelgate.manifest.notifications import NotifySettings
    from keelgate.manifest.step_defaults import StepPodDefaults

T = TypeVar("T")


@app.command(
    "step",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
    help=step.DESCRIPTION + " (keelgate step --help: its options)",
)
def step_command(ctx: typer.Context) -> int:
    """A step pod's program; it parses its own options (``keelgate.cli.step``)."""
    return step.main(ctx.args)


# The options of `keelgate operator` (the chart sets them; docs/operator.md).
WatchNamespacesOption = Annotated[
    list[str] | None,
    typer.Option("--namespace", "-n", help="A namespace to watch (repeat for more; default: all)."),
]
AllowFailpointsOption = Annotated[
    bool,
    typer.Option(
        "--allow-failpoints",
        help="Forward the keelgate.dev/failpoints annotation into step pods (development "
        "clusters only).",
    ),
]
MaxStepPodsOption = Annotated[
    int, typer.Option("--max-step-pods", min=1, help="Step pods pending or running at once.")
]
StepImageOption = Annotated[
    str,
    typer.Option(
        "--step-image",
        envvar="KEELGATE_STEP_IMAGE",
        help="The image of step pods (spec.step.image overrides it per run).",
    ),
]
StepCommandOption = Annotated[
    str,
    typer.Option(
        "--step-command",
        envvar="KEELGATE_STEP_COMMAND",
        help="The program step pods start (the image's keelgate).",
    ),
]
StoreSecretOption = Annotated[
    str,
    typer.Option(
        "--store-secret",
        help="The Secret (in each run's namespace) whose key 'url' step pods read the "
        "store URL from.",
    ),
]
ConfirmerOption = Annotated[
    str,
    typer.Option(help="A confirmer step pods use: 'pkg.module:object' in the step image."),
]
ConfirmerUrlOption = Annotated[
    str,
    typer.Option(
        "--confirmer-url",
        help="An HTTP confirmer step pods ask (see `keelgate step --help`).",
    ),
]
StepPodDefaultsOption = Annotated[
    str,
    typer.Option(
        "--step-pod-defaults",
        envvar="KEELGATE_STEP_POD_DEFAULTS",
        help="A YAML file of the platform's settings for every step pod: resources, "
        "priorityClassName, runtimeClassName, imagePullSecrets, nodeSelector, tolerations, "
        "keepFinishedPods, maxActiveSeconds (docs/operator.md).",
    ),
]
AuditSignKeyOption = Annotated[
    str,
    typer.Option(
        "--audit-sign-key",
        envvar="KEELGATE_AUDIT_SIGN_KEY",
        help="A PEM private key (Ed25519 or ECDSA P-256): sign each stopped run's audit "
        "chain head with it (docs/audit.md).",
    ),
]
NotifyConfigOption = Annotated[
    str,
    typer.Option(
        "--notify-config",
        envvar="KEELGATE_NOTIFY_CONFIG",
        help="A YAML file of the sinks the operator sends CloudEvents to (the chart's "
        "notifications values; docs/notifications.md).",
    ),
]
NotifySinkOption = Annotated[
    list[str] | None,
    typer.Option(
        "--notify-sink",
        help="A URL to POST every CloudEvent to (repeat for more; structured mode, the "
        "defaults of docs/notifications.md).",
    ),
]
NotifySourceOption = Annotated[
    str,
    typer.Option(
        "--notify-source",
        help="The operator's name at the head of each event's source (default: the "
        "--notify-config's, else 'keelgate').",
    ),
]
NotifyStateOption = Annotated[
    str,
    typer.Option(
        "--notify-state",
        help="NAMESPACE/NAME of the ConfigMap that keeps how far events are delivered, so "
        "that a restart or a new leader sends again what was not (default: the "
        "--notify-config's, else none).",
    ),
]
MaxCrashesOption = Annotated[
    int,
    typer.Option(
        "--max-crashes",
        min=1,
        help="Step pods in a row that die without recording a stop before the run stalls.",
    ),
]
StepEventsOption = Annotated[
    str,
    typer.Option(
        "--step-events",
        help="Which step starts an Event tells: 'notable' (a run's first step, a retry, "
        "failpoints armed; the status tells the rest) or 'every'.",
    ),
]
KubeQpsOption = Annotated[
    float,
    typer.Option(
        "--kube-qps",
        min=0,
        help="The operator's API requests a second, sustained (0: no limit).",
    ),
]
KubeBurstOption = Annotated[
    int,
    typer.Option("--kube-burst", min=1, help="API requests at once beyond --kube-qps."),
]
PortOption = Annotated[int, typer.Option(help="Port of /metrics and /healthz.")]
BindOption = Annotated[str, typer.Option(help="Address /metrics and /healthz listen on.")]
WorkersOption = Annotated[int, typer.Option(min=1, help="Reconciles at once.")]
ResyncOption = Annotated[float, typer.Option(min=1, help="Seconds between full resyncs.")]
TenantSessionsOption = Annotated[
    int,
    typer.Option(
        "--tenant-sessions",
        min=1,
        help="Sessions kept open on tenants' own databases (one each) beyond those in use; "
        "each closes after a minute unused (docs/stores.md).",
    ),
]
LeaderElectOption = Annotated[
    bool,
    typer.Option(
        "--leader-elect/--no-leader-elect",
        help="Take part in leader election (a Lease): only the leader drives runs, the "
        "other replicas stand by.",
    ),
]
LeaseNameOption = Annotated[str, typer.Option("--lease-name", help="The Lease's name.")]
LeaseNamespaceOption = Annotated[
    str,
    typer.Option(
        "--lease-namespace",
        envvar="POD_NAMESPACE",
        help="The Lease's namespace (default: the pod's own).",
    ),
]
IdentityOption = Annotated[
    str,
    typer.Option(
        "--identity", envvar="POD_NAME", help="This replica's name in the Lease (its pod's)."
    ),
]
LeaseDurationOption = Annotated[
    int, typer.Option("--lease-duration", help="Seconds a standby waits for a silent leader.")
]
LeaseRenewOption = Annotated[
    int,
    typer.Option("--lease-renew", help="Seconds a leader tries to renew before it stops."),
]
LeaseRetryOption = Annotated[
    int, typer.Option("--lease-retry", help="Seconds between tries to take or renew.")
]

ShardsOption = Annotated[
    int,
    typer.Option(
        "--shards",
        help="Share the runs out between the operator's replicas in this many shards (1-100), "
        "each driven by the replica holding its Lease (<lease-name>-shard-NN, with the "
        "--lease-* timings); 0: not sharded (with --leader-elect, one replica leads).",
    ),
]
RunLeaseOption = Annotated[
    float,
    typer.Option(
        "--run-lease",
        min=0.0,
        help="Seconds a run this operator takes in the store stays its own without a renewal: "
        "another operator (a standby cluster's, a new leader) may drive it only after that; "
        "0: take no run (every run written without an epoch, as before run ownership).",
    ),
]
ClusterOption = Annotated[
    str,
    typer.Option(
        "--cluster",
        envvar="KEELGATE_CLUSTER",
        help="This cluster's name (a DNS label), part of this operator's name as a holder of "
        "runs in the store: operators of two clusters sharing one store tell each other's "
        "runs (shown Standby here) from their own replicas'. Name each cluster apart.",
    ),
]
RunLeaseRenewOption = Annotated[
    float,
    typer.Option(
        "--run-lease-renew",
        min=0.1,
        help="Seconds between the renewals of every held run's lease (one statement for all "
        "of them); less than --run-lease.",
    ),
]


@app.command("operator")
def operator_command(
    store: StoreOption = "",
    namespace: WatchNamespacesOption = None,
    allow_failpoints: AllowFailpointsOption = False,
    max_step_pods: MaxStepPodsOption = 20,
    step_image: StepImageOption = "ghcr.io/keelgate/keelgate:0.1.0",
    step_command: StepCommandOption = "keelgate",
    store_secret: StoreSecretOption = "keelgate-store",
    confirmer: ConfirmerOption = "",
    confirmer_url: ConfirmerUrlOption = "",
    step_pod_defaults: StepPodDefaultsOption = "",
    audit_sign_key: AuditSignKeyOption = "",
    notify_config: NotifyConfigOption = "",
    notify_sink: NotifySinkOption = None,
    notify_source: NotifySourceOption = "",
    notify_state: NotifyStateOption = "",
    max_crashes: MaxCrashesOption = 5,
    step_events: StepEventsOption = "notable",
    kube_qps: KubeQpsOption = 50.0,
    kube_burst: KubeBurstOption = 100,
    port: PortOption = 8080,
    bind: BindOption = "0.0.0.0",
    workers: WorkersOption = 4,
    resync: ResyncOption = 30.0,
    tenant_sessions: TenantSessionsOption = 20,
    leader_elect: LeaderElectOption = False,
    lease_name: LeaseNameOption = "keelgate-operator",
    lease_namespace: LeaseNamespaceOption = "",
    identity: IdentityOption = "",
    lease_duration: LeaseDurationOption = 15,
    lease_renew: LeaseRenewOption = 10,
    lease_retry: LeaseRetryOption = 2,
    run_lease: RunLeaseOption = 30.0,
    run_lease_renew: RunLeaseRenewOption = 10.0,
    shards: ShardsOption = 0,
    cluster: ClusterOption = "default",
) -> int:
    """Run the Keelgate operator (kopf): AgentRuns become step pods, one per step."""
    read = _operator_store(
        store, confirmer=confirmer, confirmer_url=confirmer_url, step_events=step_events
    )
    import os

    from keelgate.kube.controller.context import ControllerSettings
    from keelgate.kube.resources import StepPodSettings

    try:
        from keelgate.kube.runtime.operator import OperatorOptions
    except ModuleNotFoundError as error:
        raise MissingExtra.of(error, field="operator") or error from None

    defaults = _step_pod_defaults(step_pod_defaults)
    sign_head = _head_signer(audit_sign_key) if audit_sign_key else None
    notify = _notify_settings(notify_config, notify_sink or [], notify_source, notify_state)
    lease, holder = _lease_and_holder(
        shards,
        leader_elect=leader_elect,
        lease=(lease_name, lease_namespace, identity),
        timings=(lease_duration, lease_renew, lease_retry),
        run_lease=(run_lease, run_lease_renew),
        cluster=cluster,
    )
    _log_to_stderr()
    options = _options(
        OperatorOptions,
        namespaces=tuple(namespace or ()),
        controller=ControllerSettings(
            pods=StepPodSettings(
                image=step_image,
                command=tuple(step_command.split()),
                store_secret=store_secret,
                confirmer=confirmer,
                confirmer_url=confirmer_url,
                trace_env=_trace_env(os.environ),
                defaults=defaults,
            ),
            allow_failpoints=allow_failpoints,
            max_step_pods=max_step_pods,
            max_crashes=max_crashes,
            sign_head=sign_head,
            every_step_event=step_events == "every",
            holder=holder,
            run_lease=run_lease,
        ),
        port=port,
        bind=bind,
        workers=workers,
        resync_seconds=resync,
        lease=lease,
        notify=notify,
        run_lease_renew=run_lease_renew,
        shards=shards,
    )
    code = _run_operator(
        options, read, tenant_sessions=tenant_sessions, qps=kube_qps, burst=kube_burst
    )
    if code:
        print("keelgate operator: lost the leader's lease; exiting so that a standby leads")
    return code


def _lease_and_holder(
    shards: int,
    *,
    leader_elect: bool,
    lease: tuple[str, str, str],
    timings: tuple[int, int, int],
    run_lease: tuple[float, float],
    cluster: str = "default",
) -> tuple[LeaseSettings | None, str]:
    """The Lease settings (of --leader-elect, or of the shard Leases with --shards) and this
    process's name as a holder of runs in the store (empty with --run-lease 0); sharded, one
    name for both: a run held elsewhere names the replica holding its shard."""
    import dataclasses

    if shards < 0:
        raise InputError("--shards", f"{shards}: give a number of shards (1-100), or 0: off")
    settings = _lease(*lease, timings) if leader_elect or shards else None
    duration, renew = run_lease
    if duration and not duration > renew:
        raise InputError("--run-lease", "must be longer than --run-lease-renew (or 0: off)")
    holder = _holder(lease[2], cluster=cluster) if duration else ""
    if shards and settings is not None and holder:
        settings = dataclasses.replace(settings, identity=holder)
    return settings, holder


def _options(make: Callable[..., T], **options: Any) -> T:
    """The operator's options, a combination they refuse told in one line naming the option
    (``--shards needs ...``)."""
    try:
        return make(**options)
    except ValueError as error:
        field, _, message = str(error).partition(" ")
        raise InputError(field.rstrip(":"), message) from None


def _holder(identity: str, *, cluster: str) -> str:
    """Who this operator process is in the store's run ownership: --identity (POD_NAME), else
    the host's name (a pod's hostname is its name), a mark of this process, and its cluster
    (--cluster). Two processes never share a holder (two operators started by mistake on one
    host, a container restarted while its earlier process still runs): one holder is one
    driver, or the fence between them is gone. A restarted process is another holder, and takes
    its earlier life's runs after their leases (a clean stop lets the runs no step pod drives go
    at once)."""
    import socket

    from keelgate.kube.controller.ownership import CLUSTER_NAME, holder_name

    if not CLUSTER_NAME.match(cluster):
        raise InputError(
            "--cluster", f"{cluster!r}: a DNS label (lower-case letters, digits, '-'; 1-63)"
        )
    return holder_name(identity or socket.gethostname(), cluster=cluster)


def _operator_store(
    store: str, *, confirmer: str, confirmer_url: str, step_events: str
) -> StoreUrl:
    """The store URL, read once (the operator's stores open from it), after the options the
    operator can refuse before it starts: a malformed confirmer URL is refused here, not in
    every step pod, and a store whose owner liveness works on one host only is refused."""
    if step_events not in ("notable", "every"):
        raise InputError("--step-events", f"{step_events!r}: give 'notable' or 'every'")
    if not store:
        raise InputError("--store", "the operator needs a PostgreSQL URL (env KEELGATE_STORE)")
    read = read_store_url(store)
    step.load_confirmer("", confirmer_url)
    if confirmer and confirmer_url:
        raise InputError("--confirmer", "give --confirmer or --confirmer-url, not both")
    if not read.postgres:
        raise InputError(
            "--store",
            f"{read.scheme}: owner liveness works on one host only; "
            "the operator and its step pods need PostgreSQL (postgresql://...)",
        )
    return read


def _step_pod_defaults(path: str) -> StepPodDefaults:
    """The platform's settings for every step pod (--step-pod-defaults; none: the built-in
    ones), a wrong one refused in one line naming the option."""
    from keelgate.manifest.step_defaults import StepPodDefaults, load_step_pod_defaults

    try:
        return load_step_pod_defaults(path) if path else StepPodDefaults()
    except InputError as error:
        raise InputError("--step-pod-defaults", str(error)) from None


def _head_signer(path: str) -> Callable[[bytes], Mapping[str, Any]]:
    """What signs each stopped run's audit chain head: the private key of --audit-sign-key,
    read and checked now (a key that cannot sign is refused at start, not at a run's end)."""
    from functools import partial

    from keelgate.adapters.signing import load_private_key, read_key_file, sign_envelope

    key = load_private_key(read_key_file(path, "--audit-sign-key"), field="--audit-sign-key")
    return partial(sign_envelope, key=key)


def _log_to_stderr() -> None:
    """The operator's log on stderr at INFO, but for the libraries that would drown it."""
    import logging

    from keelgate.core.redaction import log_to_stderr

    log_to_stderr(logging.INFO, "%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    # leaderelection: a standby would log every try (every 2 s) at INFO.
    for noisy in ("kopf", "aiohttp", "kubernetes", "urllib3", "leaderelection"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _run_operator(
    options: OperatorOptions, read: StoreUrl, *, tenant_sessions: int, qps: float, burst: int
) -> int:
    """Run the operator until it stops (its exit code: non-zero when it lost the leader's
    lease), with its client of the API server, its stores and its tracer, which it closes."""
    import asyncio

    from keelgate.adapters.tracing import configured, missing_extra, unavailable
    from keelgate.kube.api import ClusterApi, RateLimit
    from keelgate.kube.runtime.operator import Operator
    from keelgate.stores import open_stores

    api = _cluster_api(lambda: ClusterApi(limit=RateLimit(qps, burst)))
    stores = open_stores(read, tenant_sessions=tenant_sessions)
    tracer = configured(service="keelgate-operator")  # the OTEL_* variables, if any
    missing = missing_extra()
    if missing is not None:  # configured said so in the log; the operator's pod tells it too
        _tell_own_pod(api, "TracingUnavailable", unavailable(missing))
    try:
        operator = Operator(options, stores=stores, api=api, tracer=tracer)
        code = asyncio.run(operator.run())
    finally:
        stores.close()
        tracer.close()
    return code


def _notify_settings(
    config: str, urls: list[str], source: str, state: str
) -> NotifySettings | None:
    """The sinks of --notify-config and --notify-sink (None: no sinks), checked now: a wrong
    field, event type or headers folder is one line at start, not an event lost later."""
    from keelgate.kube.runtime.sinks import read_headers
    from keelgate.manifest.notifications import (
        NotifySettings,
        load_notify_settings,
        sink_from_url,
    )

    settings = load_notify_settings(config) if config else NotifySettings()
    sinks = [*settings.sinks, *(sink_from_url(url, index=i) for i, url in enumerate(urls))]
    if len({sink.name for sink in sinks}) != len(sinks):
        raise InputError("--notify-sink", "a sink of --notify-config is already named sink-N")
    changes: dict[str, object] = {"sinks": sinks}
    if source:
        changes["source"] = source
    if state:
        changes["state"] = state
    try:
        settings = NotifySettings.model_validate(
            {**settings.model_dump(by_alias=False), **changes}, by_alias=False, by_name=True
        )
    except ValueError as error:
        field = "--notify-state" if state else "--notify-source"
        raise InputError(field, str(error).splitlines()[-1].strip()) from None
    for sink in settings.sinks:
        read_headers(sink.headers_dir, field=f"sinks.{sink.name}.headersDir")
    return settings if settings.sinks else None


def _cluster_api(make: Callable[[], T]) -> T:
    """The operator's client of the API server, or one line saying there is none to talk to:
    outside a pod with no kubeconfig, the client's ConfigException was an internal error."""
    from kubernetes.config import ConfigException

    try:
        return make()
    except ConfigException:
        raise InputError(
            "operator",
            "no Kubernetes API server to talk to: not in a pod (no service account) and no "
            "kubeconfig (KUBECONFIG, ~/.kube/config); run it in a cluster, or set KUBECONFIG",
        ) from None


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _lease(
    name: str,
    namespace: str,
    identity: str,
    timings: tuple[int, int, int],
) -> LeaseSettings:
    """The Lease of --leader-elect: its namespace from --lease-namespace (POD_NAMESPACE), else
    the service account's; this replica's identity from --identity (POD_NAME), else the host's
    name (a pod's hostname is its name)."""
    import socket
    from pathlib import Path

    from keelgate.kube.runtime.leadership import LeaseSettings

    if not namespace:
        try:
            namespace = Path(SERVICE_ACCOUNT_NAMESPACE).read_text().strip()
        except OSError:
            raise InputError(
                "--lease-namespace", "needed outside a pod (or set POD_NAMESPACE)"
            ) from None
    duration, renew, retry = timings
    try:
        return LeaseSettings(
            name=name,
            namespace=namespace,
            identity=identity or socket.gethostname(),
            lease_seconds=duration,
            renew_seconds=renew,
            retry_seconds=retry,
        )
    except ValueError as error:
        field, _, message = str(error).partition(" ")
        raise InputError(field, message) from None


def _tell_own_pod(api: ClusterApi, reason: str, message: str) -> None:
    """A Warning Event on the operator's own pod (the chart's POD_NAME and POD_NAMESPACE), for
    what a person must hear of without reading its log: `kubectl describe pod` and `kubectl
    get events` show it. Best effort: outside a pod, or refused, the log line stands alone."""
    import logging
    import os

    from keelgate.kube.api_failures import ApiFailure

    name, namespace = os.environ.get("POD_NAME", ""), os.environ.get("POD_NAMESPACE", "")
    if not name or not namespace:
        return
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod"}
    try:
        pod = {**pod, **api.read_pod(namespace, name, timeout=10)}  # its uid: describe shows it
    except ApiFailure as failure:
        logging.getLogger("keelgate.operator").info("cannot read its own pod: %s", failure)
        pod["metadata"] = {"name": name, "namespace": namespace}
    api.event(pod, type_="Warning", reason=reason, message=message)


def _trace_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The OpenTelemetry settings step pods get: the operator's own OTEL_* variables, when they
    name an endpoint, but the service name (steps have their own) and the headers (they may
    carry credentials: step pods read them from a Secret of their namespace instead)."""
    from keelgate.core.tracing import endpoint_set

    if not endpoint_set(environ):
        return {}
    private = (
        "OTEL_SERVICE_NAME",
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    )
    forwarded = {k: v for k, v in environ.items() if k.startswith("OTEL_") and k not in private}
    if environ.get("KEELGATE_TRACE_TOOL_ARGUMENTS"):
        forwarded["KEELGATE_TRACE_TOOL_ARGUMENTS"] = environ["KEELGATE_TRACE_TOOL_ARGUMENTS"]
    return forwarded
