"""``pay`` run by the product's own Python tool (``PythonTool``), on virtual time (the whole
world: ``Options.python_tool``).

Why it exists: ``PythonTool`` runs a user's function on a worker thread and waits for it in
real time, up to the tool's limit or the call's write deadline; a call that outlives the wait is
an unknown outcome, still running (``OutcomeUncertain(still_running=...)``). That handling is
the product's, and the world must meet it, not a wrapper's copy of it (``downstream.SimTool``,
which the kept seeds' worlds still run). So the product's tool is built from the manifest as a
pod builds it, and only where its function runs is the world's (``keelgate.adapters.tools.
python.simulated``, the seam): ``InLineWorkers`` runs the function in line, on the world's
virtual time, and tells the caller whether it ended within its wait.

That is faithful because of what the world's function is (``Payer``): a user's ``pay`` that
bounds each of its exchanges by the call's write deadline, as docs/providers.md asks ("Bound
each exchange as a whole"), and the caller waits to that same deadline (the tool's limit is
the deadline's start). So the function runs past its caller's wait only as its client hangs up
at the deadline (the same moment: whichever wakes first) or while its process is held up
(frozen whole: the caller with it, and when the process goes on, the worker and the caller
race). In both the world draws who wins; a caller that loses hears the call's end at once, as
a worker ending a moment after its caller gave up is heard (``_Call.when_done``).

The function reports each request with ``keelgate.about_to_send`` in some runs, and in the
others sends through its own client without reporting (the report is optional, and most
tools' authors never call it): then it checks the deadline itself right before each request
leaves (``write_deadline().check()``), and raises ``ToolError`` only when nothing it sent could
have changed anything, as docs/providers.md asks of such a tool; any other failure is left to
read as an unknown outcome. This module must never tell the product what the shop did.

With ``--pay-threads`` (the whole world), a function that reports its sends hands each request,
in some runs, to a worker thread of its own and waits for it: one it started with
``keelgate.fenced`` (as docs/providers.md asks), or a bare one (a tool author's slip). Only the
report depends on the thread (the rest of the exchange is the world's), so the report is made
in the context such a thread has: a copy of the call's (``fenced``) or a new, empty one (a
thread started without it, as Python starts every thread), where the product must refuse to
let the request leave, since it can neither check the call's deadline nor count the send.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from keelgate.adapters.tools import python
from keelgate.core import fence
from keelgate.core.fence import DeadlinePassed, Send, about_to_send
from keelgate.errors import SimulatedCrash, ToolError
from keelgate.testing.sim import downstream
from keelgate.testing.sim.downstream import CALL_SECONDS, PAY_PARTS, QUOTE
from keelgate.testing.sim.network import Network, Reset, Sender, Silence, Unsent
from keelgate.testing.sim.network import Request as Wire
from keelgate.testing.sim.world import World

#: How far apart two moments on virtual time may be and still be one (a deadline reached by
#: two clocks' readings of it).
SAME_MOMENT = 1e-3
#: Where ``pay``'s requests leave from with ``--pay-threads``: the function's own thread, a
#: worker it started with ``keelgate.fenced``, or a bare worker.
THREADS = ("", "fenced", "bare")
#: How long the function waits for a worker that has not started before it gives up.
WORKER_PATIENCE = 5.0
THREAD_SAID = {"fenced": "a fenced worker thread", "bare": "a worker thread started bare"}


class Payer:
    """The world's ``pay`` (the manifest's ``keelgate.testing.sim.downstream:pay``): a quote in
    some runs, a charge, a receipt, each one request to the shop; ``reports`` whether it tells
    Keelgate of each send (``about_to_send``)."""

    def __init__(
        self, world: World, network: Network, *, quote: bool, reports: bool, threads: str = ""
    ) -> None:
        self.world = world
        self.network = network
        self.parts = ((QUOTE,) if quote else ()) + PAY_PARTS
        self.reports = reports
        self.threads = threads

    def __call__(self, args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        if idempotency_key is None:
            raise ToolError("pay: called as a READ")
        sender = self.network.sender()  # the process whose worker runs it
        changed = False  # whether a request that changes something may have been sent
        output: Any = None
        for number, (part, url) in enumerate(self.parts):
            if number:
                # Between two requests of one call: the process may die here, or be held up
                # past its deadline.
                sender.window("mid_tool")
            body: dict[str, Any] = {"ref": args.get("ref")}
            if part in ("quote", "charge"):
                body["amount"] = args.get("amount")
            method = "GET" if part == "quote" else "POST"
            request = Wire(method, url, body, idempotency_key, part)
            output = self._request(sender, request, changed=changed, first=not number)
            changed = changed or method != "GET"
        sender.window("mid_tool")
        return output

    def _request(self, sender: Sender, request: Wire, *, changed: bool, first: bool) -> Any:
        what = f"pay {request.part}"
        sends: list[Send] = []
        deadline = fence.current()
        # Its client's total limit, from the deadline (docs/providers.md): it hangs up there.
        limit = CALL_SECONDS if deadline is None else deadline.remaining()

        def leaving() -> None:
            if self.reports:
                sends.append(self._report(request.key))
            elif deadline is not None:
                deadline.check()  # its own check, right before the request leaves

        if self.threads == "fenced" and first and self.world.schedule.chance(250):
            # Only the first: after a request was reported, no error reads as "nothing sent".
            self._worker_late(sender, request, limit)
        try:
            reply = self.network.exchange(request, limit=limit, before_headers=leaving)
        except DeadlinePassed:
            if changed and not self.reports:
                raise TimeoutError(
                    f"{what} not sent: the deadline passed after the charge"
                ) from None
            raise  # nothing of this request left (and Keelgate knows what else did)
        except Unsent:
            if changed and not self.reports:
                raise ConnectionError(f"{what}: connection refused after the charge") from None
            raise ToolError(f"{what}: connection refused") from None
        except Silence:
            raise TimeoutError(f"{what}: no answer in time") from None
        except Reset:
            raise ConnectionResetError(f"{what}: connection reset after the request") from None
        if 400 <= reply.status < 500:
            if sends:
                sends[-1].refused()
            if changed and not self.reports:
                raise RuntimeError(f"{what}: the shop refused it, after the charge")
            raise ToolError(f"{what}: the shop refused it")
        if reply.status >= 500:
            raise RuntimeError(f"{what}: HTTP {reply.status}")
        return reply.body

    def _worker_late(self, sender: Sender, request: Wire, limit: float) -> None:
        """The worker thread a call's first request was handed to starts late (its pool busy):
        the function waits for it up to its own patience, then gives up, truthfully saying
        nothing was sent; the worker starts after, still carrying the call (``fenced``), and
        tries to send. It must be refused: the gateway has finished with the call, and may have
        let the run claim it afresh."""
        world = self.world
        patience = min(WORKER_PATIENCE, limit)
        starts = world.schedule.between(patience, 3 * patience)
        name = sender.name
        world.say(f"{name} hands pay {request.part} to a worker that starts {starts:.1f}s late")
        world.at(starts, "pay worker", fence.fenced(lambda: self._late_send(sender, request)))
        world.advance(patience)
        raise ToolError(f"pay {request.part}: its worker did not start within {patience:.0f}s")

    def _late_send(self, sender: Sender, request: Wire) -> None:
        """The late worker's request, as its thread makes it; what becomes of it is the
        thread's alone (nobody waits for it any more)."""
        world = self.world
        if not sender.alive:
            return  # its process is gone, the worker with it
        with world.acting(sender.name):
            try:
                deadline = fence.current()
                limit = CALL_SECONDS if deadline is None else deadline.remaining()

                def leaving() -> None:
                    self._report(request.key)

                self.network.exchange(request, limit=limit, before_headers=leaving)
            except ToolError as refused:
                world.say(f"{sender.name}'s late pay worker refused: {type(refused).__name__}")
            except (SimulatedCrash, Unsent, Silence, Reset):
                # The thread's own end, nobody hears of it (a death the world draws at its
                # window ends the worker alone: its process has gone on with other work).
                pass

    def _report(self, key: str | None) -> Send:
        """``about_to_send`` as the thread the request leaves from makes it."""
        if self.threads == "fenced":
            return fence.fenced(about_to_send)(key)
        if self.threads == "bare":
            return contextvars.Context().run(about_to_send, key)
        return about_to_send(key)


class InLineWorkers:
    """The Python tool's worker on virtual time (``python.Workers``): the call runs in line as
    it is started, and its caller's wait is judged from when it ended (see the module)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self._ran = (0.0, 0.0)

    def run(self, name: str, job: Callable[[], None]) -> None:
        started = self.world.now
        job()
        self._ran = (started, self.world.now)

    def wait(self, call: python._Call, seconds: float) -> bool:
        started, ended = self._ran
        if ended < started + seconds - SAME_MOMENT:
            return True
        heard: list[BaseException | None] = []
        call.when_done(lambda result, error: heard.append(error))
        if heard and isinstance(heard[0], SimulatedCrash):
            return True  # its process died in it: the caller dies with it
        world = self.world
        if world.schedule.chance(500):
            world.say(f"{world.actor} stops waiting for its call as it ends")
            return False
        world.say(f"{world.actor} hears its call end as it stops waiting")
        return True


@contextmanager
def paying(
    world: World, network: Network, *, quote: bool, reports: bool, threads: str = ""
) -> Iterator[None]:
    """For the block, the manifest's ``pay`` is the world's (``Payer``), and the product's
    Python tool runs it on the world's time (``InLineWorkers``)."""
    downstream.PAYING.append(Payer(world, network, quote=quote, reports=reports, threads=threads))
    try:
        with python.simulated(InLineWorkers(world)):
            yield
    finally:
        downstream.PAYING.pop()
