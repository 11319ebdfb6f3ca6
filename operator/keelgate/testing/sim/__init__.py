"""The simulator: whole runs through the real loop, gateway, stores, tools, model adapters (and
operator) over simulated surroundings, on virtual time, judged from the world's own books by one
checker per promise (issues 39 and 48).

Why it exists: every broken promise found so far was found by someone imagining a window no test
had thought of. Here the machine imagines: one seeded schedule of choices decides every death,
pause, lost request or answer, late answer, person's decision, spec edit and move; the same seed
replays exactly; a failure prints its seed, a shrunk schedule and the one command that replays
it. ``make sim`` runs it (``python -m keelgate.testing.sim``); docs/simulation.md says what is
real, what is modelled and why, and what it cannot find. Product code never imports it (an
import-linter contract keeps it so).
"""

from keelgate.testing.sim.simulate import Outcome, decode, encode, shrink, simulate

__all__ = ["Outcome", "decode", "encode", "shrink", "simulate"]
