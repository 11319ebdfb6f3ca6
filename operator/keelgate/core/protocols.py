"""The seams of Keelgate: small protocols with interchangeable implementations.

A storage backend is one module in ``keelgate.stores`` implementing these; a tool or a confirmer
is any object of the right shape. Nothing here may import a driver, a client or Kubernetes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

from keelgate.core.audit import AuditDraft, AuditEvent
from keelgate.core.spec import LoopSpec
from keelgate.core.types import KeyRecord, Outcome, SideEffect, UnknownAction


@dataclass(frozen=True)
class Checkpoint:
    tenant: str
    run: str
    seq: int
    state: Mapping[str, Any]


@dataclass(frozen=True)
class RunRef:
    tenant: str
    run: str
    seq: int


@runtime_checkable
class CheckpointStore(Protocol):
    """The latest checkpoint of each run, as JSON.

    ``save`` is atomic and refuses (``StaleCheckpoint``) a ``seq`` that is not newer than the one
    stored: that is how a stale writer learns it lost. ``load`` returns None for an unknown run.
    """

    def save(self, tenant: str, run: str, seq: int, state: Mapping[str, Any]) -> None: ...

    def load(self, tenant: str, run: str) -> Checkpoint | None: ...

    def runs(self, tenant: str | None = None) -> list[RunRef]: ...

    def close(self) -> None: ...


@runtime_checkable
class RunRevisions(Protocol):
    """How far each run's records have moved, for many runs in one read: the checkpoint's
    ``seq`` and the audit chain's last ``seq`` (0 where there is none). A decision made outside
    the operator (``keelgate reconcile``, ``keelgate approve``, Python) moves one of them, and
    nothing else tells the operator of it; reading every waiting run's checkpoint to find out
    would cost a query per run at every resync. Runs the store does not have are left out."""

    def revisions(
        self, runs: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[int, int]]: ...


@runtime_checkable
class IdempotencyStore(Protocol):
    """Durable records of every PROPOSE and WRITE, keyed by (tenant, idempotency key).

    ``claim`` atomically records a new key ``in_flight`` owned by this store's process and returns
    None; if the key exists it returns the record instead, with an in-flight key whose owner is
    gone read as ``outcome_unknown``. Ownership must be judged soundly across processes and hosts:
    a live owner must never be read as gone.
    """

    def claim(
        self,
        tenant: str,
        key: str,
        *,
        run: str,
        action: str,
        tool: str,
        event: AuditDraft | None = None,
        deadline_in: float | None = None,
        after: int | None = None,
    ) -> KeyRecord | None:
        """``event``, when given (a store that also holds the run's audit chain), is appended
        to the chain in the same transaction, only if this call claims the key: the record of
        a WRITE being sent is then as durable as the claim itself.

        ``deadline_in``, when given, records the claim's write deadline that many seconds after
        the claim on the store's own clock (``KeyRecord.deadline``); ``settle`` refuses "not
        executed" until it has passed there (``SettleTooEarly``).

        ``after``, when given (a store that also holds the run's checkpoints:
        ``Capabilities.claim_after_checkpoint``), is the checkpoint the action was planned
        from: the key is claimed only while the run's checkpoint is still that one, in the
        claim's own transaction; once it has moved on, ``StaleClaim`` is raised (a key already
        on record is returned as ever)."""
        ...

    def complete(self, tenant: str, key: str, result: Any) -> bool:
        """Record a claimed key done, with the result to replay. False if it is no longer this
        store's in-flight key (its owner session was lost and someone settled it meanwhile):
        then the settlement stands and nothing is written."""
        ...

    def hold(self) -> Callable[[], None]:
        """Keep this store's owner alive until the returned function is called, even across
        ``close``: a call this process started (a timed-out WRITE still running on a worker)
        may still change its key, so the key must keep reading as live and its end must still
        be recordable. ``close`` while held is deferred to the last release."""
        ...

    def release(self, tenant: str, key: str) -> None:
        """Give up ownership of a claimed key whose outcome is unknown (a timed-out WRITE)."""
        ...

    def forget(self, tenant: str, key: str) -> bool:
        """Drop a claimed key whose call was definitely refused (nothing happened), so the same
        call may be made again later; True if it was dropped. Only a key in flight under the
        owner this store holds live now is dropped: once its owner session was lost, the key
        read unknown to everyone, a stop may name it and a person may be asked about it, so it
        stays for them (False)."""
        ...

    def settle(self, tenant: str, key: str, *, executed: bool, by: str, source: str) -> KeyRecord:
        """Settle an ``outcome_unknown`` key: completed if executed, else abandoned.

        Raises ``SettleError`` for any other state, so a decision can never be changed, and
        ``SettleTooEarly`` for "not executed" before the key's deadline has passed on the
        store's clock (its call may still be sent until then).
        """
        ...

    def get(self, tenant: str, key: str) -> KeyRecord | None: ...

    def close(self) -> None: ...


@runtime_checkable
class RunLock(Protocol):
    """A store that lets one driver at a time drive a run (an idempotency store may offer it).

    ``lock_run`` makes the caller the run's only driver and returns the function that ends
    that, or returns None at once while another driver holds the run: in another process, on
    another host, or another store object in this one. A driver that dies in any way releases
    the run by the kernel's or the server's doing, never by a timeout, so a crash never leaves
    a run busy.
    """

    def lock_run(self, tenant: str, run: str) -> Callable[[], None] | None: ...


@dataclass(frozen=True)
class Ownership:
    """Who drives a run, as the store records it: ``holder`` under ``epoch``, its lease
    ``lease_left`` seconds from lapsing (on the store's clock) when this was read."""

    tenant: str
    run: str
    holder: str
    epoch: int
    lease_left: float


@runtime_checkable
class RunOwners(Protocol):
    """A store that records one driver per run as (holder, epoch) under a lease, and fences
    every write with it (design: docs/stores.md, "Ownership and epochs").

    ``take`` makes ``holder`` the run's driver under a new epoch, if nobody else's lease is
    live, and from then on this store object carries that epoch on every write of the run;
    otherwise it raises ``RunBusy`` naming the holder and how long its lease is live. ``renew``
    extends the lease of an ownership still current, and raises ``StaleEpoch`` once another
    holder has taken the run; ``renew_held`` extends every live lease of one holder at once.
    ``carry`` makes this store write under an epoch taken elsewhere (a step process under its
    operator's). ``holder_of`` reads who holds it. ``let_go`` ends
    the lease at once, so the next holder need not wait for it. A write of the run started
    under an epoch the store no longer records is refused with ``StaleEpoch``, and an in-flight
    key claimed under such an epoch reads as an unknown outcome, whoever its owner is and
    whether or not it lives.
    """

    def take(self, tenant: str, run: str, *, holder: str, lease: float) -> Ownership: ...

    def renew(self, ownership: Ownership, *, lease: float) -> Ownership: ...

    def renew_held(self, holder: str, *, lease: float) -> list[Ownership]:
        """Renew every live lease of ``holder`` at once (one commit per renewal period, however
        many runs it holds); what it holds afterwards."""
        ...

    def carry(self, tenant: str, run: str, epoch: int | None) -> None: ...

    def let_go(self, ownership: Ownership) -> None: ...

    def holder_of(self, tenant: str, run: str) -> Ownership | None: ...


@runtime_checkable
class AuditLog(Protocol):
    """Append-only hash-chained events per run (see ``keelgate.core.audit``).

    ``append`` seals each draft after the run's current head in one transaction; a draft whose
    ``key`` is already on the chain is skipped, so re-appending after a crash is harmless.
    """

    def append(self, tenant: str, run: str, drafts: Sequence[AuditDraft]) -> None: ...

    def events(self, tenant: str, run: str) -> list[AuditEvent]: ...

    def iter_events(
        self, tenant: str, run: str, *, after: int = 0, page: int = ...
    ) -> Iterator[AuditEvent]:
        """The run's events with sequence numbers above ``after``, in order, read from the store
        ``page`` at a time, so a chain of any length is read without holding it whole. An event
        whose stored data cannot be decoded raises ``keelgate.errors.UnreadableEvent``; reading
        on with ``after`` set to its sequence number continues past it."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RecordedSpec:
    """The spec a run is to be driven with, as recorded by whoever drives it from outside."""

    tenant: str
    run: str
    source: str  # who it came from, e.g. the AgentRun object's UID
    generation: int  # that source's version of it, e.g. the object's metadata.generation
    spec: Mapping[str, Any]  # LoopSpec.to_json()


@runtime_checkable
class SpecStore(Protocol):
    """The spec each run is driven with, recorded before the process that drives it starts.

    The operator records an AgentRun's spec here before it creates a step pod, and the step reads
    it from here: a pod needs the store and nothing else (no API access, no manifest in its
    arguments). ``record_spec`` refuses (False) a generation older than the one stored for the
    same source, so a stale writer can never take back a newer spec (an added approval rule, a
    lowered budget).
    """

    def record_spec(
        self, tenant: str, run: str, spec: Mapping[str, Any], *, source: str, generation: int
    ) -> bool: ...

    def recorded_spec(self, tenant: str, run: str) -> RecordedSpec | None: ...

    def close(self) -> None: ...


@runtime_checkable
class CheckpointLog(Protocol):
    """A backend that holds checkpoints and the audit chain together can save a checkpoint and
    append the events it carries in one transaction: one durable commit instead of two."""

    def save_with_events(
        self,
        tenant: str,
        run: str,
        seq: int,
        state: Mapping[str, Any],
        drafts: Sequence[AuditDraft],
    ) -> None: ...


@dataclass(frozen=True)
class Completion:
    """A WRITE's result to record against its idempotency key, in the commit of the checkpoint
    that records the same result (nothing happens outside the process between the two)."""

    key: str
    result: Mapping[str, Any]


@runtime_checkable
class CompletingLog(CheckpointLog, Protocol):
    """A backend that also holds the idempotency keys can complete them in that transaction:
    a WRITE's completion, its action checkpoint and its observation are one durable commit."""

    def save_completing(
        self,
        tenant: str,
        run: str,
        seq: int,
        state: Mapping[str, Any],
        drafts: Sequence[AuditDraft],
        completions: Sequence[Completion],
    ) -> tuple[str, ...]:
        """``save_with_events``, and each key completed as ``IdempotencyStore.complete`` would,
        in one transaction. Returns the keys whose completion did not land (settled by someone
        else meanwhile): the checkpoint is saved all the same. A stale save still completes the
        keys (their calls ran), then raises ``StaleCheckpoint``."""
        ...


@runtime_checkable
class SettlingLog(Protocol):
    """A key store that also holds the audit chain can settle a key and append the decision's
    event in one transaction: the decision is on the chain, written by whoever made it, the
    moment it takes effect."""

    def settle(
        self,
        tenant: str,
        key: str,
        *,
        executed: bool,
        by: str,
        source: str,
        event: AuditDraft | None = None,
    ) -> KeyRecord:
        """``IdempotencyStore.settle``, and ``event`` appended to the key's run's chain (unless
        its key is on it already) in the same transaction."""
        ...


@dataclass(frozen=True)
class Capabilities:
    """What a set of stores can do beyond the protocols, declared by whoever assembles them
    (``open_stores``, ``Stores.of``), never inferred: the loop trusts each promise, and a
    promise a backend does not keep would lose audit events.

    Nothing is promised by default, and that is always safe: events then ride in the
    checkpoint's outbox and are appended after it (re-appended on resume after a crash).
    """

    # ``checkpoints.save_with_events`` saves a checkpoint and appends its events to ``audit``'s
    # chain in one transaction (one commit; never one without the other).
    checkpoint_with_events: bool = False
    # ``idempotency.claim(event=...)`` appends the event to ``audit``'s chain in the claim's own
    # transaction, only if the claim wins: a WRITE's start is on the chain before it is sent.
    claim_with_event: bool = False
    # ``checkpoints.save_completing`` completes idempotency keys in the checkpoint's transaction
    # (the keys live in the same database): a WRITE's completion rides with the checkpoint that
    # records its result. Needs ``checkpoint_with_events``.
    checkpoint_with_completion: bool = False
    # ``idempotency.settle(event=...)`` appends the event (the decision's ``loop.reconciled``) to
    # ``audit``'s chain in the settlement's own transaction: the decision is recorded by whoever
    # made it, never left for a later process (a tenant's step pod) to write from the key.
    settle_with_event: bool = False
    # ``idempotency.claim(after=seq)`` claims only while the run's checkpoint in
    # ``checkpoints`` is still ``seq`` (the keys live in the same database), in the claim's
    # own transaction: a process that was held up while another drove the run on never claims.
    claim_after_checkpoint: bool = False


class Backend(CheckpointStore, IdempotencyStore, AuditLog, SpecStore, Protocol):
    """One object serving every role, declaring what it can do when it does (``Stores.of``)."""

    @property
    def capabilities(self) -> Capabilities: ...


@dataclass(frozen=True)
class Stores:
    """The three stores a loop needs, and where driven runs' specs are recorded (``specs``,
    for the operator and its step pods); one backend object may serve all of them
    (``Stores.of``). ``capabilities`` is what they promise together."""

    checkpoints: CheckpointStore
    idempotency: IdempotencyStore
    audit: AuditLog
    specs: SpecStore | None = None
    capabilities: Capabilities = Capabilities()

    def __post_init__(self) -> None:
        if self.capabilities.checkpoint_with_events and not isinstance(
            self.checkpoints, CheckpointLog
        ):
            raise TypeError("checkpoint_with_events is declared, but checkpoints cannot do it")
        if self.capabilities.checkpoint_with_completion and not (
            self.capabilities.checkpoint_with_events
            and isinstance(self.checkpoints, CompletingLog)
            # One object in both roles: its keys are in the checkpoints' database.
            and (self.checkpoints is cast(object, self.idempotency))
        ):
            raise TypeError(
                "checkpoint_with_completion is declared, but checkpoints cannot complete the keys"
            )
        if self.capabilities.claim_after_checkpoint and (
            self.checkpoints is not cast(object, self.idempotency)
        ):
            raise TypeError(
                "claim_after_checkpoint is declared, but the keys are not in the checkpoints' store"
            )

    @classmethod
    def of(cls, backend: Backend) -> Stores:
        """One backend in every role, with the capabilities it declares."""
        return cls(backend, backend, backend, backend, backend.capabilities)

    @property
    def joint(self) -> CheckpointLog | None:
        """The checkpoint store that commits a checkpoint with its events, if one is declared."""
        if self.capabilities.checkpoint_with_events:
            assert isinstance(self.checkpoints, CheckpointLog)  # checked when constructed
            return self.checkpoints
        return None

    @property
    def settling(self) -> SettlingLog | None:
        """The key store that settles a key with its event, if one is declared."""
        if self.capabilities.settle_with_event:
            assert isinstance(self.idempotency, SettlingLog)
            return self.idempotency
        return None

    @property
    def completing(self) -> CompletingLog | None:
        """The checkpoint store that completes keys with a checkpoint, if one is declared."""
        if self.capabilities.checkpoint_with_completion:
            assert isinstance(self.checkpoints, CompletingLog)  # checked when constructed
            return self.checkpoints
        return None

    @property
    def owners(self) -> RunOwners | None:
        """The checkpoint store that records run ownership and fences the run's writes with
        it, if it is the key store too (its claims must carry the epoch as well)."""
        owners: object = self.checkpoints
        if owners is self.idempotency and isinstance(owners, RunOwners):
            return owners
        return None

    def close(self) -> None:
        """Close each distinct store once. Closing is what a process death does: nothing in
        flight is settled, so a record left in flight reads as an unknown outcome afterwards."""
        seen: list[object] = []
        for store in (self.checkpoints, self.idempotency, self.audit, self.specs):
            if store is None:
                continue
            if not any(store is s for s in seen):
                seen.append(store)
                store.close()


@runtime_checkable
class Tool(Protocol):
    """A callable thing in the world. ``invoke`` raises ``ToolError`` for a definite failure,
    ``OutcomeUncertain`` when it cannot know; any other exception from a WRITE is read as unknown.
    """

    name: str
    side_effect: SideEffect
    requires_approval: bool
    description: str
    input_schema: Mapping[str, Any]

    def invoke(self, args: Mapping[str, Any], *, idempotency_key: str | None) -> Any: ...


@runtime_checkable
class Confirmer(Protocol):
    """Trusted code that asks the system of record whether an unknown WRITE took effect.

    True settles it as done, False abandons it, None leaves it for a person. Never the model's or
    the tool's own claim.
    """

    name: str

    def confirm(
        self, tenant: str, run: str, action: UnknownAction, args: Mapping[str, Any]
    ) -> bool | None: ...


@runtime_checkable
class LoopRunner(Protocol):
    """Drives a run described by a serialisable LoopSpec to its next stop."""

    def run(self, spec: LoopSpec) -> Outcome: ...
