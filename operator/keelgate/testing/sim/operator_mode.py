"""Operator mode: the operator's real controller (its AgentRun, Reconciliation and Approval
reconcilers and status writers) over the simulated API server, its step pods run by a simulated
kubelet as step processes, people deciding by editing the objects the operator made for them,
through what admission lets them do (``keelgate.testing.sim.admission``).

Why it exists: the operator is where a decision travels furthest (a person's patch, a watch
event, a reconcile, the store, a status write, the next pod), and where the historical bugs of
``executed: false`` and of a second unknown outcome lived. The controller is the product's
(``keelgate.kube.controller.dispatch.Controller``) with the real watch cache; only its work queue
(virtual time), its metrics (none) and the cluster around it are the simulator's. An operator
can restart (a new cache, relisted) and a second one can run beside it for a while. Deleting an
object deletes what it owns a moment later (the garbage collector), and a deleted pod's process
is asked to stop, then killed at the end of its grace period (the kubelet).

With ``moves`` (issue 46), alice, who created the run and may edit her namespace, also tries
what admission lets through: a byte-equal copy of someone's entry appended to an Approval, a
deny moved to the front of the list, her run deleted and created again under the same name, a
decision made as a ServiceAccount, a tool's definition edited after its call was approved, and
an Approval deleted while the operators are down (its finalizer, keelgate.dev/decisions, holds
it until an operator has recorded its decisions; she cannot remove that, nor add to it then).
Every decision and move is booked as it was made (``Books.decisions``; a move is marked as one,
never as its entry's author's decision).

Why one module past 500 lines: the people, their moves and the cluster's answers (the garbage
collector, the kubelet, an operator's restart) interleave on one virtual timeline; apart, a
reader could no longer follow which of them a step or an operator saw first.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from keelgate.core import clocks
from keelgate.core.loop import Loop
from keelgate.core.state import RunState
from keelgate.core.types import PendingApproval, utc_iso
from keelgate.errors import KeelgateError
from keelgate.kube.controller.context import ControllerSettings
from keelgate.kube.controller.dispatch import Controller
from keelgate.kube.controller.outcomes import Requeue, Result
from keelgate.kube.controller.ownership import RUN_LEASE_RENEW
from keelgate.kube.controller.ports import Key
from keelgate.kube.runtime.cache import Cache
from keelgate.kube.settle_window import TOO_EARLY
from keelgate.testing.sim.admission import User, admitted, finalizer_refusal, mutated
from keelgate.testing.sim.books import (
    CREATOR,
    GROUPS,
    SERVICE_ACCOUNT,
    Books,
    Decision,
    Question,
)
from keelgate.testing.sim.cluster import JSON, SimApiServer
from keelgate.testing.sim.desk import EDITS
from keelgate.testing.sim.people import BUDGET_STOPS, PEOPLE, book_approval, calm_look, counts
from keelgate.testing.sim.processes import Setting, StepProcess
from keelgate.testing.sim.stores import StoreSite, patiently
from keelgate.testing.sim.world import World

KINDS = ("AgentRun", "Reconciliation", "Approval", "Pod")
#: issue 46's moves, by name (``Options.moves``; all of them: ``Options.every``).
MOVES = ("copy", "reorder", "recreate", "service-account", "definition")
#: Moves made only when named (``--moves delete``): an Approval deleted while the operators are
#: down. Not among every move yet: drawn with them, it would move the stories of the seeds kept
#: with every move on (tests/test_simulation.py) away from the windows they keep.
NAMED_MOVES = ("delete",)
RESYNC = 60.0
#: The groups the API server puts a ServiceAccount in.
SERVICE_ACCOUNT_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:shop")


class _NoMeter:
    def step_started(self) -> None: ...

    def step_ended(self, result: str, seconds: float | None) -> None: ...

    def handoff(self, seconds: float) -> None: ...


class SimOperator:
    """One operator process: the real controller, its cache fed by the API server's watches.
    ``holder``: it takes the runs it drives in the store, under its name (``--identity``), and
    renews their leases every ``RUN_LEASE_RENEW`` seconds as the runtime does
    (``kube.runtime.run_leases.renew_runs``); ``reachable``: whether the store server can be
    reached from its cluster now."""

    def __init__(
        self,
        world: World,
        api: SimApiServer,
        site: StoreSite,
        *,
        name: str,
        holder: bool = False,
        reachable: Callable[[], bool] = lambda: True,
        looked: Callable[[Key, JSON | None], None] = lambda key, seen: None,
    ) -> None:
        self.world = world
        self.looked = looked
        self.api = api
        self.site = site
        self.name = name
        self.alive = True
        self.stores = site.open(reachable=reachable)
        self.cache = Cache(clock=world.boot)
        settings = ControllerSettings(
            crash_backoff=1.0, busy_retry=5.0, holder=name if holder else ""
        )
        self.controller = Controller(
            api=api,
            stores=self.stores,
            cache=self.cache,
            settings=settings,
            meter=_NoMeter(),
            enqueue=self.enqueue,
            clock=world.wall,
        )
        self._due: dict[Key, float] = {}
        self._tries: dict[Key, int] = {}
        api.watchers.append(self)
        self.relist()
        world.at(RESYNC, f"{name} resync", self.resync)
        if self.controller.holding.enabled:
            world.at(RUN_LEASE_RENEW, f"{name} renews its runs", self.renew)

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

    def renew(self) -> None:
        """Every held run's lease renewed in one statement; a run found lost is looked at at
        once (taken again before its next pod, or shown held elsewhere); a renewal that fails
        is tried at the next period (``renew_runs``)."""
        if not self.alive:
            return
        holding = self.controller.holding
        with self.world.acting(self.name):
            try:
                lost = holding.renew()
            except KeelgateError as failure:
                self.world.say(f"{self.name} cannot renew its runs ({type(failure).__name__})")
                lost = []
        for namespace, run in lost:
            self.world.say(f"{self.name} no longer holds {run}")
            self.enqueue(("AgentRun", namespace, run), 0.0)
        self.world.at(RUN_LEASE_RENEW, f"{self.name} renews its runs", self.renew)

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
        # What this reconcile reads of the object: its cache's copy, which a late or dropped
        # watch event leaves behind the API server's.
        seen = self.cache.get(*key) if key[0] == "Approval" else None
        with self.world.acting(self.name):
            try:
                result: Result = self.controller.reconcile(key)
            except Exception as error:  # what kopf's workers do: log, back off, try again
                self.world.say(f"{self.name} {key[0]} {key[2]}: {type(error).__name__}")
                result = Requeue(2.0)
        self.looked(key, seen)  # it read the object, whatever it could do with it
        if isinstance(result, Requeue):
            # The work queue's rate limiter (client-go's: 5 ms doubling): a key requeued at
            # once again and again (a lost race against a stale cache) backs off.
            tries = self._tries.get(key, 0) + 1
            self._tries[key] = tries
            self.enqueue(key, max(result.after, clocks.backoff(0.005, 60.0, tries)))
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
    """The API server, its kubelet, the operators and the people of one simulated run. With
    ``name`` it is one of two clusters (``two_clusters.TwoClusters``): its operators take the
    run in the store (``holders``), its processes and operators are named after it, and it can
    be gone (its operators, or its API server) or cut off from the store for a while."""

    def __init__(
        self,
        setting: Setting,
        *,
        moves: frozenset[str] = frozenset(),
        name: str = "",
        holders: bool = False,
    ) -> None:
        self.setting = setting
        self.name = name
        self.holders = holders
        #: Every cluster the AgentRun is applied to (as GitOps applies it): a spec edit goes
        #: to each. Just this one unless it is one of two.
        self.everywhere: list[Cluster] = [self]
        #: Its operators are down (``operators``) or its API server is (``api``): no operator
        #: starts here meanwhile, and with its API server down nobody reaches its objects.
        self.gone = ""
        #: Cut off from the store server: no statement from its nodes reaches it.
        self.cut = False
        self._where = f" in {name}" if name else ""  # what people's lines say of where
        self.world = world = setting.world
        self.books: Books = setting.planner.books
        self.moves = tuple(m for m in (*MOVES, *NAMED_MOVES) if m in moves)
        self.api = SimApiServer(world, faulty=True, cluster=name)
        self.api.on_pod = self._pod_created
        self.api.on_pod_deleted = self._pod_deleted
        self.api.on_status = self._status_written
        self.operators: list[SimOperator] = []
        self.processes: dict[str, StepProcess] = {}
        self.calm = False
        self.looking = True  # people look at the run until they take it as over
        self.count = 0
        self.edits = (0, 100, 400)[world.schedule.pick(3)]
        self.wrong = (0, 30)[world.schedule.pick(2)]
        self.mischief = (0, 150, 400)[world.schedule.pick(3)] if moves else 0

    def start(self) -> None:
        self._create_run()
        self._operator()
        self.world.at(self.world.schedule.between(2.0, 60.0), "people look", self.look)
        self.world.at(self.world.schedule.between(30.0, 300.0), "operator event", self.chaos)

    def _create_run(self) -> None:
        # alice creates it: admission records her as its creator (keelgate.dev/created-by).
        self.api.create_object(
            "AgentRun",
            self.setting.tenant,
            {
                "apiVersion": "keelgate.dev/v1alpha1",
                "kind": "AgentRun",
                "metadata": {
                    "name": self.setting.run,
                    "annotations": {"keelgate.dev/created-by": CREATOR},
                },
                "spec": copy.deepcopy(self.setting.desk.manifest),
            },
        )

    def _operator(self) -> SimOperator:
        self.count += 1
        operator = SimOperator(
            self.world,
            self.api,
            self.setting.site,
            name=f"{self.name}/operator{self.count}" if self.name else f"operator{self.count}",
            holder=self.holders,
            reachable=self.reachable,
            looked=self._looked,
        )
        self.operators.append(operator)
        return operator

    def _looked(self, key: Key, seen: JSON | None) -> None:
        """With two clusters: an operator here looked at an Approval as its cache showed it
        (``seen``); the decisions made on it here that the copy holds are read from now on
        (``Decision.read_at``). One its copy does not hold yet (its watch event late or
        dropped) is not: no process of the product could have read it."""
        if not self.name or seen is None:
            return
        spec = seen.get("spec") or {}
        action = str(spec.get("action", ""))
        entries = {
            (str(entry.get("by", "")), entry.get("approved") is True)
            for entry in spec.get("decisions") or ()
            if isinstance(entry, dict)
        }
        for decision in self.books.decisions:
            if (
                decision.cluster == self.name
                and decision.action == action
                and decision.unread
                and decision.read_at is None
                and (decision.by, decision.yes) in entries
            ):
                decision.read_at = self.world.now

    def reachable(self) -> bool:
        return not self.cut

    def apply_spec(self) -> None:
        """The run's owner applies the spec the desk holds now, to every cluster."""
        for cluster in self.everywhere:
            cluster.api.replace_spec(
                "AgentRun", self.setting.tenant, self.setting.run, self.setting.desk.manifest
            )

    def chaos(self) -> None:
        """An operator restart, or a second operator for a while (a lease handed over late)."""
        if self.calm:
            return
        world = self.world
        if self.gone:
            pass  # nothing starts here while the cluster is gone
        elif world.schedule.chance(500) or self.name:
            # One of two clusters has no second operator for a while: two live holders in one
            # cluster rewrite an Approval's status back and forth, each write waking the other
            # (docs/simulation.md, "Two clusters"), at one virtual moment once watches are calm.
            if self.name:
                # One of two clusters: a restart stops whatever operators run there (the one
                # cluster's world stops the newest only, and so its kept seeds' stories stay).
                for old in self.operators:
                    old.stop()
            else:
                self.operators[-1].stop()
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
        """The run is over: Succeeded or Failed, no step running, and none intended. A run
        Failed on the verifier's limit goes on once its spec's limit lies above its count (an
        edit made while a step held up stopped it, say): its operator then records a step
        (``status.step``, Pending) before the pod exists, the phase still Failed."""
        body = self.api.get("AgentRun", self.setting.tenant, self.setting.run)
        status = (body or {}).get("status") or {}
        intended = (status.get("step") or {}).get("state") == "Pending"
        return (
            status.get("phase") in ("Succeeded", "Failed")
            and not intended
            and not any(p.alive for p in self.processes.values())
        )

    # The kubelet

    def _pod_created(self, pod: JSON) -> None:
        name = pod["metadata"]["name"]
        self.world.at(
            self.world.schedule.between(0.5, 3.0),
            f"kubelet starts {name}",
            lambda: self._run_pod(name),
        )

    def _run_pod(self, name: str) -> None:
        pod = self.api.get("Pod", self.setting.tenant, name)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return
        # A run deleted and created again names its pods afresh: the world tells them apart.
        named = f"{self.name}/{name}" if self.name else name
        taken = sum(1 for known in self.books.processes if known.split("#")[0] == named)
        process = StepProcess(
            self.setting,
            name=named if not taken else f"{named}#{taken + 1}",
            on_exit=lambda p, code: self._exited(name, code),
            epoch=_epoch_of(pod),
            cluster=self.name,
            reachable=self.reachable,
        )
        self.processes[name] = process
        process.start()

    def _pod_deleted(self, pod: JSON) -> None:
        """A pod being deleted: its process is asked to stop (SIGTERM), and killed at the end
        of its grace period; one not started yet is removed at once. A lost node's kubelet hears
        nothing of it: the pod stays until its node is declared gone and the pod garbage
        collector removes it (its process may still run there)."""
        name = pod["metadata"]["name"]
        process = self.processes.get(name)
        if process is None:
            self.api.remove_pod(self.setting.tenant, name)
            return
        if process.lost:
            self.world.at(
                300.0,
                "the pod garbage collector",
                lambda: self.api.remove_pod(self.setting.tenant, name),
            )
            return
        if not process.alive:
            self.api.remove_pod(self.setting.tenant, name)
            return
        process.drain()
        grace = float((pod.get("spec") or {}).get("terminationGracePeriodSeconds") or 30)
        self.world.at(grace, f"grace of {process.name} over", process.kill)

    def _exited(self, name: str, code: int) -> None:
        if code < 0:
            # Its node was lost: the kubelet no longer reports it, and the node's pods are
            # deleted by the node lifecycle controller a while later, never confirmed.
            self.world.at(
                300.0, "node eviction", lambda: self.api.delete_pod(self.setting.tenant, name)
            )
            return
        self.api.finish_pod(self.setting.tenant, name, code)

    # What the people are told: a Reconciliation settled as they said

    def _status_written(self, kind: str, body: JSON) -> None:
        status = body.get("status") or {}
        if kind == "Approval":
            self._refused_here(body, str(status.get("message") or ""))
        if kind == "Reconciliation" and TOO_EARLY in str(status.get("conditions") or ""):
            self._refused_too_early(body)
        if kind != "Reconciliation" or status.get("phase") != "Settled":
            return
        action = str((body.get("spec") or {}).get("action", ""))
        executed = status.get("verdict") == "executed"
        for decision in self.books.decisions:
            if (
                decision.kind == "settle"
                and decision.source == "human"
                and decision.action == action
                and decision.by == status.get("settledBy")
                and decision.yes == executed
                and decision.accepted_at is None
                and decision.refused_at is None
            ):
                decision.accepted_at, decision.told = self.world.now, True
                break

    def _refused_too_early(self, body: JSON) -> None:
        """A "not executed" refused as written before the call could no longer be sent: its
        maker is told it did not count (the oracle counts it no more; they may write it again)."""
        spec = body.get("spec") or {}
        for decision in self.books.decisions:
            if (
                decision.kind == "settle"
                and decision.source == "human"
                and decision.action == spec.get("action")
                and decision.by == spec.get("by")
                and decision.yes is False
                and decision.accepted_at is None
                and decision.refused_at is None
            ):
                decision.refused_at = self.world.now

    def _refused_here(self, body: JSON, message: str) -> None:
        """With two clusters: a deny made on this cluster's Approval that its operator shows
        not counted (the run held by the other cluster, or between two stops: any refusal
        naming its maker, alone or after the count's ``not counted:``) is refused, its maker
        told so; the oracle counts it no more from then. An approval refused so is still counted
        as made (where it is carried over later, the product counts it from then): the oracle
        errs toward letting the call through, never toward a broken promise of its own making.
        With one cluster, only the refusal that stands (the rule as the run asks does not let
        its maker decide: "may not decide it"); one that passes (between two stops, the store
        away) is the product's to record later, and the deny keeps binding. A rule edited at
        the moment of the deny is thus the product's to apply: the deny refused under the rule
        the run asked with is shown so, and its maker decides again if the new rule asks them."""
        action = str((body.get("spec") or {}).get("action", ""))
        # "bob: <why>" alone, or "<count>; not counted: bob: <why>; carol: <why>".
        pieces = [piece.removeprefix("not counted: ") for piece in message.split("; ")]
        if not self.name:
            pieces = [piece for piece in pieces if "may not decide it" in piece]
        for decision in self.books.decisions:
            if (
                decision.kind == "approve"
                and not decision.yes
                and decision.cluster == self.name
                and decision.action == action
                and decision.refused_at is None
                and any(piece.startswith(f"{decision.by}: ") for piece in pieces)
            ):
                decision.refused_at = self.world.now
                self.world.say(f"{decision.by}'s deny in {self.name} is shown not counted here")

    # People, through kubectl

    def look(self) -> None:
        if self.gone == "api":
            # Nobody reaches the cluster's objects: people look again later.
            self.world.at(self.world.schedule.between(2.0, 60.0), "people look", self.look)
            return
        with self.world.acting("people"):
            finished = self._look()
        self.looking = not finished
        if not finished:
            world = self.world
            delay = calm_look(world) if self.calm else world.schedule.between(2.0, 60.0)
            world.at(delay, "people look", self.look)

    def quiet(self) -> None:
        """The calm, for a cluster alone: its API server without faults, the spec as the desk
        restored it applied, and people looking again."""
        self.calm = True
        self.api.faulty = False
        self.apply_spec()
        self.look_again()

    def look_again(self) -> None:
        """The calm: people who took the run as over look once more (the spec restored then
        may take it on, and its next stop for a person must find someone looking)."""
        if not self.looking:
            self.looking = True
            self.world.at(calm_look(self.world), "people look", self.look)

    def _look(self) -> bool:
        world = self.world
        schedule = world.schedule
        if not self.calm and schedule.chance(self.edits):
            self.setting.desk.edit(EDITS[schedule.pick(len(EDITS))])
            self.apply_spec()
        state = self._state()
        for body in self.api.of_kind("Reconciliation"):
            self._settle(body, state)
        for body in self.api.of_kind("Approval"):
            self._approve(body, state)
        if not self.calm and schedule.chance(self.mischief):
            # Right after the others decided, before the operator hears of it (issue 46).
            self._move(state)
        run = self.api.get("AgentRun", self.setting.tenant, self.setting.run) or {}
        status = run.get("status") or {}
        if status.get("stopReason") in BUDGET_STOPS and (self.calm or schedule.chance(500)):
            self.setting.desk.edit("raise budget")
            self.apply_spec()
        return self._over(status, state)

    def _over(self, status: JSON, state: RunState | None) -> bool:
        """Whether people stop looking: the run shows it Succeeded, or Failed on a stop final
        under the spec as it stands (``RunState.continues_under``, as in local mode). A run
        Failed on the verifier's limit goes on once an edit raised the limit past its count (in
        the same look, or before): its next stop for a person would find nobody looking."""
        phase = status.get("phase")
        if phase == "Succeeded":
            return True
        if phase != "Failed" or state is None:
            return False
        spec = self.setting.desk.loop_spec(self.setting.tenant, self.setting.run)
        return not state.continues_under(spec.budget)

    def _state(self) -> RunState | None:
        """The run as ``kubectl keelgate status`` shows it (the actions' arguments)."""
        stores = self.setting.site.open()
        try:
            loop = Loop(stores=stores, busy_wait=0.0)
            return patiently(lambda: loop.state(self.setting.tenant, self.setting.run))
        except KeelgateError:
            return None
        finally:
            stores.close()

    def _patch(self, kind: str, body: JSON, spec: dict[str, Any], user: User) -> bool:
        """``kubectl patch`` as ``user``: what admission refuses never lands."""
        name = body["metadata"]["name"]
        current = self.api.get(kind, self.setting.tenant, name)
        if current is None:
            return False
        old = current.get("spec") or {}
        status = current.get("status") or {}
        deleting = bool(current["metadata"].get("deletionTimestamp"))
        refused = admitted(kind, old, spec, user, status=status, deleting=deleting)
        if refused:
            self.world.say(f"{user.name} patches {name}: refused ({refused})")
            return False
        version = str(current["metadata"].get("resourceVersion", ""))
        shown = str(status.get("definition") or "")
        self.api.replace_spec(
            kind, self.setting.tenant, name, mutated(kind, old, spec, version=version, shown=shown)
        )
        return True

    def _settle(self, body: JSON, state: RunState | None) -> None:
        spec: dict[str, Any] = dict(body.get("spec") or {})
        if (body.get("status") or {}).get("phase") == "Settled":
            return
        if spec.get("executed") is not None:
            self._settle_again(body, state)
            return
        world, schedule = self.world, self.world.schedule
        action = str(spec.get("action", ""))
        ref = _ref(state, action)
        self.books.questions.append(Question(world.now, "people", action, ref))
        if not self.calm and schedule.chance(300):
            return  # not now
        happened = self.books.happened(ref, world.now)
        truthful = self.calm or not schedule.chance(self.wrong)
        executed = happened if truthful else not happened
        by = PEOPLE[schedule.pick(len(PEOPLE))]
        world.say(f"{by} patches {body['metadata']['name']} executed: {executed}{self._where}")
        decision = Decision(world.now, "settle", by, by, action, ref, executed, truthful=truthful)
        self.books.decisions.append(decision)
        spec.update(executed=executed, by=by)
        self._patch("Reconciliation", body, spec, User(by, GROUPS[by]))

    def _settle_again(self, body: JSON, state: RunState | None) -> None:
        """A "not executed" the operator refused as written too early (``DecidedTooEarly``:
        the call could still be sent after its maker looked) is looked at again by its maker,
        the one who may write it again: a question asked now. They correct it to executed if
        the call took effect, else write the same with ``decidedAt`` now (truthfully, calm;
        in the chaos now and then the other way, as people err)."""
        spec: dict[str, Any] = dict(body.get("spec") or {})
        status = body.get("status") or {}
        stalled = [c for c in status.get("conditions") or () if c.get("type") == "Stalled"]
        if not stalled or stalled[0].get("status") != "True":
            return
        if stalled[0].get("reason") != TOO_EARLY or spec.get("executed") is not False:
            return
        by = str(spec.get("by") or "")
        if by not in GROUPS:
            return  # nobody of this world wrote it (only its maker may write it again)
        world, schedule = self.world, self.world.schedule
        if not self.calm and schedule.chance(300):
            return  # not now
        action = str(spec.get("action", ""))
        ref = _ref(state, action)
        self.books.questions.append(Question(world.now, "people", action, ref))
        happened = self.books.happened(ref, world.now)
        truthful = self.calm or not schedule.chance(self.wrong)
        executed = happened if truthful else not happened
        name = body["metadata"]["name"]
        world.say(f"{by} looks again at {name}: executed: {executed}{self._where}")
        decision = Decision(world.now, "settle", by, by, action, ref, executed, truthful=truthful)
        self.books.decisions.append(decision)
        spec.update(executed=executed, decidedAt=utc_iso(clocks.wall()))
        if not self._patch("Reconciliation", body, spec, User(by, GROUPS[by])):
            decision.refused_at = world.now

    def _approve(self, body: JSON, state: RunState | None) -> None:
        """One person decides: with the one-decision form when the rule asks one person (as
        `kubectl patch` does), else by adding their decision to spec.decisions (as `kubectl
        keelgate approve` does); calm, it is someone who counts and has not decided yet."""
        spec: dict[str, Any] = dict(body.get("spec") or {})
        status: dict[str, Any] = body.get("status") or {}
        if status.get("phase") == "Settled" or spec.get("approved") is False:
            return
        # People go by the status: an entry the operator refused (a deny by someone the rule
        # does not name) leaves the Approval waiting, and someone who counts decides.
        decisions = list(spec.get("decisions") or [])
        world, schedule = self.world, self.world.schedule
        waits, rest = (False, 0) if self.calm else schedule.chance_and_rest(300)
        if waits:
            return
        action = str(spec.get("action", ""))
        pending = _pending(state, action)
        yes = self.calm or not schedule.chance(200)
        by = PEOPLE[schedule.pick(len(PEOPLE))]
        # With ``service_account_rules``, where the Approval says ServiceAccounts may decide,
        # a third of the chaos's decisions are the CI job's, made as its ServiceAccount for
        # the person drawn (read from the rest of the draw above).
        bot = self.setting.desk.service_account_rules and bool(status.get("serviceAccounts"))
        if bot and rest % 3 == 1:
            self._as_the_ci_job(body, spec, state, by, yes)
            return
        counting = {str(b) for b in status.get("approvedBy") or ()}
        if self.name:
            # With two clusters: an entry of one's own still on the object (not counted here
            # yet, the run held by the other cluster) is one's decision; it is not made again.
            counting |= {str(d.get("by")) for d in decisions}
        if by in counting and "copy" not in self.moves:
            # A second entry of one's own waits in the list until the first stops counting, and
            # then counts from when the operator reads it (issue 46): with the copy move only.
            return
        if self.calm:
            rule = None if pending is None else pending.rule
            fit = [p for p in PEOPLE if p not in counting and counts(p, rule, CREATOR)]
            if fit and by not in fit:
                by = fit[schedule.pick(len(fit))]
        name = body["metadata"]["name"]
        decision = self._booked_approval(spec, state, by, yes)
        rule = None if pending is None else pending.rule
        # One person, no groups asked: the one-decision form does (it names no groups, and
        # counts as a decision with none). Where the run is not waiting for the action (it
        # is between stops) the person cannot see its rule, and adds their decision with
        # their groups, as `kubectl keelgate approve` does.
        one = rule is not None and rule.required <= 1 and not rule.group_lists()
        if one and not decisions and spec.get("approved") is None:
            world.say(f"{by} patches {name} approved: {yes}{self._where}")
            spec.update(approved=yes, by=by)
        else:
            world.say(f"{by} adds to {name}'s decisions approved: {yes}{self._where}")
            spec["decisions"] = [
                *decisions,
                {"by": by, "groups": list(GROUPS[by]), "approved": yes},
            ]
        if self._patch("Approval", body, spec, User(by, GROUPS[by])):
            decision.accepted_at = world.now  # made on an Approval still waiting for it

    def _as_the_ci_job(
        self, body: JSON, spec: dict[str, Any], state: RunState | None, human: str, yes: bool
    ) -> None:
        """``human``'s CI job decides as the ServiceAccount it runs as (the rule lets it)."""
        user = User(SERVICE_ACCOUNT, SERVICE_ACCOUNT_GROUPS)
        entry = {"by": user.name, "groups": [], "approved": yes}
        spec["decisions"] = [*(spec.get("decisions") or ()), entry]
        decision = self._booked_approval(spec, state, user.name, yes, human=human)
        name = body["metadata"]["name"]
        self.world.say(f"{human}'s CI job adds to {name}'s decisions approved: {yes}{self._where}")
        if self._patch("Approval", body, spec, user):
            decision.accepted_at = self.world.now

    def _booked_approval(
        self, spec: JSON, state: RunState | None, by: str, yes: bool, *, human: str = ""
    ) -> Decision:
        """An approval or a deny of the Approval's call, as ``human`` makes it now under the
        name ``by`` (with the groups ``by`` is in), booked."""
        action = str(spec.get("action", ""))
        decision = book_approval(
            self.books,
            self.setting.desk,
            at=self.world.now,
            by=by,
            human=human or by,
            action=action,
            ref=_ref(state, action),
            yes=yes,
            tool=str(spec.get("tool", "")),
        )
        decision.cluster = self.name
        decision.unread = bool(self.name)  # until an operator here looks at the object
        return decision

    # issue 46's moves: what admission lets alice do

    def _move(self, state: RunState | None) -> None:
        schedule = self.world.schedule
        which = self.moves[schedule.pick(len(self.moves))]
        approvals = [b for b in self.api.of_kind("Approval")]
        if which == "definition":
            self.setting.desk.edit(self.setting.desk.definition_edit())
            self.apply_spec()
        elif which == "recreate":
            self.world.say(
                f"{CREATOR} deletes {self.setting.run} and creates it again{self._where}"
            )
            self.api.delete_object("AgentRun", self.setting.tenant, self.setting.run)
            self._create_run()
        elif approvals:
            body = approvals[schedule.pick(len(approvals))]
            if which == "copy":
                self._copy(body)
            elif which == "reorder":
                self._reorder(body, state)
            elif which == "delete":
                self._delete_while_down(body, state)
            else:
                self._as_service_account(body)

    def _copy(self, body: JSON) -> None:
        """alice appends a byte-equal copy of someone's entry (the chart admitted it before issue
        46, and refuses it now); with this move, people also try a second entry of their own
        while their first still counts."""
        spec: dict[str, Any] = dict(body.get("spec") or {})
        theirs = [d for d in spec.get("decisions") or () if d.get("by") != CREATOR]
        if not theirs:
            return
        entry = theirs[self.world.schedule.pick(len(theirs))]
        spec["decisions"] = [*spec["decisions"], copy.deepcopy(entry)]
        # Tried whether admission lets it through or not (the chart refuses it since issue 46).
        self.world.say(f"{CREATOR} copies {entry.get('by')}'s entry in {body['metadata']['name']}")
        if self._patch("Approval", body, spec, User(CREATOR, GROUPS[CREATOR])):
            self._booked_move(body, entry, "copy")

    def _reorder(self, body: JSON, state: RunState | None) -> None:
        """Someone who approved changes their mind and denies; alice at once moves the deny to
        the front of the list, before the operator saw it (the chart admitted it before issue
        46: nothing removed; it refuses it now)."""
        spec: dict[str, Any] = dict(body.get("spec") or {})
        if (body.get("status") or {}).get("phase") == "Settled":
            return
        decisions = list(spec.get("decisions") or ())
        mine = [d.get("by") for d in decisions]
        once = [by for by in mine if by != CREATOR and mine.count(by) == 1]
        if not once:
            return
        by = str(once[0])
        world = self.world
        deny = {"by": by, "groups": list(GROUPS.get(by, ())), "approved": False}
        decision = self._booked_approval(spec, state, by, False)
        spec["decisions"] = [*decisions, deny]
        if not self._patch("Approval", body, spec, User(by, GROUPS.get(by, ()))):
            return
        decision.accepted_at = world.now
        world.say(f"{by} adds to {body['metadata']['name']}'s decisions approved: False")
        moved = dict(spec)
        moved["decisions"] = [deny, *decisions]
        world.say(f"{CREATOR} moves {by}'s deny to the front")
        if self._patch("Approval", body, moved, User(CREATOR, GROUPS[CREATOR])):
            self._booked_move(body, deny, "reorder")

    def _as_service_account(self, body: JSON) -> None:
        """alice approves as the ServiceAccount she may impersonate (``--as``)."""
        spec: dict[str, Any] = dict(body.get("spec") or {})
        status = body.get("status") or {}
        if spec.get("approved") is not None or status.get("phase") == "Settled":
            return
        user = User(SERVICE_ACCOUNT, SERVICE_ACCOUNT_GROUPS)
        entry = {"by": user.name, "groups": [], "approved": True}
        spec["decisions"] = [*(spec.get("decisions") or ()), entry]
        world = self.world
        decision = self._booked_approval(spec, self._state(), user.name, True, human=CREATOR)
        world.say(f"{CREATOR} approves {body['metadata']['name']} as {user.name}")
        if self._patch("Approval", body, spec, user):
            decision.accepted_at = world.now

    def _delete_while_down(self, body: JSON, state: RunState | None) -> None:
        """Someone the rule counts denies; at once the operators are down (a rollout), alice
        deletes the Approval and tries to remove its finalizer (admission refuses: only the
        operator removes it); an operator is back a moment later. The finalizer held the
        Approval, and the operator records the deny before it goes (before the finalizer, the
        deny went with it, and a fresh Approval's approval ran the WRITE)."""
        world, name = self.world, body["metadata"]["name"]
        spec: dict[str, Any] = dict(body.get("spec") or {})
        action = str(spec.get("action", ""))
        pending = _pending(state, action)
        fit = [p for p in PEOPLE if counts(p, None if pending is None else pending.rule, CREATOR)]
        waiting = (body.get("status") or {}).get("phase") != "Settled"
        if pending is not None and fit and waiting and spec.get("approved") is None:
            by = fit[world.schedule.pick(len(fit))]
            decision = self._booked_approval(spec, state, by, False)
            spec["decisions"] = [
                *(spec.get("decisions") or ()),
                {"by": by, "groups": list(GROUPS[by]), "approved": False},
            ]
            if self._patch("Approval", body, spec, User(by, GROUPS[by])):
                decision.accepted_at = world.now
                world.say(f"{by} adds to {name}'s decisions approved: False")
        for operator in self.operators:
            operator.stop()
        world.say(f"the operators are down; {CREATOR} deletes {name}")
        self.api.delete_object("Approval", self.setting.tenant, name)
        held = self.api.get("Approval", self.setting.tenant, name)
        if held is not None:
            refused = finalizer_refusal(
                held["metadata"].get("finalizers") or (), [], User(CREATOR, GROUPS[CREATOR])
            )
            world.say(f"{CREATOR} removes {name}'s finalizer: refused ({refused})")
        world.at(world.schedule.between(1.0, 30.0), "an operator is back", self._back)

    def _back(self) -> None:
        if self.gone:
            return  # a cluster gone meanwhile gets its operator when it comes back
        if self.name and any(operator.alive for operator in self.operators):
            return  # one of two clusters: an operator restarted meanwhile is the one back
        self._operator()

    def _booked_move(self, body: JSON, entry: JSON, move: str) -> None:
        action = str((body.get("spec") or {}).get("action", ""))
        self.books.decisions.append(
            Decision(
                self.world.now,
                "approve",
                str(entry.get("by")),
                CREATOR,
                action,
                _ref(self._state(), action),
                bool(entry.get("approved")),
                tuple(entry.get("groups") or ()),
                move=move,
            )
        )


def _epoch_of(pod: JSON) -> int | None:
    """The epoch the operator gave the pod (``KEELGATE_EPOCH``), as its container reads it."""
    for container in (pod.get("spec") or {}).get("containers") or ():
        for variable in container.get("env") or ():
            if variable.get("name") == "KEELGATE_EPOCH":
                return int(variable["value"])
    return None


def _pending(state: RunState | None, action: str) -> PendingApproval | None:
    """What the run asks people about ``action`` now (None when it is not asking about it)."""
    return None if state is None else next((p for p in state.pending if p.action == action), None)


def _ref(state: RunState | None, action: str) -> str:
    planned = None if state is None else state.planned(action)
    return "" if planned is None else str(planned.args.get("ref", ""))
