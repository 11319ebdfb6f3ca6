"""Keelgate's side: the core ``Loop`` on ``SQLiteStore`` or ``PostgresStore``, as in commitbench.

Why it exists: the peers bench must run Keelgate exactly as ``bench/loop_vs_commits.py`` does (a
zero-latency model planning one WRITE per call, a tool that returns at once, an accepting
verify) so the figures of both benches agree; here the WRITE's side effect increments a counter,
as the peers' do. It must never give the loop anything the peers lack, nor take anything away.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from commitbench.loop import TENANT, TOOL, StampedModel
from keelgate.adapters.tools.python import PythonTool
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import Outcome, SideEffect
from keelgate.errors import RunNotFound
from peersbench.places import Database

LABEL = "keelgate"


def open_store(database: Database) -> Any:
    if database.store == "sqlite":
        from keelgate.stores.sqlite import SQLiteStore

        return SQLiteStore(database.target)
    from keelgate.stores.postgres import PostgresStore

    return PostgresStore(database.target)


def loop(store: Any, effect: Callable[[], None], probe: Callable[[], None] | None) -> Loop:
    def write(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
        effect()
        return {"ok": True}

    tool = PythonTool(TOOL, write, SideEffect.WRITE, description="increments a counter")
    return Loop(stores=Stores.of(store), model=StampedModel(probe), tools=[tool])


def advance(looped: Loop, run: str, iterations: int) -> Outcome:
    """Run (or resume) ``run`` until it has done ``iterations`` more iterations."""
    done = 0
    with contextlib.suppress(RunNotFound):
        done = looped.state(TENANT, run).iteration
    spec = LoopSpec(TENANT, run, "benchmark", budget=Budget(max_iterations=done + iterations))
    return looped.run_or_resume(spec)


class KeelgatePeer:
    label = LABEL

    def __init__(self, database: Database) -> None:
        import importlib.metadata

        self.version = importlib.metadata.version("keelgate")
        self.store = open_store(database)
        self.effects = 0

    def _effect(self) -> None:
        self.effects += 1

    def run(self, run: str, iterations: int, probe: Callable[[], None]) -> None:
        before = self.effects
        outcome = advance(loop(self.store, self._effect, probe), run, iterations)
        if self.effects - before != iterations:
            raise SystemExit(f"bench: keelgate stopped early: {outcome.to_json()}")

    def close(self) -> None:
        self.store.close()
