"""Local mode: a run driven by hand, one ``keelgate step`` after another, as a person or a cron
job would, with the spec recorded in the store before each step as the operator records it.

Why it exists: the loop, the gateway and the stores carry the promise on their own; this mode
puts them under every fault without the operator in between, so a broken promise found here is
the core's. The driver starts the next step when the run can go on (no stop; an approval
decided; every unknown outcome settled; a budget raised), and another one when it hears nothing
more from a step whose node was lost. It decides nothing for the run.
"""

from __future__ import annotations

from collections.abc import Callable

from keelgate.core.exits import EXIT_RESUMABLE
from keelgate.core.protocols import Stores
from keelgate.core.spec import LoopSpec
from keelgate.core.state import RunState
from keelgate.core.types import KeyState, StopReason
from keelgate.errors import KeelgateError
from keelgate.testing.sim.processes import Setting, StepProcess

_SETTLED = (KeyState.COMPLETED, KeyState.ABANDONED)


class LocalDriver:
    """Starts step processes while the run can go on."""

    def __init__(self, setting: Setting, *, paged: Callable[[], None] | None = None) -> None:
        self.setting = setting
        #: The alert a resumable stop raises (someone is paged to look), if anyone is on call.
        self.paged = paged
        self.world = setting.world
        self.running: StepProcess | None = None
        self.processes: list[StepProcess] = []
        self.finished = False
        self._stopped_under = 0  # the generation a budget stop was met under

    def spec(self) -> LoopSpec:
        # Recorded as the operator records it: with the creator it names (a rule's notCreator).
        return self.setting.desk.loop_spec(self.setting.tenant, self.setting.run)

    def check_later(self, delay: float = 1.0) -> None:
        self.world.at(delay, "the driver looks", self.check)

    def check(self) -> None:
        if self.running is not None or self.finished:
            return
        stores = self.setting.site.open()
        try:
            checkpoint = stores.checkpoints.load(self.setting.tenant, self.setting.run)
            state = None if checkpoint is None else RunState.from_json(checkpoint.state)
            if state is not None and not self._goes_on(state, stores):
                if state.stop is not None and not state.continues_under(self.spec().budget):
                    self.finished = True
                    self.world.say("the run is finished")
                    return
                self.check_later(5.0)
                return
            assert stores.specs is not None
            stores.specs.record_spec(
                self.setting.tenant,
                self.setting.run,
                self.spec().to_json(),
                source="desk",
                generation=self.setting.desk.generation,
            )
        except KeelgateError as error:
            self.world.say(f"the driver cannot look: {type(error).__name__}")
            self.check_later(5.0)
            return
        finally:
            stores.close()
        self._start()

    def _goes_on(self, state: RunState, stores: Stores) -> bool:
        stop = state.stop
        if stop is None:
            return True
        if not state.continues_under(self.spec().budget):
            return False
        if stop.reason is StopReason.AWAITING_APPROVAL:
            # Its creator recorded since it stopped (``Desk.record_creator``): its owner runs
            # it again, for its approvals to count under notCreator.
            return not state.pending or state.spec.creator != self.spec().creator
        if stop.reason is StopReason.OUTCOME_UNKNOWN:
            # A key no longer on record was dropped by its owner after a definite refusal
            # (nothing happened): `keelgate reconcile` says there is nothing to settle, and the
            # person resumes.
            keys = stores.idempotency
            return all(
                (record := keys.get(self.setting.tenant, u.idempotency_key)) is None
                or record.state in _SETTLED
                for u in state.unknown
            )
        if stop.reason is StopReason.GOAL_MET:
            return False
        # A budget or the verifier: on again once the spec changed since the stop.
        return state.spec.to_json() != self.spec().to_json()

    def _start(self) -> None:
        number = len(self.processes) + 1
        process = StepProcess(self.setting, name=f"step{number}", on_exit=self._exited)
        self.processes.append(process)
        self.running = process
        process.start()

    def _exited(self, process: StepProcess, code: int) -> None:
        if code == EXIT_RESUMABLE and self.paged is not None:
            self.paged()  # stopped for a person (an approval, an unknown outcome, a budget)
        if self.running is process:
            self.running = None
            # At once after a clean step; a little later after a death or a busy run.
            self.check_later(0.0 if code == 0 else self.world.schedule.between(1.0, 30.0))
