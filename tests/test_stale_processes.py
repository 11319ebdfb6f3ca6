"""A process that lost its hold on a run, and thaws after another drove it on, can never act on
what it held: it never claims its old plan's call, and never drops a key others were asked about.

Why it exists: on a server store a process can lose its session while it lives (a node cut off,
a network partition, a long pause). Its owner id and its run lock go with the session, so the
next step drives the run on. The simulator (issue 39) found three gaps there, each reproduced here
deterministically, on the memory store (whose session is lost as PostgreSQL loses one: the owner
and its run lock go) and on a real PostgreSQL server (``pg_terminate_backend`` on the process's
owner session, which it replaces with a new one and a new owner id):

- held up *before* its claim, the process used to claim its stale plan's call once it thawed
  (the key was free: the next step's call of it had been refused), send it, and leave its key
  unknown under a checkpoint nobody would ever save: no stop ever named it (sim seed
  6887454310612905671). A claim now lands only while the run's checkpoint is the one its action
  was planned from.
- whose call was refused *after* its session was lost, the process used to drop the key that the
  next step had meanwhile stopped the run on as unknown: the stop named a key nobody could settle.
  ``forget`` now drops only a key held by the owner the store holds live now.
- whose call ended after another process's confirmer had settled its key (that process dying
  before the decision's event), the process checkpointed the action as done and no later step
  met the key again, so the decision never reached the chain (sim seed 619132472565534397). The
  process that ends a call late now writes the decision it finds on the key.

Each test drives both processes in one thread: the first one's failpoint (or its tool) runs the
second to its end before the first goes on, as the simulator does on virtual time. SQLite is not
among the stores: its owner and its run lock are ``flock``s its process holds until it dies, so
another process cannot drive the run while it lives.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import psycopg
import pytest

from keelgate.adapters.models.scripted import ScriptedModel
from keelgate.adapters.tools.python import PythonTool
from keelgate.core import failpoints
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import KeyState, SideEffect, StopReason, UnknownAction, idempotency_key
from keelgate.errors import OutcomeUncertain, SimulatedCrash, StaleCheckpoint, ToolError
from keelgate.stores.memory import MemoryStore
from keelgate.stores.postgres import PostgresStore
from support.stores import ONE_SESSION, store_fixture

ORDER = {"sku": "A1", "qty": 2}
SPEC = LoopSpec("shop", "restock", "restock A1", budget=Budget(max_iterations=5))
KEY = idempotency_key("shop", "restock", "place_order", ORDER)
SCRIPT = [
    {"actions": [{"tool": "place_order", "args": ORDER}]},
    {"done": True, "answer": "done"},
]


#: Each test opens a new process's stores over one run's data: memory, or a fresh PostgreSQL
#: database opened as a step pod opens it (one session, no pool).
opener = store_fixture("memory", ONE_SESSION)


def lose_session(stores: Stores) -> None:
    """The store server ends this process's session while the process lives on: its owner and
    the run locks it held go with it (the next operation opens a new session)."""
    store = stores.idempotency
    if isinstance(store, MemoryStore):
        with store.backend.lock:
            store.backend.live_owners.discard(store.owner)
            store.backend.driven.discard((SPEC.tenant, SPEC.run))
        return
    assert isinstance(store, PostgresStore)
    conn = store._owner_conn
    assert conn is not None
    pid = conn.info.backend_pid
    with psycopg.connect(store.url.text, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 10
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            assert time.monotonic() < deadline, "the server did not end the session"
            time.sleep(0.02)


class Shop:
    """The order service: refuses the first order (nothing happens), then takes each one but
    the answer is lost (it happened; the caller cannot know)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.orders: list[str] = []

    def tool(self) -> PythonTool:
        def place_order(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
            assert idempotency_key is not None
            self.calls.append(idempotency_key)
            if len(self.calls) == 1:
                raise ToolError("out of stock")
            self.orders.append(idempotency_key)
            raise OutcomeUncertain("connection reset after the request")

        return PythonTool("place_order", place_order, SideEffect.WRITE, timeout_seconds=30)


def loop(stores: Stores, tool: PythonTool) -> Loop:
    return Loop(stores=stores, model=ScriptedModel(SCRIPT), tools=[tool], busy_wait=0.0)


def test_a_process_held_up_before_its_claim_never_sends_once_the_run_moved_on(
    opener: Callable[[], Stores],
) -> None:
    """Process A saves its plan and is held up right before its order's claim; its session is
    lost meanwhile. Process B resumes the run, its order is refused (nothing happened, the key
    dropped), and it drives the run to goal_met. When A thaws, its claim is refused
    (``StaleClaim``, a ``StaleCheckpoint``: exit 4): the order is never sent again, and no key
    of the run is left in flight or unknown for nobody to be asked about."""
    shop = Shop()
    first, second = opener(), opener()
    held: list[str] = []

    def window(name: str) -> None:
        if name == "before_action" and not held:
            held.append(name)
            lose_session(first)
            done = loop(second, shop.tool()).run_or_resume(SPEC)
            assert done.stop.reason is StopReason.GOAL_MET, done.to_json()

    with failpoints.observed(window), pytest.raises(StaleCheckpoint):
        loop(first, shop.tool()).run_or_resume(SPEC)
    assert held == ["before_action"]
    assert shop.calls == [KEY]  # B's refused call only
    assert shop.orders == []
    third = opener()
    assert third.idempotency.get("shop", KEY) is None  # refused, dropped: nothing to settle
    outcome = Loop(stores=third).outcome("shop", "restock")
    assert outcome.stop.reason is StopReason.GOAL_MET
    assert Loop(stores=third).verify_audit("shop", "restock").ok


def test_a_call_refused_after_its_session_was_lost_leaves_its_key_for_a_person(
    opener: Callable[[], Stores],
) -> None:
    """Process A claims its order and sends it; meanwhile its session is lost and process B,
    finding the key's owner gone, stops the run with outcome_unknown naming it. Then A's call
    comes back refused. A does not drop the key B's stop names (a person is being asked about
    it): the key still reads unknown, a ``loop.late_result`` on the chain says the call was
    refused, and A, whose run moved on, stops with ``StaleCheckpoint``. The person settles the
    key B's stop names."""
    first, second = opener(), opener()
    stops: list[Any] = []

    def refused_meanwhile(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        lose_session(first)
        never = PythonTool("place_order", _never_called, SideEffect.WRITE, timeout_seconds=1)
        stops.append(loop(second, never).run_or_resume(SPEC))
        raise ToolError("out of stock")  # nothing was sent

    tool = PythonTool("place_order", refused_meanwhile, SideEffect.WRITE, timeout_seconds=1)
    with pytest.raises(StaleCheckpoint):
        loop(first, tool).run_or_resume(SPEC)
    (stopped,) = stops
    assert stopped.stop.reason is StopReason.OUTCOME_UNKNOWN
    assert [u.idempotency_key for u in stopped.unknown_actions] == [KEY]
    third = opener()
    record = third.idempotency.get("shop", KEY)
    assert record is not None and record.state is KeyState.OUTCOME_UNKNOWN
    late = [
        e.data for e in Loop(stores=third).audit("shop", "restock") if e.type == "loop.late_result"
    ]
    assert [(d["status"], d["recorded"]) for d in late] == [("refused", "outcome_unknown")]
    assert Loop(stores=third).verify_audit("shop", "restock").ok
    settled = Loop(stores=third).reconcile("shop", "restock", "1:0", executed=True, by="ann")
    assert settled.state is KeyState.COMPLETED


def test_a_refused_call_whose_session_lived_drops_its_key_as_before(
    opener: Callable[[], Stores],
) -> None:
    """The usual refusal is unchanged: with its session alive, a definitely refused order's key
    is dropped, the model sees the refusal, and the run goes on to goal_met."""
    shop = Shop()
    done = loop(opener(), shop.tool()).run_or_resume(SPEC)
    assert done.stop.reason is StopReason.GOAL_MET
    assert shop.calls == [KEY]
    assert opener().idempotency.get("shop", KEY) is None


class ShopConfirmer:
    """Trusted code that asks the shop: the order is in its book."""

    name = "shop-confirmer"

    def confirm(
        self, tenant: str, run: str, action: UnknownAction, args: Mapping[str, Any]
    ) -> bool | None:
        return True


def test_a_confirmers_decision_reaches_the_chain_when_its_writer_died_and_the_call_ends_late(
    opener: Callable[[], Stores],
) -> None:
    """Process A sends its order and is held up before the answer; its session is lost. Process
    B finds the key's owner gone, its confirmer says the order is in the shop's book, B settles
    the key so and dies right after, before the decision's event. A's call then ends (the
    order went through) and A, the last to meet the key, drives the run to its end: the
    confirmer's decision is on the chain once, before A's ``loop.late_result``, and the chain
    verifies (sim seed 619132472565534397 found the decision missing)."""
    first, second = opener(), opener()
    orders: list[str] = []

    def held_before_the_answer(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        assert idempotency_key is not None
        orders.append(idempotency_key)
        lose_session(first)
        # The same tool as A's, as B's manifest names it (its function here only proves it is
        # never called): a confirmer vouches only for a call made under the tool's definition.
        never = PythonTool(
            "place_order", _never_called, SideEffect.WRITE, timeout_seconds=30, reference=PLACE
        )
        other = Loop(
            stores=second,
            model=ScriptedModel(SCRIPT),
            tools=[never],
            confirmer=ShopConfirmer(),
            busy_wait=0.0,
        )
        with failpoints.armed({"after_settle": 1}), pytest.raises(SimulatedCrash):
            other.run_or_resume(SPEC)
        return {"ordered": 2}

    tool = PythonTool(
        "place_order", held_before_the_answer, SideEffect.WRITE, timeout_seconds=30, reference=PLACE
    )
    done = loop(first, tool).run_or_resume(SPEC)
    assert done.stop.reason is StopReason.GOAL_MET
    assert orders == [KEY]
    events = Loop(stores=opener()).audit("shop", "restock")
    decided = [
        (e.type, e.data.get("source"), e.data.get("verdict"), e.actor)
        for e in events
        if e.type in ("loop.reconciled", "loop.late_result")
    ]
    assert decided == [
        ("loop.reconciled", "confirmer", "executed", "shop-confirmer"),
        ("loop.late_result", None, None, "keelgate"),
    ]
    assert Loop(stores=opener()).verify_audit("shop", "restock").ok


#: The callable both processes' manifests name for place_order.
PLACE = "shop.tools:place_order"


def _never_called(args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
    raise AssertionError("B must not call the tool: the key is on record")
