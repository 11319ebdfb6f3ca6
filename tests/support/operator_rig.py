"""An operator without a cluster, for the controller's unit tests.

The real ``Controller``, ``Cache`` and ``Metrics`` over a SQLite store in the test's folder and
``FakeApiServer`` (tests/fakes/kube_api.py), whose changes reach the cache as kopf's watches
would bring them. A step pod's container is the real ``keelgate step`` run in this process over
the same store (``run_step``), its exit code handed to the pod as a kubelet would. Only the API
server is a fake: the decisions, the store, the loop and the step are the product's own.
"""

from __future__ import annotations

import io
import signal
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

from fakes.kube_api import FakeApiServer
from keelgate.cli.step import main as step_main
from keelgate.core.failpoints import armed, parse
from keelgate.core.tracing import NO_TRACING, Tracer
from keelgate.errors import SimulatedCrash
from keelgate.kube.controller.context import ControllerSettings, notify_nobody
from keelgate.kube.controller.dispatch import Controller
from keelgate.kube.controller.outcomes import Result
from keelgate.kube.controller.ports import Key
from keelgate.kube.runtime.cache import Cache
from keelgate.kube.runtime.metrics import Metrics
from keelgate.kube.runtime.notifier import ConfigMapState, Notifier, plan_arguments
from keelgate.manifest.notifications import NotifySettings
from keelgate.stores import open_stores

JSON = dict[str, Any]
NAMESPACE = "shop"
TOOLS = "support.operator_tools"

ORDER = {"tool": "place_order", "args": {"sku": "A1", "qty": 2}}


def agentrun_spec(
    *,
    script: list[Any] | None = None,
    tool: str = "place_order",
    approval: bool = False,
    rule: Mapping[str, Any] | None = None,
    budget: Mapping[str, Any] | None = None,
    **extra: Any,
) -> JSON:
    """An AgentRun's spec: a scripted model (one order, then done) and one python WRITE (its
    approval ``rule``, when given, is the tool's ``approval``)."""
    approved = {"approval": dict(rule)} if rule is not None else {}
    return {
        "goal": "Restock SKU A1",
        "model": {
            "provider": "scripted",
            "script": script
            if script is not None
            else [{"actions": [{**ORDER, "tool": tool}]}, {"done": True, "answer": "ordered"}],
        },
        "tools": [
            {
                "name": tool,
                "sideEffect": "WRITE",
                "requiresApproval": approval,
                **approved,
                "python": {"callable": f"{TOOLS}:{tool}"},
            }
        ],
        "budget": {"maxIterations": 5, **(budget or {})},
        **extra,
    }


class Operator:
    """One test's operator; ``queued`` is every key the controller asked to see again."""

    def __init__(
        self,
        folder: Path,
        *,
        settings: ControllerSettings | None = None,
        clock: Callable[[], float] = time.time,
        server_clock: Callable[[], float] | None = None,
        api: FakeApiServer | None = None,
        tracer: Tracer = NO_TRACING,
        notify: NotifySettings | None = None,
        notify_sleep: Callable[[float], bool] | None = None,
        store: str = "",
    ) -> None:
        """``api``: the cluster of an operator before this one (a restart); its watches then
        report to this operator's cache, which knows nothing until ``relist``. ``notify``: the
        sinks its notifier (the runtime's own, over the fake API server's ConfigMaps) sends to,
        waiting ``notify_sleep`` between tries (default: the real back-off). ``store``: the store's
        URL (default: a SQLite file in ``folder``, which an operator on the same folder shares).
        ``server_clock``: the clock a new API server stamps its objects' times with (default:
        ``clock``, the operator's, as a real server and operator agree)."""
        self.api = api if api is not None else FakeApiServer(clock=server_clock or clock)
        self.store_url = store or f"sqlite:///{folder / 'keelgate.db'}"
        self.stores = open_stores(self.store_url)
        self.metrics = Metrics()
        self.notifier: Notifier | None = None
        if notify is not None:
            self.notifier = Notifier(
                notify,
                metrics=self.metrics,
                state=ConfigMapState(self.api, notify.state) if notify.state else None,
                arguments=self._arguments,
                sleep=notify_sleep,
            )
            # As the operator's start: the kept state read before the listing (``relist``).
            self.notifier.begin()
            self.notifier.start()
            if api is None:
                self.notifier.live()  # a new cluster: nothing to list
        self.cache = Cache(observer=None if self.notifier is None else self.notifier.observe)
        self.api.watch = self.cache
        self.queued: list[tuple[Key, float]] = []
        self.controller = Controller(
            api=self.api,
            stores=self.stores,
            cache=self.cache,
            settings=settings or ControllerSettings(),
            meter=self.metrics,
            enqueue=lambda key, after: self.queued.append((key, after)),
            clock=clock,
            tracer=tracer,
            notify=notify_nobody if self.notifier is None else self.notifier.notify,
        )
        self.termination_log = folder / "termination-log"

    def close(self) -> None:
        if self.notifier is not None:
            self.notifier.stop()
        self.stores.close()

    def _arguments(self, namespace: str, run: str, action: str) -> Any:
        checkpoint = self.stores.checkpoints.load(namespace, run)
        return None if checkpoint is None else plan_arguments(checkpoint.state, action)

    # The cluster, as a user and the kubelet change it

    def apply(self, name: str, spec: JSON, *, annotations: Mapping[str, str] | None = None) -> JSON:
        body: JSON = {
            "apiVersion": "keelgate.dev/v1alpha1",
            "kind": "AgentRun",
            "metadata": {"name": name, "annotations": dict(annotations or {})},
            "spec": spec,
        }
        return self.api.create_object("AgentRun", NAMESPACE, body)

    def run_step(
        self,
        name: str,
        *,
        failpoints: Mapping[str, int] | None = None,
        late_call_grace: float | None = None,
    ) -> int:
        """The step pod ``name``'s status names runs to its end: its container's command
        (``keelgate step`` and the pod's arguments) in this process over the same store, with the
        failpoints its environment arms, or ``failpoints`` (a death at one exits 137); then the
        pod ends with that code, as a kubelet reports it. ``late_call_grace``: how long the
        step waits for a timed-out call still running before it exits (its own default if
        None); a call it stops waiting for goes on in this process, as it would on a pod whose
        process is still there."""
        pod_name = str(self.status(name)["step"]["pod"])
        pod = self.api.start_pod(NAMESPACE, pod_name)
        container = pod["spec"]["containers"][0]
        assert container["args"][0] == "step", container["args"]
        env = {e["name"]: e.get("value", "") for e in container["env"]}
        if failpoints is None and env.get("KEELGATE_FAILPOINTS"):
            failpoints = parse(env["KEELGATE_FAILPOINTS"])
        self.termination_log.write_text("")
        # What `keelgate step` changes for its own process, given back to the test's.
        saved, on_sigterm = list(sys.path), signal.getsignal(signal.SIGTERM)
        argv = [*container["args"][1:], "--store", self.store_url]
        argv += ["--termination-log", str(self.termination_log)]
        if env.get("KEELGATE_EPOCH"):
            argv += ["--epoch", env["KEELGATE_EPOCH"]]  # as the step reads its environment
        if late_call_grace is not None:
            argv += ["--late-call-grace", str(late_call_grace)]
        logs = io.StringIO()
        try:
            with armed(dict(failpoints or {})), redirect_stdout(logs), redirect_stderr(logs):
                code = step_main(argv)
        except SimulatedCrash:
            code = 137
        finally:
            sys.path[:] = saved
            signal.signal(signal.SIGTERM, on_sigterm)
        message = self.termination_log.read_text()
        if not message and code != 0:
            # terminationMessagePolicy FallbackToLogsOnError: the kubelet takes the log's tail.
            message = logs.getvalue()[-2048:]
        self.api.finish_pod(NAMESPACE, pod_name, code, message=message)
        return code

    # The operator

    def relist(self, *kinds: str) -> None:
        """What kopf does when it starts watching: every object of ``kinds`` into the cache."""
        for kind in kinds:
            for body in self.api.of_kind(kind):
                self.cache.put(kind, body)
        if self.notifier is not None:
            self.notifier.live()

    def reconcile(self, name: str, *, kind: str = "AgentRun") -> Result:
        return self.controller.reconcile((kind, NAMESPACE, name))

    def drive(self, name: str, *, steps: int = 10) -> list[int]:
        """Reconcile and run each step pod the run asks for, until it asks for none; the exit
        codes of the pods run."""
        codes: list[int] = []
        for _ in range(steps):
            self.reconcile(name)
            step = self.status(name).get("step") or {}
            pod = self.api.get("Pod", NAMESPACE, str(step.get("pod", "")))
            if step.get("state") != "Pending" or pod is None:
                return codes
            codes.append(self.run_step(name))
        raise AssertionError(f"{name} still asks for a step pod after {steps} steps")

    # What shows

    def run(self, name: str) -> JSON:
        found = self.api.get("AgentRun", NAMESPACE, name)
        assert found is not None, name
        return found

    def status(self, name: str) -> JSON:
        return dict(self.run(name).get("status") or {})

    def condition(self, name: str, type_: str) -> JSON:
        return next(c for c in self.status(name)["conditions"] if c["type"] == type_)

    def pods(self) -> list[str]:
        return [pod["metadata"]["name"] for pod in self.api.of_kind("Pod")]

    def sample(self, metric: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(metric, labels)
        return 0.0 if value is None else value
