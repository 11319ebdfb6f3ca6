"""The periodic resync: every so often, queue again every run that may still change, forget the
step pods deleted while no watch was looking, and refresh the gauges.

Why it exists: nothing may depend on an event arriving. A person may settle an outcome with
``keelgate reconcile`` straight in the store (no watch event), and a watch that reconnects lists
the objects again but never reports one deleted while it was away: a step pod gone unseen would
hold its run and a step slot for good. It must never decide anything (it only queues keys and
corrects the cache), and never hold the resync up on an API server that does not answer.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from keelgate.kube.api import ClusterApi
from keelgate.kube.api_failures import Gone
from keelgate.kube.controller.ports import Key
from keelgate.kube.resources import controller_name, holds_decisions, is_settled
from keelgate.kube.runtime.cache import Cache

log = logging.getLogger("keelgate.operator")

# A resync's look at the running step pods gives up after this long (an API server that
# accepts connections and answers nothing must not hold the resync up for good).
CHECK_TIMEOUT = 10.0
#: A run whose step pod is pending or running is looked at by one resync in this many (a tenth
#: of them at each resync, by name): its pod's watch events bring every change to it, and the
#: resync is only the net under the watch. Looking at 10,000 such runs at every resync cost the
#: operator more CPU than the steps themselves (docs/performance.md, "Ten thousand runs").
ACTIVE_SLICES = 10


class Resync:
    def __init__(
        self,
        *,
        every: float,
        cache: Cache,
        api: ClusterApi,
        clusterwide: bool,
        add: Callable[[Key], None],
        add_low: Callable[[Key], None],
        pod_ended: Callable[[str, str], None],
        refresh_gauges: Callable[[], None],
        waiting: WaitingRuns | None = None,
    ) -> None:
        self._every = every
        self._cache = cache
        self._api = api
        self._clusterwide = clusterwide
        self._add = add
        # What the resync queues goes behind what the watches queue (a pod's end waits for no
        # resync); a run whose step pod vanished unseen goes ahead, as an event would.
        self._add_low = add_low
        self._pod_ended = pod_ended
        self._round = 0
        self._refresh_gauges = refresh_gauges
        self._waiting = waiting

    async def run(self) -> None:
        """Resync every ``every`` seconds, until cancelled."""
        while True:
            await asyncio.sleep(self._every)
            self._round += 1
            if self._waiting is None:
                due = due_for_resync(self._cache, round_=self._round)
            else:
                due = await asyncio.to_thread(self._waiting.due, self._cache, round_=self._round)
            for key in due:
                self._add_low(key)
            self._refresh_gauges()
            await self._forget_vanished_step_pods()

    async def _forget_vanished_step_pods(self) -> None:
        """Ask the server which step pods still run; one it does not name and no longer has is
        dropped as deleted (its run then takes its next attempt, as for any pod deleted
        mid-step)."""
        try:
            vanished = await asyncio.to_thread(
                vanished_step_pods, self._api, self._cache, clusterwide=self._clusterwide
            )
        except Exception as failure:  # an API server away, or refusing: the next resync asks again
            log.warning(
                "resync: cannot check the running step pods (%s: %s)",
                type(failure).__name__,
                str(failure).splitlines()[0] if str(failure) else "",
            )
            return
        for namespace, name, uid in vanished:
            body = self._cache.forget_vanished("Pod", namespace, name, uid)
            if body is None:
                continue  # the watch reported it meanwhile
            log.info(
                "step pod %s/%s was deleted unseen: its run takes its next attempt", namespace, name
            )
            run = controller_name(body)
            if run:
                self._add(("AgentRun", namespace, run))
            self._pod_ended(namespace, name)


def vanished_step_pods(
    api: ClusterApi, cache: Cache, *, clusterwide: bool
) -> list[tuple[str, str, str]]:
    """The step pods the cache holds as running that the API server no longer has, as
    (namespace, name, uid): one list of the running step pods (of every namespace, or of each
    namespace the cache has one in), then a read of each pod the list did not name, since a pod
    may be missing from it only because it ended, or was created after the list was made."""
    cached = cache.active_step_pod_keys()  # no copies: thousands of pods may be running
    if not cached:
        return []
    # Listed by name: a pod named in the list is there (in any namespace, for the cluster-wide
    # list, which names no namespace: at worst one vanished pod waits for the next resync);
    # one not named is read before it is taken for gone.
    listed: dict[str | None, set[str]] = {}
    if clusterwide:
        listed[None] = set(api.running_step_pods(None, timeout=CHECK_TIMEOUT))
    else:
        for scope in sorted({namespace for namespace, _, _ in cached}):
            listed[scope] = set(api.running_step_pods(scope, timeout=CHECK_TIMEOUT))
    gone = []
    for namespace, name, uid in cached:
        if name in listed.get(None if clusterwide else namespace, set()):
            continue
        try:
            found = api.read_pod(namespace, name, timeout=CHECK_TIMEOUT)
        except Gone:
            gone.append((namespace, name, uid))
            continue
        cache.put("Pod", found)  # it ended, or is newer than the list: the cache catches up
    return gone


#: (namespace, run name): a run as the store names it (tenant, run).
RunName = tuple[str, str]
#: A run's revision in the store (checkpoint seq, audit head), None where it has none.
Revision = tuple[int, int] | None


class WaitingRuns:
    """Which runs at rest to look at again: those whose records in the store moved since the
    last resync (a decision made with ``keelgate reconcile`` or ``keelgate approve``, which no
    watch reports), found with one read of the store for all of them (``RunRevisions``), where
    reading each run's checkpoint would cost a query per waiting run at every resync. A run is
    looked at again the first time it is seen at rest, and whenever its revision differs from
    the last one seen; what is remembered is only the runs at rest now."""

    def __init__(self, revisions: Callable[[Sequence[RunName]], Mapping[RunName, Revision]]):
        self._revisions = revisions
        self._seen: dict[RunName, Revision] = {}

    def due(self, cache: Cache, *, round_: int = 0) -> list[Key]:
        """The keys resync number ``round_`` queues: every run under way (one whose step pod
        runs in its slice's rounds only), and each run at rest (with its unsettled
        Reconciliations and Approvals) whose store records moved. If the store cannot be asked,
        every key (as without this filter)."""
        runs = cache.keys_with("AgentRun", _resting, lambda body: not _finished(body))
        decisions = [
            *cache.keys_with("Reconciliation", _run_name, lambda body: not is_settled(body)),
            *cache.keys_with("Approval", _run_name, _looked_at_again),
        ]
        due: list[Key] = _thinned(
            cache, [key for key, resting in runs if not resting], round_=round_
        )
        waiting: dict[RunName, list[Key]] = {}
        for key, resting in runs:
            if resting:
                waiting.setdefault((key[1], key[2]), []).append(key)
        for key, run_name in decisions:
            waiting.setdefault((key[1], run_name), []).append(key)
        try:
            revisions = self._revisions(list(waiting))
        except Exception as failure:  # the store away: look at them all, as before
            log.warning(
                "resync: cannot read the waiting runs' revisions (%s: %s)",
                type(failure).__name__,
                str(failure).splitlines()[0] if str(failure) else "",
            )
            self._seen = {}
            return [*due, *(key for keys in waiting.values() for key in keys)]
        seen: dict[RunName, Revision] = {}
        for name, keys in waiting.items():
            revision = revisions.get(name)
            seen[name] = revision
            if name not in self._seen or self._seen[name] != revision:
                due.extend(keys)
        self._seen = seen
        return due


def _resting(run: Mapping[str, Any]) -> bool:
    """A run at rest (stopped or failed, its status answering its spec, not a monitor, no step
    pending, not being deleted): only an edit (a watch event) or the store can move it."""
    meta, status = run.get("metadata", {}), run.get("status") or {}
    spec = run.get("spec") or {}
    step = status.get("step") or {}
    return bool(
        status.get("phase") in ("Stopped", "Failed")
        and status.get("observedGeneration") == meta.get("generation")
        and spec.get("loop") != "monitor"
        and step.get("state") != "Pending"
        and not meta.get("deletionTimestamp")
    )


def _looked_at_again(approval: Mapping[str, Any]) -> bool:
    """An Approval a resync looks at: one not Settled, or one still carrying the operator's
    finalizer (released once its run finishes, or its deletion waits on it)."""
    return not is_settled(approval) or holds_decisions(approval)


def _run_name(decision: Mapping[str, Any]) -> str:
    return str((decision.get("spec") or {}).get("runName", ""))


def _thinned(cache: Cache, keys: list[Key], *, round_: int) -> list[Key]:
    """``keys`` less the runs whose step pod is pending or running, but for those whose slice
    (their name's) is this round's: each is looked at once in ``ACTIVE_SLICES`` resyncs."""
    stepping = dict(cache.keys_with("AgentRun", _stepping_pod))
    out = []
    for key in keys:
        pod = stepping.get(key, "")
        if (
            pod
            and cache.is_active_step_pod(key[1], pod)
            and zlib.crc32(key[2].encode()) % ACTIVE_SLICES != round_ % ACTIVE_SLICES
        ):
            continue
        out.append(key)
    return out


def _stepping_pod(run: Mapping[str, Any]) -> str:
    """The step pod a run's status says is pending or running ("" when none is)."""
    step = (run.get("status") or {}).get("step") or {}
    return str(step.get("pod") or "") if step.get("state") == "Pending" else ""


def due_for_resync(cache: Cache, *, round_: int = 0) -> list[Key]:
    """What periodic resync number ``round_`` looks at again: every run, Reconciliation and
    Approval but those that only an edit can change (a finished run, a settled decision), since
    the edit's watch event brings them anyway, and those whose step pod runs, in all but one
    round of ``ACTIVE_SLICES`` (the pod's events bring them). Finished runs pile up, and each
    look reads the store. An unsettled decision is looked at again because it may have been
    decided in the store (``keelgate reconcile``, ``keelgate approve``, a confirmer), which no
    watch reports: so it is mirrored."""
    return [
        *_thinned(cache, cache.keys("AgentRun", lambda body: not _finished(body)), round_=round_),
        *cache.keys("Reconciliation", lambda body: not is_settled(body)),
        *cache.keys("Approval", _looked_at_again),
    ]


def _finished(run: Mapping[str, Any]) -> bool:
    """A run whose goal is met and whose status answers its current spec: no step, no store
    change can move it (an edit of its spec can, and arrives as a watch event)."""
    meta, status = run.get("metadata", {}), run.get("status") or {}
    return (
        status.get("phase") == "Succeeded"
        and status.get("observedGeneration") == meta.get("generation")
        and not meta.get("deletionTimestamp")
    )
