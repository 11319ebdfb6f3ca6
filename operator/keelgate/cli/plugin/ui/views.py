"""What the decision inbox shows, read as the user: the waiting decisions, the runs, one run.

Why it exists: the web pages and their tests need the same facts the plugin's commands read,
gathered across the namespaces the user can see, without any HTML. Everything from the cluster
is read through ``ClusterClient`` as the kubeconfig's user; a run's recorded arguments and its
audit trail come from the store, whose URL is ``--store`` or else the namespace's Secret
``keelgate-store`` (read as the user: who may not read it sees why instead).

It must never write (decisions go through ``commands.decide``), never show an argument or a
message that holds a secret (everything shown goes through ``keelgate.core.redaction``), and
never put a store URL or password in what it returns.
"""

from __future__ import annotations

import base64
import datetime as dt
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from keelgate.cli.plugin import standing
from keelgate.cli.plugin.client import ClusterClient, Refused, SecretReader
from keelgate.cli.plugin.commands import not_executed_after
from keelgate.cli.plugin.listing import age, budget_use, decided, waiting_count
from keelgate.cli.plugin.target import Target
from keelgate.core.redaction import redact_text, redact_value
from keelgate.core.state import planned_actions
from keelgate.errors import KeelgateError
from keelgate.kube.times import parse_time

JSON = dict[str, Any]

#: The Secret ``keelgate tenant add`` writes in a tenant's namespace (key ``url``).
STORE_SECRET = "keelgate-store"
#: How long a "may I patch" answer is reused: the buttons follow an RBAC change within it.
MAY_TTL = 10.0
#: How long a verified trail is shown without walking the chain again, while no new checkpoint
#: came: a row changed behind the store's back is caught within it.
TRAIL_TTL = 60.0


@dataclass(frozen=True)
class Recorded:
    """A run's facts from the store: the current plan's arguments, and the audit trail."""

    args: Mapping[str, Any] = field(default_factory=dict)  # action id -> redacted arguments
    # action id -> the call's Idempotency-Key (a digest of its tool and real arguments): what a
    # decision on the arguments shown is bound to.
    keys: Mapping[str, str] = field(default_factory=dict)
    # action id -> what people said deciding it ("bob approved: sku checked"), as the run's
    # record holds their decisions (redacted): only decisions the run recorded, with a note.
    notes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    events: tuple[JSON, ...] = ()
    verified: bool | None = None
    problems: tuple[str, ...] = ()
    unavailable: str = ""  # why the store could not be read ("" when it was)


@dataclass(frozen=True)
class Waiting:
    """One decision that waits for a person: an unknown outcome or an approval."""

    kind: str  # Reconciliation | Approval
    namespace: str
    name: str
    run: str
    action: str
    tool: str
    side_effect: str
    key: str
    created: str
    waited: str
    not_executed_after: str
    said: str  # what the operator (or its confirmer) says about it
    args: Any  # as recorded, redacted; None when not available
    args_unavailable: str
    may: bool  # RBAC lets the user patch it
    why_not: str  # why RBAC does not ("" when it does)
    # An approval's count ("1 of 2"), who counts, when the first stops counting, its rule.
    progress: str = ""
    approved_by: tuple[str, ...] = ()
    expires_at: str = ""
    asks: str = ""
    # Why it is not the user's to decide though RBAC lets them, in one line, by the run's rule
    # in force (``standing``): the run's creator, in no group the rule names, decided
    # already, a ServiceAccount; "" when it is theirs.
    not_yours: str = ""
    may_deny: bool = False  # not theirs to approve, but they may deny it
    reason_to_deny: bool = False  # the rule asks a reason (a note) to deny
    notes: tuple[str, ...] = ()  # what people said deciding it so far, as the run records it

    @property
    def yours(self) -> bool:
        """Whether it waits for this user: they may decide it, and it would count."""
        return self.may and not self.not_yours

    @property
    def ident(self) -> str:
        return f"{self.kind.lower()}-{self.namespace}-{self.name}"

    @property
    def pick(self) -> str:
        """What a checkbox of the batch form carries: the approval and the Idempotency-Key of
        the call shown (a decision on other arguments is refused)."""
        return f"{self.namespace}|{self.run}|{self.action}|{self.key}"


@dataclass(frozen=True)
class RunRow:
    namespace: str
    name: str
    phase: str
    reason: str
    iteration: int
    budgets: tuple[tuple[str, str, str], ...]  # (what, used, limit)
    age: str
    waiting: int


@dataclass(frozen=True)
class RunPage:
    run: JSON
    conditions: tuple[JSON, ...]
    pods: tuple[JSON, ...]
    decisions: tuple[JSON, ...]
    recorded: Recorded


class Views:
    """The inbox's reads for one user (one kubeconfig context), across namespaces."""

    def __init__(self, target: Target, *, store: str = "") -> None:
        self.target = target
        self.store = store
        self._home = ClusterClient(target)
        self._clients: dict[str, ClusterClient] = {target.namespace: self._home}
        self._may: dict[tuple[str, str], tuple[float, bool, str]] = {}
        self._trails: dict[tuple[str, str], tuple[int, float, Recorded]] = {}
        self._lock = threading.Lock()
        self._identity: tuple[str, tuple[str, ...]] | None = None

    # who and where

    def identity(self) -> tuple[str, tuple[str, ...]]:
        """Who the API server says the user is, and the groups it authenticated them in."""
        if self._identity is None:
            self._identity = self._home.identity()
        return self._identity

    def user(self) -> str:
        return self.identity()[0]

    def client(self, namespace: str) -> ClusterClient:
        with self._lock:
            found = self._clients.get(namespace)
            if found is None:
                found = ClusterClient(replace(self.target, namespace=namespace), self._home.client)
                self._clients[namespace] = found
            return found

    def all_namespaces(self) -> bool:
        """Whether the user may list runs in every namespace (else: the context's only)."""
        allowed, _ = self._may_cached("", "list", "agentruns", "")
        return allowed

    def listed(self, kind: str) -> list[JSON]:
        if self.all_namespaces():
            return self._home.listed(kind, all_namespaces=True)
        return self._home.listed(kind)

    def may_decide(self, namespace: str, kind: str) -> tuple[bool, str]:
        plural = f"{kind.lower()}s"
        return self._may_cached(namespace, "patch", plural, "")

    def _may_cached(self, namespace: str, verb: str, resource: str, name: str) -> tuple[bool, str]:
        key = (namespace, f"{verb} {resource}")
        now = time.monotonic()
        with self._lock:
            hit = self._may.get(key)
        if hit is not None and now - hit[0] < MAY_TTL:
            return hit[1], hit[2]
        # An access review without a namespace asks about every namespace at once.
        allowed, reason = self.client(namespace).may(verb, resource, name)
        with self._lock:
            self._may[key] = (now, allowed, reason)
        return allowed, reason

    # the pages' facts

    def inbox(self) -> list[Waiting]:
        """Every undecided Reconciliation and Approval the user can see, oldest first, each
        with whether it is theirs to decide and why not (``standing``)."""
        now = dt.datetime.now(dt.UTC)
        items = [
            obj
            for kind in ("Reconciliation", "Approval")
            for obj in self.listed(kind)
            if not decided(obj)
        ]
        items.sort(
            key=lambda o: (o["metadata"].get("creationTimestamp") or "", o["metadata"]["name"])
        )
        runs = {
            (r["metadata"].get("namespace", ""), r["metadata"]["name"]): r
            for r in self.listed("AgentRun")
        }
        recorded: dict[tuple[str, str], Recorded] = {}
        user, groups = self.identity() if items else ("", ())
        found = []
        for obj in items:
            meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
            namespace, run_name = meta.get("namespace", ""), str(spec.get("runName", ""))
            run = runs.get((namespace, run_name)) or {}
            if (namespace, run_name) not in recorded:
                recorded[(namespace, run_name)] = self.recorded(namespace, run_name, trail=False)
            facts = recorded[(namespace, run_name)]
            action = str(spec.get("action", ""))
            may, why = self.may_decide(namespace, obj["kind"])
            judged = (
                standing.of_approval(obj, run or None, user=user, groups=groups)
                if obj["kind"] == "Approval" and may
                else None
            )
            after = str(status.get("notExecutedAfter") or "") or not_executed_after(run, action)
            # The key of the call whose arguments are shown (the store's plan), else the
            # object's own.
            key = facts.keys.get(action) or str(spec.get("idempotencyKey", ""))
            found.append(
                Waiting(
                    kind=obj["kind"],
                    namespace=namespace,
                    name=meta["name"],
                    run=run_name,
                    action=action,
                    tool=str(spec.get("tool", "")),
                    side_effect=_side_effect(run, str(spec.get("tool", ""))),
                    key=key,
                    created=str(meta.get("creationTimestamp") or ""),
                    waited=age(meta.get("creationTimestamp"), now),
                    not_executed_after=after,
                    said=redact_text(str(status.get("message") or "")),
                    args=facts.args.get(action),
                    args_unavailable=facts.unavailable
                    or ("" if action in facts.args else "not in the run's current plan"),
                    may=may,
                    why_not=why
                    or (
                        f"RBAC: no patch on {obj['kind'].lower()}s in {namespace}"
                        if not may
                        else ""
                    ),
                    progress=str(status.get("progress") or ""),
                    approved_by=tuple(str(b) for b in status.get("approvedBy") or ()),
                    expires_at=str(status.get("expiresAt") or ""),
                    asks=str(status.get("asks") or ""),
                    not_yours="" if judged is None or judged.decide else judged.why,
                    may_deny=judged is not None and judged.deny,
                    reason_to_deny=judged is not None and judged.reason_to_deny,
                    notes=tuple(facts.notes.get(action, ())),
                )
            )
        return found

    def runs(self) -> list[RunRow]:
        now = dt.datetime.now(dt.UTC)
        rows = []
        for run in self.listed("AgentRun"):
            meta, spec, status = run["metadata"], run.get("spec") or {}, run.get("status") or {}
            shown_phase = str(status.get("phase") or "Pending")
            iterations = (
                "iterations",
                str(status.get("iteration") or 0),
                str((spec.get("budget") or {}).get("maxIterations") or ""),
            )
            budgets = (iterations, *budget_use(run))
            rows.append(
                RunRow(
                    namespace=str(meta.get("namespace", "")),
                    name=meta["name"],
                    phase=shown_phase,
                    reason=str(status.get("stopReason") or ""),
                    iteration=int(status.get("iteration") or 0),
                    budgets=budgets,
                    age=age(meta.get("creationTimestamp"), now),
                    waiting=waiting_count(run),
                )
            )
        rows.sort(key=lambda r: (r.namespace, r.name))
        return rows

    def run_page(self, namespace: str, name: str) -> RunPage:
        client = self.client(namespace)
        run = client.agentrun(name)
        status = run.get("status") or {}
        decisions = tuple(
            obj for kind in ("Reconciliation", "Approval") for obj in client.decisions(kind, name)
        )
        return RunPage(
            run=run,
            conditions=tuple(
                {**c, "message": redact_text(str(c.get("message") or ""))}
                for c in status.get("conditions") or ()
            ),
            pods=tuple(client.step_pods(name)),
            decisions=decisions,
            recorded=self.recorded(namespace, name, trail=True),
        )

    # the store

    def recorded(self, namespace: str, run: str, *, trail: bool) -> Recorded:
        """The run's plan arguments (redacted) and, with ``trail``, its verified audit trail.

        A trail is verified again only when the run has a new checkpoint (its events commit
        with one) or the last check is TRAIL_TTL old: a page refreshed at every watch event
        then costs one checkpoint read, not a walk of the whole chain."""
        try:
            with self._stores(namespace) as stores:
                from keelgate.core.loop import Loop

                checkpoint = stores.checkpoints.load(namespace, run)
                args: dict[str, Any] = {}
                keys: dict[str, str] = {}
                notes: dict[str, tuple[str, ...]] = {}
                if checkpoint is not None:
                    args, keys = _plan_args(checkpoint.state)
                    notes = _notes(checkpoint.state)
                if not trail:
                    return Recorded(args=args, keys=keys, notes=notes)
                seq = checkpoint.seq if checkpoint is not None else -1
                now = time.monotonic()
                with self._lock:
                    hit = self._trails.get((namespace, run))
                if hit is not None and hit[0] == seq and now - hit[1] < TRAIL_TTL:
                    return hit[2]
                events: list[JSON] = []
                report = Loop(stores=stores).verify_audit(
                    namespace, run, each=lambda e: events.append(e.to_json())
                )
                found = Recorded(
                    args=args,
                    keys=keys,
                    notes=notes,
                    events=tuple(events),
                    verified=report.ok,
                    problems=tuple(report.problems),
                )
                with self._lock:
                    self._trails[(namespace, run)] = (seq, now, found)
                return found
        except _NoStore as why:
            return Recorded(unavailable=str(why))
        except KeelgateError as error:
            return Recorded(unavailable=f"the store could not be read: {redact_text(str(error))}")

    @contextmanager
    def _stores(self, namespace: str) -> Iterator[Any]:
        from keelgate.stores import open_stores

        url = self.store or self._store_url(namespace)
        stores = open_stores(url, pooled=False)
        try:
            yield stores
        finally:
            stores.close()

    def _store_url(self, namespace: str) -> str:
        reader = StoreAddress(replace(self.target, namespace=namespace), self._home.client)
        return reader.url()


class StoreAddress(SecretReader):
    """The one Secret the inbox reads: the namespace's ``keelgate-store`` (key ``url``), as the
    user, to reach the store its runs are kept in. Its data is never shown or logged."""

    def url(self) -> str:
        try:
            secret = self.read(STORE_SECRET)
        except Refused:
            raise _NoStore(
                f"you may not read Secret {STORE_SECRET} in {self.namespace}, where the store's "
                "address is kept"
            ) from None
        if secret is None:
            raise _NoStore(
                f"no Secret {STORE_SECRET} in {self.namespace} (start the inbox with --store)"
            )
        data = (secret.data or {}).get("url")
        if not data:
            raise _NoStore(f"Secret {self.namespace}/{STORE_SECRET} has no key url")
        return base64.b64decode(data).decode()


class _NoStore(Exception):
    """The store cannot be reached for this namespace, and why (no URL in it)."""


def _plan_args(state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Action id -> redacted arguments, and action id -> Idempotency-Key (what a decision on
    those arguments is bound to), for the actions of the run's current plan."""
    actions = planned_actions(state)
    arguments = {ident: redact_value(a.get("args") or {}) for ident, a in actions.items()}
    return arguments, {ident: str(a.get("key") or "") for ident, a in actions.items()}


def _notes(state: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """Action id -> "bob approved: sku checked" for each decision with a note the checkpoint
    document records (every decision kept in it, in order; an older checkpoint's one decision
    per action too), redacted again on the way out."""
    found: dict[str, tuple[str, ...]] = {}
    for action, recorded in (state.get("approvals") or {}).items():
        made = [recorded] if isinstance(recorded, Mapping) else list(recorded or ())
        lines = tuple(
            f"{d.get('by') or '?'} {'approved' if d.get('approved') is True else 'denied'}: "
            f"{redact_text(str(d['note']))}"
            for d in made
            if isinstance(d, Mapping) and d.get("note")
        )
        if lines:
            found[str(action)] = lines
    return found


def _side_effect(run: Mapping[str, Any], tool: str) -> str:
    for entry in (run.get("spec") or {}).get("tools") or ():
        if entry.get("name") == tool:
            return str(entry.get("sideEffect") or "")
    return ""


def moment_passed(when: str, now: dt.datetime | None = None) -> bool:
    moment = parse_time(when)
    return moment is None or moment <= (now or dt.datetime.now(dt.UTC))
