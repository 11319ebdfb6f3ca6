"""LangGraph's side: a ``StateGraph`` of plan -> act -> verify nodes, looping back to plan, with
a durable checkpoint saver: ``SqliteSaver``/``PostgresSaver`` (sync) or
``AsyncSqliteSaver``/``AsyncPostgresSaver`` (async, driven on one event loop of its own).

Why it exists: LangGraph is the agent framework a Keelgate user would otherwise reach for; its
savers checkpoint after each node (super-step), so after a crash the interrupted node runs again
and nothing dedupes its side effect. Graphs run with ``durability="sync"`` (each checkpoint is
written before the next node starts), the mode that makes a crash lose no finished node: the
default ("async") writes it while the next node runs and would look faster by promising less.
It must never be given a shortcut Keelgate lacks.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from peersbench.places import Database


class IterationState(TypedDict, total=False):
    n: int  # iterations done
    target: int  # stop after this many
    plan: dict[str, Any]
    result: dict[str, Any]
    verdict: str
    writes: Annotated[int, operator.add]  # WRITEs done, as the graph recorded them


class _Hooks:
    probe: Callable[[], None] | None = None
    effect: Callable[[], None] = staticmethod(lambda: None)


def build(hooks: _Hooks) -> StateGraph[IterationState]:
    def plan(state: IterationState) -> IterationState:
        if hooks.probe is not None:
            hooks.probe()
        return {"plan": {"tool": "write", "args": {"n": state.get("n", 0)}}}

    def act(state: IterationState) -> IterationState:
        hooks.effect()
        return {"result": {"ok": True}, "writes": 1}

    def verify(state: IterationState) -> IterationState:
        return {"verdict": "accept", "n": state.get("n", 0) + 1}

    def again(state: IterationState) -> str:
        return "plan" if state["n"] < state["target"] else END

    graph = StateGraph(IterationState)
    graph.add_node("plan", plan)
    graph.add_node("act", act)
    graph.add_node("verify", verify)
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "act")
    graph.add_edge("act", "verify")
    graph.add_conditional_edges("verify", again, ["plan", END])
    return graph


def config(thread: str, iterations: int) -> Any:  # a RunnableConfig
    # Three super-steps per iteration, plus the input's.
    return {"configurable": {"thread_id": thread}, "recursion_limit": 3 * iterations + 10}


class _Base:
    label = "langgraph"

    def __init__(self) -> None:
        self.version = importlib.metadata.version("langgraph")
        self.hooks = _Hooks()
        self.hooks.effect = self._effect
        self.effects = 0
        self.done: dict[str, int] = {}  # iterations done per thread

    def _effect(self) -> None:
        self.effects += 1

    def _input(self, run: str, iterations: int) -> IterationState:
        done = self.done.get(run, 0)
        self.done[run] = done + iterations
        first: IterationState = {"n": 0} if done == 0 else {}
        return {**first, "target": done + iterations}

    def _check(self, before: int, iterations: int, state: Any) -> None:
        if self.effects - before != iterations:
            raise SystemExit(f"bench: langgraph did {self.effects - before} of {iterations}")


class LangGraphSync(_Base):
    label = "langgraph sync"

    def __init__(self, database: Database) -> None:
        super().__init__()
        if database.store == "sqlite":
            import sqlite3

            from langgraph.checkpoint.sqlite import SqliteSaver

            self.conn: Any = sqlite3.connect(database.target, check_same_thread=False)
            saver: Any = SqliteSaver(self.conn)
        else:
            import psycopg
            from langgraph.checkpoint.postgres import PostgresSaver
            from psycopg.rows import dict_row

            self.conn = psycopg.connect(
                database.target, autocommit=True, prepare_threshold=0, row_factory=dict_row
            )
            saver = PostgresSaver(self.conn)
        saver.setup()
        self.graph = build(self.hooks).compile(checkpointer=saver)

    def run(self, run: str, iterations: int, probe: Callable[[], None]) -> None:
        self.hooks.probe = probe
        before = self.effects
        try:
            state = self.graph.invoke(
                self._input(run, iterations), config(run, iterations), durability="sync"
            )
        finally:
            self.hooks.probe = None
        self._check(before, iterations, state)

    def close(self) -> None:
        self.conn.close()


class LangGraphAsync(_Base):
    label = "langgraph async"

    def __init__(self, database: Database) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.database = database
        self.graph = self.runner.run(self._open())

    async def _open(self) -> Any:
        if self.database.store == "sqlite":
            import aiosqlite
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            self.conn: Any = await aiosqlite.connect(self.database.target)
            saver: Any = AsyncSqliteSaver(self.conn)
        else:
            import psycopg
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
            from psycopg.rows import dict_row

            self.conn = await psycopg.AsyncConnection.connect(
                self.database.target, autocommit=True, prepare_threshold=0, row_factory=dict_row
            )
            saver = AsyncPostgresSaver(self.conn)
        await saver.setup()
        return build(self.hooks).compile(checkpointer=saver)

    def run(self, run: str, iterations: int, probe: Callable[[], None]) -> None:
        self.hooks.probe = probe
        before = self.effects
        try:
            state = self.runner.run(
                self.graph.ainvoke(
                    self._input(run, iterations), config(run, iterations), durability="sync"
                )
            )
        finally:
            self.hooks.probe = None
        self._check(before, iterations, state)

    def close(self) -> None:
        self.runner.run(self.conn.close())
        self.runner.close()
