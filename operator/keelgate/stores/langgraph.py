"""A CheckpointStore backed by a LangGraph checkpoint saver (extra ``keelgate[langgraph]``).

For teams that already keep their agents' state in a LangGraph checkpointer: Keelgate uses the
saver as a store only (``put``, ``get_tuple``, ``list``), never as a graph. Each run is one thread
(``keelgate/<tenant>/<run>``, percent-encoded) and each save one checkpoint whose single channel
holds the sequence number and exactly the JSON text the SQLite and Postgres stores hold, so a run
can move between the stores.

The saver API has no compare-and-set, so the stale-writer check (refuse a sequence that is not
newer) is a read then a write. It must never run without a lock: a thread lock always, and for
``.sqlite(path)`` a cross-process lock too (see ``LangGraphCheckpointStore``).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote, unquote

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    LATEST_VERSION,
    BaseCheckpointSaver,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.base import Checkpoint as GraphCheckpoint
from langgraph.checkpoint.sqlite import SqliteSaver

from keelgate.core.protocols import Checkpoint, RunRef
from keelgate.errors import StaleCheckpoint, StoreError, StoreUnavailable

CHANNEL = "keelgate"
NAMESPACE = ""  # the root namespace: Keelgate threads are top-level threads
THREAD_PREFIX = "keelgate/"


def thread_id(tenant: str, run: str) -> str:
    """The saver thread of a run; injective, so no two runs share a thread."""
    return f"{THREAD_PREFIX}{quote(tenant, safe='')}/{quote(run, safe='')}"


def _parse_thread(thread: str) -> tuple[str, str] | None:
    if not thread.startswith(THREAD_PREFIX):
        return None
    parts = thread[len(THREAD_PREFIX) :].split("/")
    if len(parts) != 2:
        return None
    return unquote(parts[0]), unquote(parts[1])


def _checkpoint_id(seq: int) -> str:
    """A version-6 UUID whose timestamp field is ``seq``.

    Savers return the checkpoint with the greatest id as the latest. Ids from the wall clock would
    let a clock stepped back hide a newer checkpoint behind an older one; ids ordered by sequence
    cannot. The random tail keeps two racing writers of one sequence distinct.
    """
    stamp = seq & ((1 << 60) - 1)
    tail = uuid.uuid4().int & ((1 << 62) - 1)
    value = (stamp >> 12) << 80 | 0x6 << 76 | (stamp & 0xFFF) << 64 | 0b10 << 62 | tail
    return str(uuid.UUID(int=value))


class _ProcessLock:
    """Mutual exclusion between processes: a separate SQLite database held under BEGIN IMMEDIATE.

    SQLite's file locks are released by the kernel when a holder dies, so a crashed process
    cannot leave the lock taken.
    """

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(
            path, isolation_level=None, timeout=60.0, check_same_thread=False
        )

    @contextmanager
    def held(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            self._db.execute("ROLLBACK")  # nothing was written: ending it releases the lock

    def close(self) -> None:
        self._db.close()


class LangGraphCheckpointStore:
    """Checkpoints of Keelgate runs in any LangGraph ``BaseCheckpointSaver``.

    ``save``'s stale-writer check reads the latest checkpoint and then puts the next one; the
    saver API cannot make that atomic. A thread lock makes it safe between threads using this
    object. ``LangGraphCheckpointStore.sqlite(path)`` also holds a cross-process lock (a separate
    lock database, ``<path>.lock``, under BEGIN IMMEDIATE) around the read and the write, so
    processes sharing the file are safe too (the ADR-0004 amendment, proven by a multi-process
    race test).

    Known gap: a saver passed to the constructor gets only the thread lock. Two processes (or two
    store objects) saving the same run through it can both pass the check and both write: a stale
    writer is then not refused. Use ``.sqlite(path)``, or the SQLite or Postgres store, wherever
    more than one process may drive a run. Savers keep every checkpoint (LangGraph's history), so
    the file grows with a run's length; each checkpoint's size does not.
    """

    def __init__(
        self,
        saver: BaseCheckpointSaver[Any],
        *,
        _process_lock: _ProcessLock | None = None,
        _on_close: Callable[[], None] | None = None,
    ) -> None:
        self.saver = saver
        self._thread_lock = threading.Lock()
        self._process_lock = _process_lock
        self._on_close = _on_close

    @classmethod
    def sqlite(
        cls, path: str | Path, *, _cross_process_lock: bool = True
    ) -> LangGraphCheckpointStore:
        """A store over a SqliteSaver file, safe between processes sharing it.

        ``_cross_process_lock=False`` exists only for the race test that proves the lock matters.
        """
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, timeout=60.0, check_same_thread=False)
            saver = SqliteSaver(conn)
            saver.setup()
            lock = _ProcessLock(Path(f"{path}.lock")) if _cross_process_lock else None
        except (OSError, sqlite3.Error) as error:
            raise StoreUnavailable(f"cannot open LangGraph SQLite store {path}: {error}") from None

        def close() -> None:
            conn.close()
            if lock is not None:
                lock.close()

        return cls(saver, _process_lock=lock, _on_close=close)

    def close(self) -> None:
        """Close what ``.sqlite`` opened; a saver passed in stays open (its owner closes it)."""
        if self._on_close is not None:
            self._on_close()
            self._on_close = None

    def _config(self, tenant: str, run: str) -> RunnableConfig:
        return {"configurable": {"thread_id": thread_id(tenant, run), "checkpoint_ns": NAMESPACE}}

    @staticmethod
    def _value(found: CheckpointTuple) -> tuple[int, str]:
        value = found.checkpoint["channel_values"].get(CHANNEL)
        if not isinstance(value, Mapping) or "seq" not in value or "state" not in value:
            thread = found.config["configurable"].get("thread_id")
            raise StoreError(
                f"LangGraph thread {thread!r} holds a checkpoint Keelgate did not write"
            )
        return int(value["seq"]), str(value["state"])

    def _exclusive(self) -> AbstractContextManager[None]:
        return self._process_lock.held() if self._process_lock is not None else nullcontext()

    def save(self, tenant: str, run: str, seq: int, state: Mapping[str, Any]) -> None:
        text = json.dumps(state, separators=(",", ":"))
        config = self._config(tenant, run)
        try:
            with self._thread_lock, self._exclusive():
                current = self.saver.get_tuple(config)
                stored = None if current is None else self._value(current)[0]
                if stored is not None and stored >= seq:
                    raise StaleCheckpoint(tenant, run, seq, stored)
                previous = None
                if current is not None:
                    previous = current.checkpoint["channel_versions"].get(CHANNEL)
                    config = current.config  # the parent of the new checkpoint
                version = self.saver.get_next_version(cast(Any, previous), None)
                checkpoint = GraphCheckpoint(
                    v=LATEST_VERSION,
                    id=_checkpoint_id(seq),
                    ts=datetime.now(UTC).isoformat(),
                    channel_values={CHANNEL: {"seq": seq, "state": text}},
                    channel_versions={CHANNEL: version},
                    versions_seen={},
                    updated_channels=[CHANNEL],
                )
                metadata = cast(
                    CheckpointMetadata, {"source": "update", "step": seq, "parents": {}}
                )
                self.saver.put(config, checkpoint, metadata, {CHANNEL: version})
        except sqlite3.Error as error:
            raise StoreError(f"LangGraph store: cannot save {run!r}: {error}") from None

    def load(self, tenant: str, run: str) -> Checkpoint | None:
        try:
            found = self.saver.get_tuple(self._config(tenant, run))
        except sqlite3.Error as error:
            raise StoreError(f"LangGraph store: cannot load {run!r}: {error}") from None
        if found is None:
            return None
        seq, text = self._value(found)
        return Checkpoint(tenant, run, seq, json.loads(text))

    def runs(self, tenant: str | None = None) -> list[RunRef]:
        latest: dict[tuple[str, str], int] = {}
        try:
            for found in self.saver.list(None):
                configurable = found.config["configurable"]
                if configurable.get("checkpoint_ns", "") != NAMESPACE:
                    continue
                names = _parse_thread(str(configurable.get("thread_id", "")))
                if names is None or tenant not in (None, names[0]):
                    continue
                seq = self._value(found)[0]
                latest[names] = max(seq, latest.get(names, seq))
        except sqlite3.Error as error:
            raise StoreError(f"LangGraph store: cannot list runs: {error}") from None
        return [RunRef(t, r, seq) for (t, r), seq in sorted(latest.items())]
