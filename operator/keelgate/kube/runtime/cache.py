"""What the operator has seen of the cluster: the latest body of each watched object.

kopf's watch streams feed it (and the controller adds what its own writes return), so a
reconcile reads objects from memory instead of asking the API server each time. It may be a
moment behind the server, never ahead of it; the controller is written so that acting on a
stale view is harmless (deterministic names, a 409 adopted by owner UID, status patches guarded
by resourceVersion), and the store, not this cache, decides what a step does. A pod that
disappears leaves a tombstone with its last body, so a step pod deleted mid-run is seen as an
attempt that ended without recording a stop, and a deleted Approval's last body holds the
decisions people added before it went (a run deleted with its Approval before the operator
recorded a deny must not lose the deny); and a deleted object is not brought back by an API
response that arrives after the watch reported the deletion (a pod brought back so would hold a
step slot until a restart). This module must never call the API.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import orjson

from keelgate.kube.naming import RUN_LABEL
from keelgate.kube.resources import is_active_step_pod

JSON = dict[str, Any]
Key = tuple[str, str, str]  # (kind, namespace, name)
#: Told of each body the cache takes in that differs from the one it held (kind, body, False),
#: and of each deletion (kind, body, True).
Observer = Callable[[str, JSON, bool], None]
T = TypeVar("T")

# How long a deleted object's identity is remembered, so that an API response sent before the
# deletion and arriving after its watch event cannot bring the object back. A response is
# seconds late at worst; the bound keeps a long-lived operator's memory flat.
GONE_FOR = 600.0
#: The kinds whose deleted objects leave their last body as a tombstone, for a reconcile to take.
TOMBSTONED = ("Pod", "Approval")


def key_of(kind: str, body: Mapping[str, Any]) -> Key:
    meta = body.get("metadata", {})
    return (kind, str(meta.get("namespace", "")), str(meta.get("name", "")))


def copy_json(value: JSON) -> JSON:
    """A deep copy of JSON data (what the API server sends). orjson's round trip is several
    times faster than ``copy.deepcopy`` on an object body; what it refuses (an integer beyond 64
    bits in a user's spec) is deep-copied instead."""
    try:
        copied: JSON = orjson.loads(orjson.dumps(value))
    except TypeError:
        return copy.deepcopy(value)
    return copied


def _last(kind: str, held: JSON | None, told: JSON) -> JSON:
    """The last body of a deleted object: the one the cache held, or, for an Approval, the
    deletion's own when it is newer (a watch event missed before it: the deletion carries the
    object as it was when it went, with every decision added to it)."""
    if held is None:
        return told
    if kind == "Approval":
        new, old = _version(told), _version(held)
        if new is not None and (old is None or new > old):
            return told
    return held


def _uid(body: Mapping[str, Any]) -> str | None:
    value = body.get("metadata", {}).get("uid")
    return None if value is None else str(value)


def _version(body: Mapping[str, Any]) -> int | None:
    value = body.get("metadata", {}).get("resourceVersion")
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


#: What the operator never reads of an object and the API server sends with every body: the
#: field managers' records (of an Approval, only who wrote it when), and kubectl's copy of the
#: last applied manifest. Together they are often larger than the rest of the object; a cache of
#: thousands of runs keeps neither.
_UNREAD_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"


def _spec_writes(body: Mapping[str, Any], managed: Any) -> list[JSON] | None:
    """Of an Approval's or a Reconciliation's field managers' records, the one thing the
    operator reads: who wrote it other than its status, and when (``approval_entries.written_at``:
    no decision in it was made later than its latest, nor a "not executed" earlier than it when
    it is the person's). None for other kinds, which keep none."""
    if body.get("kind") not in ("Approval", "Reconciliation") or not isinstance(managed, list):
        return None
    return [
        {k: entry[k] for k in ("manager", "operation", "time") if k in entry}
        for entry in managed
        if isinstance(entry, dict) and not entry.get("subresource") and entry.get("time")
    ]


def _slim(body: JSON) -> JSON:
    """``body`` without what the operator never reads (changed in place: the cache owns it)."""
    meta = body.get("metadata")
    if isinstance(meta, dict):
        kept = _spec_writes(body, meta.pop("managedFields", None))
        if kept is not None:
            meta["managedFields"] = kept
        annotations = meta.get("annotations")
        if isinstance(annotations, dict) and _UNREAD_ANNOTATION in annotations:
            meta["annotations"] = {k: v for k, v in annotations.items() if k != _UNREAD_ANNOTATION}
    return body


def slim_copy(body: JSON) -> JSON:
    """A deep copy of ``body`` without what the operator never reads, ``body`` left as it is (a
    watch event's object, which its sender may still hold). The parts left out are never
    copied: at thousands of runs the event loop copies every pod event, and the field managers'
    records were about half of each pod's bytes."""
    meta = body.get("metadata")
    if isinstance(meta, dict):
        annotations = meta.get("annotations")
        if not (isinstance(annotations, dict) and _UNREAD_ANNOTATION in annotations):
            annotations = None
        if annotations is not None or "managedFields" in meta:
            kept = _spec_writes(body, meta.get("managedFields"))
            meta = {k: v for k, v in meta.items() if k != "managedFields"}
            if kept is not None:
                meta["managedFields"] = kept
            if annotations is not None:
                meta["annotations"] = {
                    k: v for k, v in annotations.items() if k != _UNREAD_ANNOTATION
                }
            body = {**body, "metadata": meta}
    return copy_json(body)


class Cache:
    """Thread-safe: kopf's handlers write from the event loop, reconciles read from threads.

    A body handed to ``put`` is kept as it is, not copied: every caller passes one it has just
    decoded (a watch event made plain, an API response) and keeps no reference to change later.
    What the cache hands out (``get``, ``select``, ``tombstone``) is a deep copy, so a reconcile
    may change what it read. Counting and tallying copy nothing: they run often (the step-pod
    cap, the gauges) over every object of a kind.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        observer: Observer | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        # Told of every body taken in that changed what the cache held, and every deletion, after
        # the cache holds it (outside the lock): the notifier derives its notifications from them. A
        # body equal to the one held (the watch's echo of the operator's own status patch, a watch's
        # relisting) holds no notification the one before did not: telling it again would only
        # derive them again, redacting every stopped run's message each time.
        self._observer = observer
        # Objects deleted lately, per kind, in the order seen: by uid (a uid is never reused),
        # or by name for a body without one; with the deletion's resourceVersion, and when.
        self._gone: dict[str, dict[str | tuple[str, str], tuple[int | None, float]]] = {}
        # Kept per kind, so a pass over one kind (counting step pods) never walks the others.
        self._objects: dict[str, dict[tuple[str, str], JSON]] = {}
        # Deleted pods' and Approvals' last bodies (by kind, namespace and name), in the order
        # seen, with when: a reconcile takes its run's (its Approval's) within moments; one
        # nobody took (a run deleted with its pods, a pod of a step long accounted) is dropped
        # after GONE_FOR, as a restart would drop it.
        self._tombstones: dict[Key, tuple[JSON, float]] = {}
        # The step-pod cap asks at every step (and for every run waiting for a slot): a count
        # kept as pods come and go, not a pass over every pod the runs ever had.
        self._active_steps: set[tuple[str, str]] = set()
        # Each run's pods by its label, as pods come and go: a reconcile asks for its run's pods
        # at every look, and a pass over every pod of a namespace at each of them grows with
        # the runs under way (10,000 runs: 10,000 pods walked per look, thousands of looks a
        # minute).
        self._pods_of_run: dict[tuple[str, str], set[str]] = {}
        # Objects forgotten as no longer this replica's (their shard moved), by uid, with when:
        # an answer to a write a reconcile sent before that must not bring one back; a watch
        # event (``admit``) does, once its shard is this replica's again.
        self._away: dict[str, float] = {}

    def put(self, kind: str, body: JSON) -> None:
        """Remember ``body`` unless a newer version of it is already known, it was deleted, or
        it was forgotten as another replica's."""
        uid = _uid(body)
        if uid is not None and uid in self._away:
            return
        if self._put(kind, body) and self._observer is not None:
            self._observer(kind, body, False)

    def admit(self, kind: str, body: JSON) -> None:
        """``put`` of a body this replica watches for (a watch event or a listing of its own
        shards): one forgotten earlier is remembered again."""
        uid = _uid(body)
        if uid is not None and self._away:
            with self._lock:
                self._away.pop(uid, None)
        self.put(kind, body)

    def forget(self, kind: str, where: Callable[[JSON], bool]) -> list[Key]:
        """Forget the objects of ``kind`` that ``where`` accepts, as no longer this replica's
        (not deleted: no tombstone, nobody told), and return their keys."""
        now = self._clock()
        with self._lock:
            objects = self._objects.get(kind, {})
            gone = [(ns, name) for (ns, name), body in objects.items() if where(body)]
            for namespace, name in gone:
                body = objects.pop((namespace, name))
                uid = _uid(body)
                if uid is not None:
                    self._away.pop(uid, None)  # re-inserted last: the dict stays in time order
                    self._away[uid] = now
                if kind == "Pod":
                    self._unindex(namespace, name, body)
                    self._active_steps.discard((namespace, name))
                    self._tombstones.pop((kind, namespace, name), None)
            for uid, when in list(self._away.items()):
                if now - when <= GONE_FOR:
                    break
                del self._away[uid]
        return [(kind, namespace, name) for namespace, name in gone]

    def holds(self, kind: str, namespace: str, name: str) -> bool:
        """Whether the cache holds the object (no copy made)."""
        with self._lock:
            return (namespace, name) in self._objects.get(kind, {})

    def _put(self, kind: str, body: JSON) -> bool:
        """``put``; whether ``body`` was taken and changed what the cache held."""
        _, namespace, name = key_of(kind, body)
        with self._lock:
            objects = self._objects.setdefault(kind, {})
            known = objects.get((namespace, name))
            new, old = _version(body), None if known is None else _version(known)
            if known is not None and new is not None and old is not None and new < old:
                return False
            if known is None and self._deleted_already(kind, (namespace, name), body):
                return False
            objects[(namespace, name)] = _slim(body)
            # Another resourceVersion is another body; the same one (or none) is compared.
            changed = known is None or new != old or (known is not body and known != body)
            if kind == "Pod":
                if known is not None:
                    self._unindex(namespace, name, known)
                label = _run_label(body)
                if label is not None:
                    self._pods_of_run.setdefault((namespace, label), set()).add(name)
                self._tombstones.pop((kind, namespace, name), None)
                if is_active_step_pod(body):
                    self._active_steps.add((namespace, name))
                else:
                    self._active_steps.discard((namespace, name))
            return changed

    def drop(self, kind: str, body: JSON) -> None:
        """The object was deleted; a pod or an Approval (``TOMBSTONED``) leaves its last body as
        a tombstone. Its identity is remembered for at least ``GONE_FOR`` seconds (until a
        deletion seen after that), so a late view of it is not taken for it."""
        with self._lock:
            self._drop(kind, body)
        if self._observer is not None:
            self._observer(kind, body, True)

    def forget_vanished(self, kind: str, namespace: str, name: str, uid: str) -> JSON | None:
        """The API server no longer has this object, though no watch said it was deleted (a
        watch that reconnects lists the objects again and never reports one deleted while it
        was away): drop it as deleted, its last body seen as its tombstone, and return that
        body. Nothing, and None, if the cache no longer holds that object (the watch reported
        the deletion meanwhile, or a new object of that name has another uid)."""
        with self._lock:
            body = self._objects.get(kind, {}).get((namespace, name))
            if body is None or _uid(body) != uid:
                return None
            self._drop(kind, body)
            gone = copy_json(body)
        if self._observer is not None:
            self._observer(kind, gone, True)
        return gone

    def _drop(self, kind: str, body: JSON) -> None:
        """``drop``, the caller holding the lock."""
        _, namespace, name = key_of(kind, body)
        now = self._clock()  # under the lock: the deletions stay in time order
        last = self._objects.get(kind, {}).pop((namespace, name), None)
        gone = self._gone.setdefault(kind, {})
        marker = _uid(body) or (namespace, name)
        # Told twice (a watch's deletion after the resync found the object gone): the first
        # left the tombstone, which a reconcile may have taken since; it must not come back.
        again = last is None and marker in gone
        gone.pop(marker, None)  # re-inserted last: the dict stays in time order
        gone[marker] = (_version(body), now)
        while gone:
            oldest = next(iter(gone))
            if now - gone[oldest][1] <= GONE_FOR:
                break
            del gone[oldest]
        if kind in TOMBSTONED:
            if not again:
                self._tombstones.pop((kind, namespace, name), None)
                self._tombstones[(kind, namespace, name)] = (_last(kind, last, body), now)
            while self._tombstones:
                first = next(iter(self._tombstones))
                if now - self._tombstones[first][1] <= GONE_FOR:
                    break
                del self._tombstones[first]
        if kind == "Pod":
            if last is not None:
                self._unindex(namespace, name, last)
            self._active_steps.discard((namespace, name))

    def _deleted_already(self, kind: str, where: tuple[str, str], body: JSON) -> bool:
        """Whether ``body`` is a view of an object whose deletion was seen already (an API
        response that arrived after the watch event): one of a deleted uid, or, for a body
        without a uid, a version no newer than its name's deletion (a newer one is a new object
        of that name, and the deletion is forgotten). The caller holds the lock."""
        gone = self._gone.get(kind)
        if not gone:
            return False
        uid = _uid(body)
        if uid is not None:
            return uid in gone
        deleted = gone.get(where)
        if deleted is None:
            return False
        version, new_version = deleted[0], _version(body)
        if version is not None and new_version is not None and new_version <= version:
            return True
        del gone[where]
        return False

    def get(self, kind: str, namespace: str, name: str) -> JSON | None:
        with self._lock:
            found = self._objects.get(kind, {}).get((namespace, name))
            return None if found is None else copy_json(found)

    def metadata(self, kind: str, namespace: str, name: str) -> JSON | None:
        """A copy of the object's ``metadata`` alone (a label read at every look copies no
        spec or status)."""
        with self._lock:
            found = self._objects.get(kind, {}).get((namespace, name))
            return None if found is None else copy_json(found.get("metadata") or {})

    def tombstone(self, namespace: str, name: str, *, kind: str = "Pod") -> JSON | None:
        """The last body of a pod (or an Approval) that was deleted, if this operator saw it go."""
        with self._lock:
            found = self._tombstones.get((kind, namespace, name))
            return None if found is None else copy_json(found[0])

    def forget_tombstone(self, namespace: str, name: str, *, kind: str = "Pod") -> None:
        with self._lock:
            self._tombstones.pop((kind, namespace, name), None)

    def select(
        self, kind: str, namespace: str | None = None, where: Callable[[JSON], bool] | None = None
    ) -> list[JSON]:
        with self._lock:
            found = [
                copy_json(body)
                for (ns, _), body in self._objects.get(kind, {}).items()
                if (namespace is None or ns == namespace) and (where is None or where(body))
            ]
        return found

    def keys(self, kind: str, where: Callable[[JSON], bool] | None = None) -> list[Key]:
        """The keys of ``kind``'s objects (those ``where`` accepts, if given)."""
        with self._lock:
            return [
                (kind, ns, name)
                for (ns, name), body in self._objects.get(kind, {}).items()
                if where is None or where(body)
            ]

    def keys_with(
        self, kind: str, by: Callable[[JSON], T], where: Callable[[JSON], bool] | None = None
    ) -> list[tuple[Key, T]]:
        """The keys of ``kind``'s objects (those ``where`` accepts), each with ``by`` of its body:
        a fact read under the lock, with no copy made."""
        with self._lock:
            return [
                ((kind, ns, name), by(body))
                for (ns, name), body in self._objects.get(kind, {}).items()
                if where is None or where(body)
            ]

    def count(self, kind: str, where: Callable[[JSON], bool]) -> int:
        with self._lock:
            return sum(1 for body in self._objects.get(kind, {}).values() if where(body))

    def active_step_pods(self) -> int:
        """How many step pods hold a step slot (``is_active_step_pod``)."""
        with self._lock:
            return len(self._active_steps)

    def tally(self, kind: str, by: Callable[[JSON], str]) -> dict[str, int]:
        """How many objects of ``kind`` fall under each value of ``by``."""
        counts: dict[str, int] = {}
        with self._lock:
            for body in self._objects.get(kind, {}).values():
                value = by(body)
                counts[value] = counts.get(value, 0) + 1
        return counts

    def step_pods(self, namespace: str, run_label: str) -> list[JSON]:
        """The pods labelled with ``run_label`` in ``namespace`` (copies), from the index."""
        with self._lock:
            pods = self._objects.get("Pod", {})
            names = self._pods_of_run.get((namespace, run_label), ())
            return [copy_json(pods[(namespace, name)]) for name in names]

    def count_step_pods(self, namespace: str, run_label: str, where: Callable[[JSON], bool]) -> int:
        """How many of the pods labelled ``run_label`` ``where`` accepts, copying none."""
        with self._lock:
            pods = self._objects.get("Pod", {})
            names = self._pods_of_run.get((namespace, run_label), ())
            return sum(1 for name in names if where(pods[(namespace, name)]))

    def active_step_pod_keys(self) -> list[tuple[str, str, str]]:
        """(namespace, name, uid) of each step pod holding a step slot, copying no body."""
        with self._lock:
            pods = self._objects.get("Pod", {})
            return [
                (ns, name, str(_uid(pods[(ns, name)]) or "")) for ns, name in self._active_steps
            ]

    def is_active_step_pod(self, namespace: str, name: str) -> bool:
        """Whether the pod ``namespace/name`` holds a step slot now."""
        with self._lock:
            return (namespace, name) in self._active_steps

    def _unindex(self, namespace: str, name: str, body: JSON) -> None:
        """Forget ``body``'s pod in the run index (the caller holds the lock)."""
        label = _run_label(body)
        if label is None:
            return
        names = self._pods_of_run.get((namespace, label))
        if names is not None:
            names.discard(name)
            if not names:
                del self._pods_of_run[(namespace, label)]


def _run_label(body: JSON) -> str | None:
    labels = body.get("metadata", {}).get("labels") or {}
    value = labels.get(RUN_LABEL)
    return None if value is None else str(value)
