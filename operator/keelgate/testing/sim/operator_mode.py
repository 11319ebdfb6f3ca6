"""Operator mode: the operator's real controller (its AgentRun, Reconciliation and Approval
reconcilers and status writers) over the simulated API server, its step pods run by a simulated
kubelet as step processes, people deciding by editing the objects the operator made for them.

Why it exists: the operator is where a decision travels furthest (a person's patch, a watch
event, a reconcile, the store, a status write, the next pod), and where the historical bugs of
``executed: false`` and of a second unknown outcome lived. The controller is the product's
(``keelgate.kube.controller.dispatch.Controller``) with the real watch cache; only its work queue
(virtual time), its metrics (none) and the cluster around it are the simulator's. An operator
can restart (a new cache, relisted) and a second one can run beside it for a while.
"""

from __future__ import annotations

from typing import Any

from keelgate.core.types import StopReason
from keelgate.kube.controller.context import ControllerSettings
from keelgate.kube.controller.dispatch import Controller
from keelgate.kube.controller.outcomes import Requeue, Result
from keelgate.kube.controller.ports import Key
from keelgate.kube.runtime.cache import Cache
from keelgate.testing.sim.cluster import JSON, SimApiServer
from keelgate.testing.sim.desk import EDITS, Desk
from keelgate.testing.sim.downstream import Ledger
from keelgate.testing.sim.model import Scenario
from keelgate.testing.sim.oracle import Truth
from keelgate.testing.sim.people import PEOPLE, Decision
from keelgate.testing.sim.processes import Faults, StepProcess
from keelgate.testing.sim.stores import StoreSite
from keelgate.testing.sim.world import World

KINDS = ("AgentRun", "Reconciliation", "Approval", "Pod")
RESYNC = 60.0


class _NoMeter:
    def step_started(self) -> None: ...

    def step_ended(self, result: str, seconds: float | None) -> None: ...

    def handoff(self, seconds: float) -> None: ...


class SimOperator:
    """One operator process: the real controller, its cache fed by the API server's watches."""

    def __init__(self, world: World, api: SimApiServer, site: StoreSite, *, name: str) -> None:
        self.world = world
        self.api = api
        self.site = site
        self.name = name
        self.alive = True
        self.stores = site.open()
        self.cache = Cache(clock=world.boot)
        self.controller = Controller(
            api=api,
            stores=self.stores,
            cache=self.cache,
            settings=ControllerSettings(crash_backoff=1.0, busy_retry=5.0),
            meter=_NoMeter(),
            enqueue=self.enqueue,
            clock=world.wall,
        )
        self._due: dict[Key, float] = {}
        self._tries: dict[Key, int] = {}
        api.watchers.append(self)
        self.relist()
        world.at(RESYNC, f"{name} resync", self.resync)

    # The watch (the cache, then the work queue)

    def put(self, kind: str, body: JSON) -> None:
        self.cache.put(kind, body)
        self._queue_for(kind, body)

    def drop(self, kind: str, body: JSON) -> None:
        self.cache.drop(kind, body)
        self._queue_for(kind, body)

    def _queue_for(self, kind: str, body: JSON) -> None:
        meta = body["metadata"]
        if kind == "Pod":
            run = (meta.get("labels") or {}).get("keelgate.dev/run")
            if run:
                self.enqueue(("AgentRun", meta["namespace"], run), 0.0)
        else:
            self.enqueue((kind, meta["namespace"], meta["name"]), 0.0)

    def relist(self) -> None:
        for kind in KINDS:
            for body in self.api.of_kind(kind):
                self.cache.put(kind, body)
                self._queue_for(kind, body)

    def resync(self) -> None:
        if not self.alive:
            return
        self.relist()  # a dropped watch event is made good here
        self.world.at(RESYNC, f"{self.name} resync", self.resync)

    def enqueue(self, key: Key, after: float) -> None:
        if not self.alive:
            return
        due = self.world.now + max(0.0, after)
        if key in self._due and self._due[key] <= due:
            return
        self._due[key] = due
        self.world.at(after, f"{self.name} reconciles {key[0]}", lambda: self._reconcile(key, due))

    def _reconcile(self, key: Key, due: float) -> None:
        if not self.alive or self._due.get(key) != due:
            return
        del self._due[key]
        try:
            result: Result = self.controller.reconcile(key)
        except Exception as error:  # what kopf's workers do: log, back off, try again
            self.world.say(f"{self.name} {key[0]} {key[2]}: {type(error).__name__}")
            result = Requeue(2.0)
        if isinstance(result, Requeue):
            # The work queue's rate limiter (client-go's: 5 ms doubling): a key requeued at
            # once again and again (a lost race against a stale cache) backs off.
            tries = self._tries.get(key, 0) + 1
            self._tries[key] = tries
            self.enqueue(key, max(result.after, min(60.0, 0.005 * 2**tries)))
        else:
            self._tries.pop(key, None)

    def stop(self) -> None:
        if not self.alive:
            return
        self.world.say(f"{self.name} stops")
        self.alive = False
        if self in self.api.watchers:
            self.api.watchers.remove(self)
        self.stores.close()


class Cluster:
    """The API server, its kubelet, the operators and the people of one simulated run."""

    def __init__(
        self,
        world: World,
        site: StoreSite,
        ledger: Ledger,
        scenario: Scenario,
        faults: Faults,
        desk: Desk,
        truth: Truth,
        *,
        tenant: str,
        run: str,
    ) -> None:
        self.world = world
        self.site = site
        self.ledger = ledger
        self.scenario = scenario
        self.faults = faults
        self.desk = desk
        self.truth = truth
        self.tenant = tenant
        self.run = run
        self.api = SimApiServer(world, faulty=True)
        self.api.on_pod = self._pod_created
        self.operators: list[SimOperator] = []
        self.processes: list[StepProcess] = []
        self.decisions: list[Decision] = []
        self.calm = False
        self.count = 0
        self.edits = (0, 100, 400)[world.schedule.pick(3)]
        self.wrong = (0, 30)[world.schedule.pick(2)]

    def start(self) -> None:
        self.api.create_object(
            "AgentRun",
            self.tenant,
            {
                "apiVersion": "keelgate.dev/v1alpha1",
                "kind": "AgentRun",
                "metadata": {"name": self.run, "annotations": {}},
                "spec": self.desk.manifest,
            },
        )
        self._operator()
        self.world.at(self.world.schedule.between(2.0, 60.0), "people look", self.look)
        self.world.at(self.world.schedule.between(30.0, 300.0), "operator event", self.chaos)

    def _operator(self) -> SimOperator:
        self.count += 1
        operator = SimOperator(self.world, self.api, self.site, name=f"operator{self.count}")
        self.operators.append(operator)
        return operator

    def chaos(self) -> None:
        """An operator restart, or a second operator for a while (a lease handed over late)."""
        if self.calm:
            return
        world = self.world
        if world.schedule.chance(500):
            old = self.operators[-1]
            old.stop()
            self._operator()
        else:
            second = self._operator()
            world.at(world.schedule.between(5.0, 60.0), "second operator stops", second.stop)
        world.at(world.schedule.between(60.0, 400.0), "operator event", self.chaos)

    def shutdown(self) -> None:
        """The run is over: the operators stop (what is still under way ends without them)."""
        self.calm = True
        for operator in self.operators:
            operator.stop()

    def finished(self) -> bool:
        body = self.api.get("AgentRun", self.tenant, self.run)
        phase = ((body or {}).get("status") or {}).get("phase")
        return phase in ("Succeeded", "Failed") and not any(p.alive for p in self.processes)

    # The kubelet

    def _pod_created(self, pod: JSON) -> None:
        name = pod["metadata"]["name"]
        self.world.at(
            self.world.schedule.between(0.5, 3.0),
            f"kubelet starts {name}",
            lambda: self._run_pod(name),
        )

    def _run_pod(self, name: str) -> None:
        pod = self.api.get("Pod", self.tenant, name)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return
        process = StepProcess(
            self.world,
            self.site,
            self.ledger,
            self.scenario,
            self.faults,
            name=name,
            tenant=self.tenant,
            run=self.run,
            on_exit=lambda p, code: self._exited(name, code),
            truth=self.truth,
        )
        self.processes.append(process)
        process.start()

    def _exited(self, name: str, code: int) -> None:
        if code < 0:
            # Its node was lost: the kubelet no longer reports it, and the node's pods are
            # deleted by the node lifecycle controller a while later, never confirmed.
            self.world.at(300.0, "node eviction", lambda: self.api.delete_pod(self.tenant, name))
            return
        self.api.finish_pod(self.tenant, name, code)

    # People, through kubectl

    def look(self) -> None:
        world = self.world
        schedule = world.schedule
        if not self.calm and schedule.chance(self.edits):
            self.desk.edit(EDITS[schedule.pick(len(EDITS))])
            self.api.replace_spec("AgentRun", self.tenant, self.run, self.desk.manifest)
        for body in self.api.of_kind("Reconciliation"):
            self._settle(body)
        for body in self.api.of_kind("Approval"):
            self._approve(body)
        run = self.api.get("AgentRun", self.tenant, self.run) or {}
        status = run.get("status") or {}
        if status.get("stopReason") in (StopReason.TOKEN_BUDGET, StopReason.MAX_ITERATIONS) and (
            self.calm or schedule.chance(500)
        ):
            self.desk.edit("raise budget")
            self.api.replace_spec("AgentRun", self.tenant, self.run, self.desk.manifest)
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        world.at(5.0 if self.calm else schedule.between(2.0, 60.0), "people look", self.look)

    def _settle(self, body: JSON) -> None:
        spec: dict[str, Any] = body.get("spec") or {}
        if spec.get("executed") is not None or (body.get("status") or {}).get("phase") == "Settled":
            return
        schedule = self.world.schedule
        if not self.calm and schedule.chance(300):
            return  # not now
        key = str(spec.get("idempotencyKey", ""))
        happened = self.ledger.count(key) > 0
        truthful = self.calm or not schedule.chance(self.wrong)
        executed = happened if truthful else not happened
        by = PEOPLE[schedule.pick(len(PEOPLE))]
        self.world.say(f"{by} patches {body['metadata']['name']} executed: {executed}")
        self.api.patch_spec(
            "Reconciliation",
            self.tenant,
            body["metadata"]["name"],
            {"executed": executed, "by": by},
        )
        action = str(spec.get("action", ""))
        self.decisions.append(
            Decision("settle", action, key, executed, by, self.world.now, truthful)
        )

    def _approve(self, body: JSON) -> None:
        """One person decides: with the one-decision form when the rule asks one person (as
        `kubectl patch` does), else by adding their decision to spec.decisions (as `kubectl
        keelgate approve` does); calm, it is someone who has not decided yet."""
        spec: dict[str, Any] = body.get("spec") or {}
        status: dict[str, Any] = body.get("status") or {}
        if spec.get("approved") is not None or status.get("phase") == "Settled":
            return
        decisions = list(spec.get("decisions") or [])
        if any(not d.get("approved") for d in decisions):
            return  # denied: the operator records it
        schedule = self.world.schedule
        if not self.calm and schedule.chance(300):
            return
        yes = self.calm or not schedule.chance(200)
        by = PEOPLE[schedule.pick(len(PEOPLE))]
        given = {str(d.get("by")) for d in decisions}
        if self.calm and by in given:
            by = next((p for p in PEOPLE if p not in given), by)
        name = body["metadata"]["name"]
        if int(status.get("required") or 1) <= 1 and not decisions:
            self.world.say(f"{by} patches {name} approved: {yes}")
            self.api.patch_spec("Approval", self.tenant, name, {"approved": yes, "by": by})
            return
        self.world.say(f"{by} adds to {name}'s decisions approved: {yes}")
        entry = {"by": by, "groups": [], "approved": yes}
        self.api.patch_spec("Approval", self.tenant, name, {"decisions": [*decisions, entry]})
