"""DBOS Transact's side: a workflow whose iterations are three steps (plan, write, verify).

Why it exists: it is the nearest durable-execution peer; a step's output is recorded once the
step returns, so a step is at least once (a crash after its side effect and before its record
re-runs it on recovery) and nothing dedupes the side effect. Its system database is SQLite (the
``sqlite:///`` system database URL) or PostgreSQL, each with DBOS's own defaults. It must never
be given a shortcut Keelgate lacks: every step is a ``@DBOS.step`` with its output recorded.

DBOS is a process-wide singleton, so one ``DbosPeer`` is open at a time; the workflows are
registered once, at import.
"""

from __future__ import annotations

import importlib.metadata
import logging
import uuid
from collections.abc import Callable
from typing import Any

from dbos import DBOS, DBOSConfig, SetWorkflowID

from peersbench.places import Database

LABEL = "dbos"


class _Hooks:
    """What the registered steps call: the probe at each plan and the WRITE's side effect."""

    probe: Callable[[], None] | None = None
    effect: Callable[[], None] = staticmethod(lambda: None)


HOOKS = _Hooks()


@DBOS.step()
def plan_step(n: int) -> dict[str, Any]:
    if HOOKS.probe is not None:
        HOOKS.probe()
    return {"tool": "write", "args": {"n": n}}


@DBOS.step()
def write_step(args: dict[str, Any]) -> dict[str, Any]:
    HOOKS.effect()
    return {"ok": True}


@DBOS.step()
def verify_step(result: dict[str, Any]) -> str:
    return "accept"


@DBOS.workflow()
def iterations_workflow(count: int) -> int:
    for n in range(count):
        plan = plan_step(n)
        result = write_step(plan["args"])
        if verify_step(result) != "accept":
            raise RuntimeError("the verifier refused")
    return count


def system_database_url(database: Database) -> str:
    if database.store == "sqlite":
        return f"sqlite:///{database.target}"
    return database.target


def launch(database: Database) -> None:
    config: DBOSConfig = {
        "name": "peersbench",
        "system_database_url": system_database_url(database),
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    logging.getLogger("dbos").setLevel(logging.WARNING)


class DbosPeer:
    label = LABEL

    def __init__(self, database: Database) -> None:
        self.version = importlib.metadata.version("dbos")
        launch(database)
        self.effects = 0

    def _effect(self) -> None:
        self.effects += 1

    def run(self, run: str, iterations: int, probe: Callable[[], None]) -> None:
        """One workflow of ``iterations`` iterations (a workflow cannot be extended)."""
        HOOKS.probe, HOOKS.effect = probe, self._effect
        before = self.effects
        try:
            with SetWorkflowID(f"{run}-{uuid.uuid4().hex[:12]}"):
                done = iterations_workflow(iterations)
        finally:
            HOOKS.probe, HOOKS.effect = None, lambda: None
        if done != iterations or self.effects - before != iterations:
            raise SystemExit(f"bench: dbos did {self.effects - before} of {iterations} writes")

    def close(self) -> None:
        DBOS.destroy(destroy_registry=False)
