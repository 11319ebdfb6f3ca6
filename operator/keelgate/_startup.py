"""A console script's start-up: no garbage collection over the imports it cannot avoid.

Why it exists: every step of every run is a new ``keelgate step`` process, and most of its
start is imports (pydantic, psycopg) whose objects live until it exits; scanning them for
garbage again and again, and once more at exit, is time a step pays for nothing
(docs/performance.md, "The garbage collector at start-up"). It must never change the collector
of a process that did not start through a console script (a test, a program calling
``keelgate.cli.main``), and never import anything but the standard library: the step's start-up
path imports it.
"""

from __future__ import annotations

import gc

# Set by ``starting`` in a console script's process, never by ``main`` called in-process.
_starting = False


def starting() -> None:
    """A console script's first act: no cyclic garbage collection until ``started``.

    A command is a one-shot process that imports much (pydantic, psycopg, typer) before it does
    anything. Each import allocates thousands of objects that live until the process ends, and
    the collector would scan them again and again while they pile up, then once more at exit,
    freeing nothing: 0.04-0.08 s of a step pod's start on this project's machine."""
    global _starting
    _starting = True
    gc.disable()


def started() -> None:
    """A command's imports are done: what they made is set aside for good (``gc.freeze``,
    never scanned again, even at exit) and collection resumes for the work itself.

    Does nothing unless ``starting`` ran in this process: a test or a program calling ``main``
    keeps its own collector as it was."""
    global _starting
    if _starting:
        _starting = False
        gc.freeze()
        gc.enable()
