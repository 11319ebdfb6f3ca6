"""The runs this operator holds in the store: taken before a step pod is made, renewed together,
let go when a run finishes (design: docs/operator.md, "Run ownership").

Why it exists: the store is the one arbiter of who drives a run (``RunOwners``: a holder and an
epoch under a lease). An operator takes a run before it creates the run's step pod and hands the
epoch to the pod (``KEELGATE_EPOCH``), so that every write of the step carries it and the store
refuses it once another holder (a standby cluster's operator, a leader after a hand-over) took
the run. What this operator holds is kept here, in memory: a restart holds nothing, and takes
each run again (its earlier life's epoch is then fenced off, like anyone's). Renewal is one
statement per period for every held run (``renew_held``), never one per run.

Operators in two clusters may share one store (a standby cluster): a holder's name carries its
cluster (``--cluster``), so that a run held by another cluster's operator is told apart from one
held by another replica (or an earlier leader) of this cluster: the first is *standby* here
(``Standby=True``, at rest), the second a hand-over under way (``HeldElsewhere``).

This module must never take a run for a read, never renew a lease one run at a time, and never
hand a step pod an epoch the store did not give this operator.
"""

from __future__ import annotations

import re
import secrets
import threading
from dataclasses import dataclass

from keelgate.core import clocks
from keelgate.core.protocols import Ownership, RunOwners, Stores
from keelgate.errors import RunBusy

#: The seconds a run's lease lasts, and how often the holder renews it (a third, as a
#: Kubernetes Lease is renewed): two renewals may fail (a store's fail-over) before a run is lost.
RUN_LEASE = 30.0
RUN_LEASE_RENEW = 10.0

#: A cluster's name (``--cluster``): a DNS label, so that it never holds the ``@`` or ``/`` a
#: holder's name is split at.
CLUSTER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def holder_name(identity: str, *, cluster: str) -> str:
    """An operator process's name as a holder of runs: ``identity/mark@cluster``. The mark
    (hexadecimal, fresh for each process) keeps two processes apart (one holder is one
    driver); the cluster after it tells the other clusters' operators where the holder is."""
    return f"{identity}/{secrets.token_hex(3)}@{cluster}"


def cluster_of(holder: str) -> str:
    """The cluster a holder's name says it is in; "" for a name without one (a holder written
    before clusters were named, or a name given by hand): read as this cluster's own."""
    _, _, last = holder.rpartition("/")
    mark, at, cluster = last.rpartition("@")
    if not at or not mark or not CLUSTER_NAME.match(cluster):
        return ""
    return cluster


@dataclass(frozen=True)
class HeldElsewhere:
    """Another live holder drives the run: who, under which epoch, for how long its lease is
    live (seconds, on the store's clock, when it was read), and whether it is another
    cluster's operator (``cluster``: its cluster then; "" when it is one of this cluster's)."""

    holder: str
    epoch: int
    lease_left: float
    cluster: str = ""

    @property
    def standby(self) -> bool:
        """The run is another cluster's: this cluster stands by for it."""
        return bool(self.cluster)

    def refusal(self) -> str:
        """Why a decision made here (an Approval's, a Reconciliation's) does not count: the
        run's holder records decisions. No lease in it: the words stay the same while the
        refusal stands, so it is told once."""
        if self.standby:
            return (
                f"not counted here: the run is held by cluster {self.cluster!r} (operator "
                f"{self.holder!r}) under epoch {self.epoch}; a decision counts in the cluster "
                "holding the run (this one is tried again, and counts only if this cluster takes "
                "the run over before it is decided there)"
            )
        return (
            f"not counted here: the run is held by {self.holder!r} under epoch {self.epoch}; it "
            "is tried again, and counts once this operator holds the run (that one's lease "
            "lapsed, or it let the run go)"
        )

    def words(self) -> str:
        left = f"{max(self.lease_left, 0.0):.0f} s"
        if self.standby:
            # No lease left in it: a standby run's status is written when its holder or epoch
            # changes, not at every look (one status patch per standby run per lease, else).
            return (
                f"held by cluster {self.cluster!r} (operator {self.holder!r}) under epoch "
                f"{self.epoch}: this cluster stands by, makes no step pod and counts no "
                "decision for the run; it takes the run over if that operator's lease on it "
                "lapses"
            )
        return (
            f"held by {self.holder!r} under epoch {self.epoch} (its lease live {left} more): "
            "no step pod is made here while it holds the run"
        )


class RunHolding:
    """The runs ``holder`` holds in ``owners``. An empty ``holder`` (or a store that records no
    ownership) holds nothing: every run is then driven without an epoch, as before ownership."""

    def __init__(
        self,
        owners: RunOwners | None = None,
        *,
        holder: str = "",
        lease: float = RUN_LEASE,
    ) -> None:
        self._owners = owners if holder else None
        self.holder = holder
        self.cluster = cluster_of(holder)
        self.lease = lease
        self._held: dict[tuple[str, str], Ownership] = {}
        self._lock = threading.Lock()
        # When the store last confirmed this operator's hold (a take or a renewal), on the
        # boot clock: past a renewal period without one, its leases are in doubt.
        self._confirmed_at = clocks.boot()

    @classmethod
    def of(cls, stores: Stores, *, holder: str, lease: float = RUN_LEASE) -> RunHolding:
        """Holding over the operator's stores, if they record ownership (the SQL stores do)."""
        owners: object = stores.checkpoints
        if owners is not stores.idempotency or not isinstance(owners, RunOwners):
            return cls()
        return cls(owners, holder=holder, lease=lease)

    @property
    def enabled(self) -> bool:
        return self._owners is not None

    def hold(self, namespace: str, run: str) -> Ownership | HeldElsewhere | None:
        """The run's ownership by this operator: held already, or taken now. ``HeldElsewhere``
        while another holder's lease is live; None when ownership is off."""
        owners = self._owners
        if owners is None:
            return None
        with self._lock:
            held = self._held.get((namespace, run))
        if held is not None:
            return held
        try:
            taken = owners.take(namespace, run, holder=self.holder, lease=self.lease)
        except RunBusy:
            current = owners.holder_of(namespace, run)
            if current is None or current.holder == self.holder:
                raise  # refused, yet nobody else holds it: a store's fault, tried again
            return self._elsewhere(current)
        with self._lock:
            self._held[(namespace, run)] = taken
            self._confirmed_at = clocks.boot()
        return taken

    def elsewhere(self, namespace: str, run: str) -> HeldElsewhere | None:
        """Who else holds the run under a live lease, if this operator does not hold it (a
        read, never a take); None when nobody else does, or ownership is off."""
        owners = self._owners
        if owners is None or self.epoch(namespace, run) is not None:
            return None
        current = owners.holder_of(namespace, run)
        if current is None or current.holder == self.holder or current.lease_left <= 0:
            return None
        return self._elsewhere(current)

    def _elsewhere(self, current: Ownership) -> HeldElsewhere:
        """Another holder's ownership as this operator tells it: another cluster's (both
        clusters named, and apart) or one of this cluster's own."""
        theirs = cluster_of(current.holder)
        other = theirs if theirs and self.cluster and theirs != self.cluster else ""
        return HeldElsewhere(current.holder, current.epoch, current.lease_left, cluster=other)

    def epoch(self, namespace: str, run: str) -> int | None:
        """The epoch this operator holds the run under (None: it does not hold it)."""
        with self._lock:
            held = self._held.get((namespace, run))
        return None if held is None else held.epoch

    def lost(self, namespace: str, run: str) -> None:
        """The run was taken from this operator (a step pod fenced, a renewal that no longer
        finds it): held no more; the next ``hold`` tries to take it again."""
        with self._lock:
            self._held.pop((namespace, run), None)

    def let_go(self, namespace: str, run: str) -> None:
        """The run finished (or went): its lease ends now, so that nobody waits for it."""
        with self._lock:
            held = self._held.pop((namespace, run), None)
        if held is not None and self._owners is not None:
            self._owners.let_go(held)

    def held(self) -> list[tuple[str, str]]:
        with self._lock:
            return sorted(self._held)

    def in_doubt(self) -> bool:
        """Whether this operator's hold on its runs is in doubt: it holds some, and the store
        has confirmed none of them (no take, no renewal) for longer than a renewal period (a
        third of the lease), so another cluster may take them when their leases lapse."""
        with self._lock:
            held, since = bool(self._held), clocks.boot() - self._confirmed_at
        return self._owners is not None and held and since > self.lease / 3

    def away_too_long(self, since: float) -> bool:
        """Whether a store out of reach since ``since`` (boot clock) has been for longer than a
        renewal period, with ownership on: a run this operator does not hold (one it never
        took, say after a restart in the outage) may be driven by another cluster all along,
        which sees nothing added here until the store is back."""
        return self._owners is not None and clocks.boot() - since > self.lease / 3

    def renew(self) -> list[tuple[str, str]]:
        """Renew every held run's lease at once (one statement); the runs found lost, which
        are held no more (their step pods' writes are refused from now on)."""
        owners = self._owners
        if owners is None:
            return []
        with self._lock:
            before = dict(self._held)
        if not before:
            return []
        kept = {(o.tenant, o.run): o for o in owners.renew_held(self.holder, lease=self.lease)}
        lost: list[tuple[str, str]] = []
        with self._lock:
            self._confirmed_at = clocks.boot()
            # Judged on what was held before the renewal: a run taken meanwhile is not lost.
            for key, held in before.items():
                if self._held.get(key) is not held:
                    continue
                now = kept.get(key)
                if now is None or now.epoch != held.epoch:
                    del self._held[key]
                    lost.append(key)
                else:
                    self._held[key] = now
        return lost
