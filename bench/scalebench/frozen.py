"""Imported last by the executor's forkserver: the container's start-up, done once. pydantic
builds the validators of a step's run state and spec at their first use (its schemas, tens of
milliseconds a process); they are built here, and then every object the preload made is set
aside from the garbage collector (``gc.freeze``), so a forked step never scans them, nor writes
to their pages (copy-on-write stays shared). What a real step pod pays for its start is measured
on its own (``bench/step_start.py``). Importing it elsewhere is harmless: it only warms and
freezes what exists.
"""

from __future__ import annotations

import gc

import pydantic.plugin._loader  # noqa: F401 - imported by pydantic at the first validation

from keelgate.core.json_codec import _adapter  # the validators' cache, built ahead of the forks
from keelgate.core.spec import LoopSpec
from keelgate.core.state import RunState

for _value in (LoopSpec, RunState):
    _adapter(_value)
gc.collect()
gc.freeze()
