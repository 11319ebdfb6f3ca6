"""Names and labels of everything the operator creates, computed, never remembered.

A step pod's name is a function of its run, step and attempt, and a Reconciliation's or an
Approval's of its run and action: two operators (or one restarted mid-create) compute the same
name, so the API server's uniqueness is what keeps a step from running twice as two pods. Names
stay valid Kubernetes names however long the run's name is. An earlier release named the
objects of an action without a digest, and two actions could share such a name; an object made
before an upgrade is still found under it (``earlier_object_name``, looked up by the controller
only for the very run, action and tool the object names). This module must never produce two
names for one thing, or one name for two things of the same namespace.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

GROUP = "keelgate.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

#: Labels on every object the operator creates.
RUN_LABEL = f"{GROUP}/run"
STEP_LABEL = f"{GROUP}/step"
ATTEMPT_LABEL = f"{GROUP}/attempt"
MONITOR_LABEL = f"{GROUP}/monitor"
#: The round an Approval asks in, on those of an action asked afresh (``action_object_name``).
ROUND_LABEL = f"{GROUP}/round"
#: The shard a run is in (``--shards``; ``kube.controller.shards``), two digits, on the AgentRun
#: and on everything made for it.
SHARD_LABEL = f"{GROUP}/shard"
MANAGED_BY = {"app.kubernetes.io/managed-by": "keelgate"}
#: What marks a pod as a step pod (the cap on step pods counts these).
STEP_POD_LABEL, STEP_POD_NAME = "app.kubernetes.io/name", "keelgate-step"

#: The finalizer the operator puts on each Approval it makes: an Approval deleted while no
#: operator looks stays until one has recorded every decision on it (a deny added just before
#: a deletion is never lost), or none can count any more.
DECISIONS_FINALIZER = f"{GROUP}/decisions"

#: The annotation that arms failpoints in the next step pod (contract section 3).
FAILPOINTS_ANNOTATION = f"{GROUP}/failpoints"

_MAX_NAME = 253  # a DNS subdomain: the limit for pods and custom objects
_MAX_LABEL = 63
_DIGEST = 10  # hex digits of the digest that keeps two actions' object names apart


def _fit(name: str, limit: int) -> str:
    """``name`` if it fits, else a prefix plus a hash of the whole (stable, unique enough)."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: limit - 11].rstrip('-.')}-{digest}"


def _dns(text: str) -> str:
    """Lowercase letters, digits and '-' only (tool names may hold '_' and capitals)."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "x"


def step_pod_name(run: str, step: int, attempt: int) -> str:
    """``<run>-s<step>-a<attempt>``: deterministic per run, step and attempt."""
    suffix = f"-s{step}-a{attempt}"
    return _fit(run, _MAX_NAME - len(suffix)) + suffix


def earlier_object_name(run: str, action: str, tool: str) -> str:
    """The name an earlier release gave the Reconciliation or Approval of one action, and the
    readable part of today's: ``<run>-<iteration>-<tool>`` for the first action of an
    iteration (``restock-3-place-order``), ``<run>-<iteration>-<index>-<tool>`` for the
    others. It alone can be the same for two actions, so it names nothing made today."""
    iteration, _, index = action.partition(":")
    middle = iteration if index in ("", "0") else f"{iteration}-{index}"
    return _fit(f"{run}-{middle}-{_dns(tool)}", _MAX_NAME)


def action_object_name(run: str, action: str, tool: str, *, round: int = 1) -> str:
    """The Reconciliation or Approval of one action: ``earlier_object_name`` and a digest of
    the run, action and tool as they are (``restock-3-place-order-5d41402abc``). The readable
    part alone can be the same for two actions (run ``pay`` action 1:1 of tool ``x``, run
    ``pay-1`` action 1:0 of ``x`` and run ``pay`` action 1:0 of ``1-x`` all read
    ``pay-1-1-x``; ``place_order`` and ``place-order`` read alike), and an object taken for
    another's would settle or approve the wrong call: the digest, over a separator none of
    them can hold, tells them apart, and the name fits whatever their lengths. An action's
    Reconciliation and Approval share the name (they are of different kinds).

    ``round``: an action asked afresh (its approvals all stopped counting before the call ran)
    has one Approval a round, the first under the name above, the next ones with ``-r<round>``
    after the digest (``restock-3-place-order-5d41402abc-r2``): a digest is hexadecimal, so no
    first round's name ends the way a later round's does."""
    digest = hashlib.sha256(f"{run}\0{action}\0{tool}".encode()).hexdigest()[:_DIGEST]
    tail = f"-{digest}" if round == 1 else f"-{digest}-r{round}"
    return f"{_fit(earlier_object_name(run, action, tool), _MAX_NAME - len(tail))}{tail}"


def approval_round(approval: Mapping[str, Any]) -> int:
    """The round an Approval asks in, as its name says: ``k`` when its name is the one
    ``action_object_name`` gives round ``k`` (k > 1) of its spec's run, action and tool, else 1
    (the first round's name, an earlier release's, or any other). Names cannot change, so
    nobody can move an object to another round."""
    meta, spec = approval.get("metadata") or {}, approval.get("spec") or {}
    name = str(meta.get("name") or "")
    run, action, tool = (str(spec.get(k) or "") for k in ("runName", "action", "tool"))
    head, _, number = name.rpartition("-r")
    if not head or not number.isascii() or not number.isdigit() or number.startswith("0"):
        return 1
    found = int(number)
    return found if found > 1 and action_object_name(run, action, tool, round=found) == name else 1


def label_value(text: str) -> str:
    """A label value for a name (label values are at most 63 characters)."""
    return _fit(text, _MAX_LABEL)
