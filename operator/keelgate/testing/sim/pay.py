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
"""

from __future__ import annotations

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


class Payer:
    """The world's ``pay`` (the manifest's ``keelgate.testing.sim.downstream:pay``): a quote in
    some runs, a charge, a receipt, each one request to the shop; ``reports`` whether it tells
    Keelgate of each send (``about_to_send``)."""

    def __init__(self, world: World, network: Network, *, quote: bool, reports: bool) -> None:
        self.world = world
        self.network = network
        self.parts = ((QUOTE,) if quote else ()) + PAY_PARTS
        self.reports = reports

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
            output = self._request(sender, request, changed=changed)
            changed = changed or method != "GET"
        sender.window("mid_tool")
        return output

    def _request(self, sender: Sender, request: Wire, *, changed: bool) -> Any:
        what = f"pay {request.part}"
        sends: list[Send] = []
        deadline = fence.current()
        # Its client's total limit, from the deadline (docs/providers.md): it hangs up there.
        limit = CALL_SECONDS if deadline is None else deadline.remaining()

        def leaving() -> None:
            if self.reports:
                sends.append(about_to_send(request.key))
            elif deadline is not None:
                deadline.check()  # its own check, right before the request leaves

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
def paying(world: World, network: Network, *, quote: bool, reports: bool) -> Iterator[None]:
    """For the block, the manifest's ``pay`` is the world's (``Payer``), and the product's
    Python tool runs it on the world's time (``InLineWorkers``)."""
    downstream.PAYING.append(Payer(world, network, quote=quote, reports=reports))
    try:
        with python.simulated(InLineWorkers(world)):
            yield
    finally:
        downstream.PAYING.pop()
