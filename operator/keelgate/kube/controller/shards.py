"""Shards: which part of the runs a run belongs to when the operator's replicas share them
(``--shards N``; design: docs/operator.md, "Shards").

Why it exists: each replica drives the runs of the shards whose Leases it holds, and every
replica must put a run and everything made for it in the same shard, whoever computes it and
whenever. A run's shard is a stable hash of its namespace and name (a monitor's tick: of its
monitor's, so that the replica driving a monitor sees its ticks), written once onto the
AgentRun as ``keelgate.dev/shard=NN`` (``label_run``) and copied onto its step pods,
Reconciliations, Approvals and ticks as they are made (``resources.shard_labels``), so that a
replica taking a shard over lists its objects with a label selector the API server filters on.
A label already on a run is its shard, read modulo the count: changing the count never
separates a run from its objects. A step pod, a Reconciliation or an Approval belongs to its
run (``run_of``), whatever label it carries.

This module must never give one run two shards, never relabel a run whose label is valid (its
objects carry the same value), and never write anything of a run but that one label.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from keelgate.kube.api_failures import ApiFailure, Gone
from keelgate.kube.controller.ports import ApiServer, ClusterView, Key
from keelgate.kube.naming import SHARD_LABEL
from keelgate.kube.resources import controller_name, is_tick

log = logging.getLogger("keelgate.operator")

#: Label values are two digits ("00" to "99"), so at most this many shards.
MAX_SHARDS = 100


def hash_shard(namespace: str, name: str, count: int) -> int:
    """The shard of ``namespace/name`` among ``count``: the same in every process and release
    (Python's own ``hash`` of a string differs from one process to the next)."""
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % count


def shard_label(shard: int) -> str:
    """The label value naming ``shard``: two digits."""
    return f"{shard:02d}"


def labelled_shard(value: object) -> int | None:
    """The shard a label value names, or None for a missing or malformed one (anything but two
    ASCII digits: such a run is labelled afresh, its objects found by their run)."""
    if isinstance(value, str) and len(value) == 2 and value.isascii() and value.isdigit():
        return int(value)
    return None


def run_of(kind: str, body: Mapping[str, Any]) -> str:
    """The AgentRun a step pod, Reconciliation or Approval belongs to ("" if none): a pod's
    controlling owner, a decision's ``spec.runName``."""
    if kind == "Pod":
        return controller_name(body)
    spec = body.get("spec") or {}
    return str(spec.get("runName") or "") or controller_name(body)


@dataclass(frozen=True)
class Shards:
    """``count`` shards (``--shards``)."""

    count: int

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_SHARDS:
            raise ValueError(f"--shards must be between 1 and {MAX_SHARDS} (or 0: off)")

    def of_run(self, run: Mapping[str, Any]) -> int:
        """The shard of an AgentRun (body, or just its metadata under ``metadata``)."""
        meta = run.get("metadata") or {}
        labelled = labelled_shard((meta.get("labels") or {}).get(SHARD_LABEL))
        if labelled is not None:
            return labelled % self.count
        name = controller_name(run) if is_tick(run) else str(meta.get("name", ""))
        return hash_shard(str(meta.get("namespace", "")), name, self.count)

    def selector(self, shard: int) -> str:
        """The label selector of the objects labelled into ``shard`` (every value that is
        ``shard`` modulo the count: labels written under another count)."""
        values = ",".join(shard_label(v) for v in range(shard, MAX_SHARDS, self.count))
        return f"{SHARD_LABEL} in ({values})"

    def unlabelled(self) -> str:
        """The label selector of objects no shard label was written on yet."""
        return f"!{SHARD_LABEL}"


def label_run(api: ApiServer, cache: ClusterView, shards: Shards, key: Key) -> None:
    """Write the run's shard onto it, once (a run without a valid label): one patch of that
    label, its answer kept in the cache. A run gone meanwhile needs none; a refusal is told and
    tried again at the run's next look (the run is driven all the same: an unlabelled run is
    found by its hash, and listed by a replica taking its shard over as unlabelled)."""
    _, namespace, name = key
    meta = cache.metadata("AgentRun", namespace, name)
    if meta is None or meta.get("deletionTimestamp"):
        return
    if labelled_shard((meta.get("labels") or {}).get(SHARD_LABEL)) is not None:
        return
    value = shard_label(shards.of_run({"metadata": meta}))
    try:
        labelled = api.label("AgentRun", namespace, name, {SHARD_LABEL: value})
    except Gone:
        return
    except ApiFailure as failure:
        log.warning("AgentRun %s/%s: cannot label its shard (%s)", namespace, name, failure)
        return
    cache.put("AgentRun", labelled)
