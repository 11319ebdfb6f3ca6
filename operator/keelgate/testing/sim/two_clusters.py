"""Two clusters over one store (``--two-clusters``, issue 50): the same AgentRun applied to both,
as GitOps applies it, each cluster with its own API server, kubelet, operators and people, and
the store the one arbiter of which cluster drives the run.

Why it exists: a run moves between clusters only through the store's ownership (a holder and an
epoch under a lease: ``kube.controller.ownership``), and the windows where that can go wrong are
those where a cluster goes and comes back: its operators gone for a while (the lease lapses
unrenewed and the other cluster takes the run), its API server gone (its leader cannot renew its
Lease and stops, while its step pods run on), or the cluster cut off from the store (its
operators cannot renew, its step pods can write nothing, and may still send a call they claimed
before). Each is drawn from the world's schedule, on the cluster that holds the run more often
than not, and ends with the cluster back: its operators start again and find the run held
elsewhere. People look in both clusters and decide on whatever objects each shows them,
the one that does not hold the run included. The oracle's promises are judged as for one
cluster; ``checkers.two_drivers`` adds that no two clusters' step processes drive the run at
once, by the world's own record of where each wrote (``ProcessLife.wrote``).

It must never draw from the schedule in a world with one cluster, and never judge anything: the
checkers do, from the books.
"""

from __future__ import annotations

from keelgate.errors import KeelgateError
from keelgate.testing.sim.operator_mode import Cluster
from keelgate.testing.sim.processes import Setting

#: The two clusters' names (the first is where the run is created first).
NAMES = ("east", "west")
#: What happens to a cluster: its operators gone, its API server gone, cut off from the store.
FAULTS = ("operators", "api", "cut")


class TwoClusters:
    """Two clusters given the same AgentRun over one store, and the faults that move the run
    between them."""

    def __init__(self, setting: Setting, *, moves: frozenset[str] = frozenset()) -> None:
        self.setting = setting
        self.world = setting.world
        self.clusters = [Cluster(setting, moves=moves, name=name, holders=True) for name in NAMES]
        for cluster in self.clusters:
            cluster.everywhere = self.clusters
        self.calm = False
        self.over = False  # shut down: nothing comes back any more

    def start(self) -> None:
        for cluster in self.clusters:
            cluster.start()
        world = self.world
        world.at(world.schedule.between(20.0, 200.0), "a cluster event", self.strike)

    # What moves the run

    def holder(self) -> str:
        """Which cluster's operator holds the run in the store now ("" if none): read as the
        world looks at the store, to strike where it hurts; nothing is judged by it."""
        stores = self.setting.site.open()
        try:
            owners = stores.owners
            held = (
                None if owners is None else owners.holder_of(self.setting.tenant, self.setting.run)
            )
        except KeelgateError:
            return ""
        finally:
            stores.close()
        return "" if held is None else held.holder.split("/", 1)[0]

    def strike(self) -> None:
        """One cluster (the one holding the run, three times in four) goes for a while: its
        operators, its API server, or its way to the store; then it comes back."""
        if self.calm or self.over:
            return
        world = self.world
        schedule = world.schedule
        holding = self.holder()
        standing = [c for c in self.clusters if not c.gone and not c.cut]
        held = [c for c in standing if c.name == holding]
        if held and schedule.pick(4) != 3:
            cluster = held[0]
        elif standing:
            cluster = standing[schedule.pick(len(standing))]
        else:
            cluster = None
        if cluster is not None:
            fault = FAULTS[schedule.pick(len(FAULTS))]
            # Often longer than the run's lease (30 s), so that the other cluster takes it.
            lasting = schedule.between(10.0, 240.0)
            self._go(cluster, fault, lasting)
        world.at(schedule.between(60.0, 500.0), "a cluster event", self.strike)

    def _go(self, cluster: Cluster, fault: str, lasting: float) -> None:
        world = self.world
        if fault == "cut":
            world.say(f"{cluster.name} is cut off from the store for {lasting:.1f}s")
            cluster.cut = True
            # The store server ends the cut-off sessions (their clients silent past its
            # keepalive): their run locks go with them, as a lost node's do.
            for process in cluster.processes.values():
                stores = getattr(process, "_stores", None)
                if process.alive and stores is not None:
                    self.setting.site.lose_session(stores)
        elif fault == "operators":
            world.say(f"{cluster.name}'s operators are gone for {lasting:.1f}s")
            cluster.gone = "operators"
            for operator in cluster.operators:
                operator.stop()
        else:
            world.say(f"{cluster.name}'s API server is gone for {lasting:.1f}s")
            cluster.gone = "api"
            # Its leader cannot renew its Lease, and stops at once (exit 1); its step pods run
            # on, and their ends are reported when the server is back.
            stop_in = world.schedule.between(2.0, 15.0)
            world.at(
                stop_in, f"{cluster.name}'s operators lose their Lease", lambda: _stop(cluster)
            )
        world.at(lasting, f"{cluster.name} is back", lambda: self._back(cluster))

    def _back(self, cluster: Cluster) -> None:
        """The cluster is back: reachable, its API server up, an operator running there (which
        finds the run held elsewhere if the other took it meanwhile)."""
        if self.over or not (cluster.cut or cluster.gone):
            return
        self.world.say(f"{cluster.name} is back")
        cluster.cut = False
        cluster.gone = ""
        if not any(operator.alive for operator in cluster.operators):
            cluster._operator()

    # The end

    def quiet(self) -> None:
        """The calm: every cluster back, its API server without faults."""
        self.calm = True
        for cluster in self.clusters:
            self._back(cluster)
            cluster.calm = True
            cluster.api.faulty = False
            cluster.look_again()

    def finished(self) -> bool:
        """The run is over: no step process runs in either cluster, none is intended in either,
        and a cluster shows it Succeeded or Failed (the other shows it as it likes: as its
        holder ended it, held elsewhere, or standing by)."""
        if any(p.alive for c in self.clusters for p in c.processes.values()):
            return False
        bodies = [
            c.api.get("AgentRun", self.setting.tenant, self.setting.run) or {}
            for c in self.clusters
        ]
        shown = [body.get("status") or {} for body in bodies]
        if any((status.get("step") or {}).get("state") == "Pending" for status in shown):
            return False
        if any(
            body and not status.get("phase") for body, status in zip(bodies, shown, strict=True)
        ):
            return False  # an AgentRun no operator has looked at yet (made again just now)
        # A cluster's end counts only as of the spec it stands: one its operator shows for an
        # earlier generation (a Failed on the verifier's limit, the limit raised since, while
        # the other cluster took the run on) says nothing of the run now.
        return any(
            status.get("phase") in ("Succeeded", "Failed")
            and status.get("observedGeneration") == (body.get("metadata") or {}).get("generation")
            for body, status in zip(bodies, shown, strict=True)
        )

    def shutdown(self) -> None:
        self.over = True
        for cluster in self.clusters:
            cluster.shutdown()


def _stop(cluster: Cluster) -> None:
    if cluster.gone == "api":
        for operator in cluster.operators:
            operator.stop()
