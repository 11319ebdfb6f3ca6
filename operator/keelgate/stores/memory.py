"""In-memory stores, for tests and quick experiments.

Data lives in a ``MemoryBackend`` that outlives any ``MemoryStore`` opened on it, so a test can
"restart" a process by closing a store and opening a new one over the same backend: the closed
store's in-flight keys then read as unknown outcomes, exactly as a dead process's would. Nothing
here is durable across real processes; it must never be offered as a production store.
"""

from __future__ import annotations

import copy
import json
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from keelgate.core.audit import AuditDraft, AuditEvent, seal
from keelgate.core.protocols import Capabilities, Checkpoint, RecordedSpec, RunRef
from keelgate.core.types import KeyRecord, KeyState, settled_state
from keelgate.errors import SettleError, StaleCheckpoint
from keelgate.stores._holds import OwnerHolds


@dataclass
class _Key:
    record: KeyRecord
    owner: str | None


@dataclass
class MemoryBackend:
    """The shared data behind any number of MemoryStore sessions."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    checkpoints: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    keys: dict[tuple[str, str], _Key] = field(default_factory=dict)
    audit: dict[tuple[str, str], list[AuditEvent]] = field(default_factory=dict)
    live_owners: set[str] = field(default_factory=set)
    specs: dict[tuple[str, str], RecordedSpec] = field(default_factory=dict)
    driven: set[tuple[str, str]] = field(default_factory=set)  # runs a driver holds (RunLock)


class MemoryStore:
    """Checkpoint, idempotency and audit store in one, over a MemoryBackend."""

    # Every role in one transaction: see keelgate.core.protocols.Capabilities.
    capabilities = Capabilities(checkpoint_with_events=True, claim_with_event=True)

    def __init__(self, backend: MemoryBackend | None = None) -> None:
        self.backend = backend or MemoryBackend()
        self.owner = uuid.uuid4().hex
        self._holds = OwnerHolds()
        with self.backend.lock:
            self.backend.live_owners.add(self.owner)

    def reopen(self) -> MemoryStore:
        """A new session over the same data, as a restarted process would open."""
        return MemoryStore(self.backend)

    def hold(self) -> Callable[[], None]:
        """Keep this session's owner live, even past ``close``, until the returned function is
        called: a call it started may still run."""
        return self._holds.hold()

    def close(self) -> None:
        self._holds.close(self._close_now)

    def _close_now(self) -> None:
        with self.backend.lock:
            self.backend.live_owners.discard(self.owner)

    # RunLock

    def lock_run(self, tenant: str, run: str) -> Callable[[], None] | None:
        """One driver per run among every store over this backend (this process only)."""
        with self.backend.lock:
            if (tenant, run) in self.backend.driven:
                return None
            self.backend.driven.add((tenant, run))

        def release() -> None:
            with self.backend.lock:
                self.backend.driven.discard((tenant, run))

        return release

    # CheckpointStore

    def save(self, tenant: str, run: str, seq: int, state: Mapping[str, Any]) -> None:
        text = json.dumps(state)  # what a real store would persist: proves it is JSON
        with self.backend.lock:
            stored = self.backend.checkpoints.get((tenant, run))
            if stored is not None and stored[0] >= seq:
                raise StaleCheckpoint(tenant, run, seq, stored[0])
            self.backend.checkpoints[(tenant, run)] = (seq, text)

    def save_with_events(
        self,
        tenant: str,
        run: str,
        seq: int,
        state: Mapping[str, Any],
        drafts: Sequence[AuditDraft],
    ) -> None:
        with self.backend.lock:
            self.save(tenant, run, seq, state)
            self.append(tenant, run, drafts)

    def load(self, tenant: str, run: str) -> Checkpoint | None:
        with self.backend.lock:
            stored = self.backend.checkpoints.get((tenant, run))
        if stored is None:
            return None
        return Checkpoint(tenant, run, stored[0], json.loads(stored[1]))

    def runs(self, tenant: str | None = None) -> list[RunRef]:
        with self.backend.lock:
            items = sorted(self.backend.checkpoints.items())
        return [RunRef(t, r, seq) for (t, r), (seq, _) in items if tenant in (None, t)]

    # SpecStore

    def record_spec(
        self, tenant: str, run: str, spec: Mapping[str, Any], *, source: str, generation: int
    ) -> bool:
        text = json.dumps(spec)
        with self.backend.lock:
            stored = self.backend.specs.get((tenant, run))
            if stored is not None and stored.source == source and stored.generation > generation:
                return False
            self.backend.specs[(tenant, run)] = RecordedSpec(
                tenant, run, source, generation, json.loads(text)
            )
            return True

    def recorded_spec(self, tenant: str, run: str) -> RecordedSpec | None:
        with self.backend.lock:
            stored = self.backend.specs.get((tenant, run))
        return None if stored is None else replace(stored, spec=copy.deepcopy(stored.spec))

    # IdempotencyStore

    def _resolved(self, entry: _Key) -> KeyRecord:
        if entry.record.state is KeyState.IN_FLIGHT and (
            entry.owner is None or entry.owner not in self.backend.live_owners
        ):
            return replace(entry.record, state=KeyState.OUTCOME_UNKNOWN)
        return entry.record

    def claim(
        self,
        tenant: str,
        key: str,
        *,
        run: str,
        action: str,
        tool: str,
        event: AuditDraft | None = None,
    ) -> KeyRecord | None:
        with self.backend.lock:
            entry = self.backend.keys.get((tenant, key))
            if entry is not None:
                return self._resolved(entry)
            record = KeyRecord(tenant, key, run, action, tool, KeyState.IN_FLIGHT)
            self.backend.keys[(tenant, key)] = _Key(record, self.owner)
            if event is not None:
                self.append(tenant, run, [event])
            return None

    def complete(self, tenant: str, key: str, result: Any) -> bool:
        with self.backend.lock:
            entry = self.backend.keys.get((tenant, key))
            if entry is None or entry.record.state is not KeyState.IN_FLIGHT:
                return False
            if entry.owner != self.owner:
                return False
            entry.record = replace(
                entry.record, state=KeyState.COMPLETED, result=copy.deepcopy(result)
            )
            entry.owner = None
            return True

    def release(self, tenant: str, key: str) -> None:
        with self.backend.lock:
            entry = self.backend.keys[(tenant, key)]
            if entry.owner == self.owner:
                entry.owner = None

    def forget(self, tenant: str, key: str) -> None:
        with self.backend.lock:
            entry = self.backend.keys.get((tenant, key))
            mine = entry is not None and entry.owner == self.owner
            if mine and entry is not None and entry.record.state is KeyState.IN_FLIGHT:
                del self.backend.keys[(tenant, key)]

    def settle(self, tenant: str, key: str, *, executed: bool, by: str, source: str) -> KeyRecord:
        with self.backend.lock:
            entry = self.backend.keys.get((tenant, key))
            if entry is None:
                raise SettleError("", key, "no such idempotency key")
            current = self._resolved(entry)
            state = settled_state(current, executed=executed)
            entry.record = replace(entry.record, state=state, settled_by=by, source=source)
            entry.owner = None
            return entry.record

    def get(self, tenant: str, key: str) -> KeyRecord | None:
        with self.backend.lock:
            entry = self.backend.keys.get((tenant, key))
            return None if entry is None else self._resolved(entry)

    # AuditLog

    def append(self, tenant: str, run: str, drafts: Sequence[AuditDraft]) -> None:
        with self.backend.lock:
            chain = self.backend.audit.setdefault((tenant, run), [])
            seen = {e.key for e in chain if e.key}
            for draft in drafts:
                if draft.key and draft.key in seen:
                    continue
                chain.append(seal(tenant, run, chain[-1] if chain else None, draft))
                if draft.key:
                    seen.add(draft.key)

    def events(self, tenant: str, run: str) -> list[AuditEvent]:
        with self.backend.lock:
            return list(self.backend.audit.get((tenant, run), []))
