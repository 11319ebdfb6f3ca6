"""Standard output as a script sees it: a closed pipe is not a failure, and stdout is ours.

Why it exists: ``keelgate audit RUN --verify | head -1`` closes the pipe after one line. Python
then raises ``BrokenPipeError`` at the next write, which used to end the command with exit 1,
the documented code for a tampered chain, and nothing on stderr. A reader that stopped reading
is not an error of the command: the writes that follow are dropped quietly (into
``/dev/null``), the command finishes, and it exits with its own code (0 when nothing failed),
as the shell tools a pipeline is made of do. And while a run is driven, a tool's own output
(its ``print()``, a subprocess it starts) goes to stderr, so that ``--output json`` leaves one
JSON object alone on stdout. Nothing here may drop a write to a stream that is still open.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TextIO


class _Guarded:
    """A text stream whose writes, once its reader has gone, go nowhere instead of raising."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    def _gone(self) -> None:
        """Point the stream's descriptor at /dev/null: what is still buffered, and every later
        write (Python's own flush at exit included), lands there without an error."""
        self.reader_gone = True
        _to_devnull(self._stream)
        with contextlib.suppress(BrokenPipeError, OSError, ValueError):
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def closed_pipes_are_quiet() -> Iterator[None]:
    """While inside, a write to a stdout or stderr whose reader has gone is dropped."""
    saved = sys.stdout, sys.stderr
    sys.stdout = _Guarded(sys.stdout)
    sys.stderr = _Guarded(sys.stderr)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = saved


def reader_gone() -> None:
    """A write that bypassed the guard met a closed pipe: drop stdout's later writes too."""
    stream = sys.stdout
    if isinstance(stream, _Guarded):
        stream._gone()
    else:
        _to_devnull(stream)


def _to_devnull(stream: Any) -> None:
    """Point ``stream``'s descriptor at /dev/null (nothing, for a stream with none)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        descriptor = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, descriptor)
        os.close(devnull)


@contextlib.contextmanager
def tool_output_to_stderr() -> Iterator[None]:
    """While a run is driven, what its tools and models print goes to stderr: Python's own
    ``print`` and, through the descriptor, any subprocess or C library. Keelgate's own output
    comes after the drive, on stdout."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    saved: int | None = None
    try:
        out, err = sys.__stdout__, sys.__stderr__
        if out is not None and err is not None:
            saved = os.dup(out.fileno())
            os.dup2(err.fileno(), out.fileno())
    except (OSError, ValueError, AttributeError):
        saved = None  # no real descriptors (an embedding host): Python's print is still moved
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        if saved is not None:
            out = sys.__stdout__
            assert out is not None
            os.dup2(saved, out.fileno())
            os.close(saved)
