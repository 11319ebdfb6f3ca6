"""``keelgate step``: the program of a step pod, on a start-up path of its own.

A step pod runs one step of a run from the spec its operator recorded in the store, then exits
with a code the operator reads: 0 the step ended and the run goes on (or met its goal), 3 a
resumable stop, 1 a failed stop, 2 bad input, 4 another process drives the run, 5 the store
cannot be reached, 6 another holder took the run over (its epoch, ``--epoch``, is stale), 75 it
was asked to stop (``keelgate.core.exits``, which the operator reads
too). Its outcome is one JSON line, last on stdout and, where the kubelet
provides one, the termination message.

SIGTERM (a node drain, an eviction, a rollout) is not a death: the call under way is finished
(each call is bounded by its write deadline) and recorded, the step stops at the next
checkpoint and exits 75 (``Preempted``), and the next step pod goes on from there with nothing
unknown. The pod's grace period covers the longest call (the operator sets it).

Every step of every run pays this program's start, so it is kept apart from the interactive
CLI: it parses its few options with argparse and imports neither typer nor rich, nor kopf nor a
Kubernetes client. It must never print a secret (error lines go through the redactor) or a
tool's argument.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from keelgate.core.exits import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_PREEMPTED,
    exit_code,
)
from keelgate.errors import InputError, KeelgateError, MissingExtra, Preempted

DESCRIPTION = "Run one step of a run (one iteration, less if it stops) in a step pod, and exit."


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own: exit 2 with one line, no usage
        raise InputError("keelgate step", message)

    def format_help(self) -> str:
        """The page in the layout of every other keelgate command (``keelgate.cli.helptext``)."""
        from keelgate.cli.examples import EXAMPLES
        from keelgate.cli.helptext import Flag, Page, render

        flags = tuple(
            Flag(
                tuple(sorted(action.option_strings, key=lambda n: (n.startswith("--"), n))),
                "" if action.nargs == 0 else str(action.metavar or action.dest).upper(),
                (action.help or "") + (" (required)" if action.required else ""),
            )
            for action in self._actions
            if action.option_strings
        )
        return render(
            Page(
                about=self.description or "",
                usage=(f"{self.prog} -n NS --run RUN [flags]",),
                flags=flags,
                epilog=EXAMPLES.get(self.prog, ""),
            )
        )


def _epoch_from_environment() -> int | None:
    # Read when the step runs, not when its flags are built: a bad value must not stop --help.
    text = os.environ.get("KEELGATE_EPOCH", "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise InputError("KEELGATE_EPOCH", "must be a whole number (the run's epoch)") from None


def parser() -> argparse.ArgumentParser:
    parse = _Parser(prog="keelgate step", description=DESCRIPTION, add_help=False)
    parse.add_argument("-h", "--help", action="help", help="Show this message and exit.")
    parse.add_argument(
        "--namespace", "-n", metavar="NS", required=True, help="The run's namespace (tenant)."
    )
    parse.add_argument("--run", metavar="RUN", required=True, help="The run's name.")
    parse.add_argument(
        "--store",
        metavar="URL",
        default=os.environ.get("KEELGATE_STORE", ""),
        help="Store URL (env KEELGATE_STORE): postgresql://... in a cluster.",
    )
    parse.add_argument(
        "--epoch",
        metavar="N",
        type=int,
        default=None,
        help="The epoch the operator took the run under (env KEELGATE_EPOCH): every write of "
        "the step carries it, and the store refuses it once another holder took the run (exit 6).",
    )
    parse.add_argument(
        "--confirmer",
        metavar="REF",
        default="",
        help="Trusted code asking the system of record: 'pkg.mod:obj'.",
    )
    parse.add_argument(
        "--confirmer-url",
        metavar="URL",
        default="",
        help="Ask the system of record: GET this URL ({idempotencyKey}, {tool}, {action}, {run}, "
        "{tenant} filled in) answering JSON {executed: true|false}.",
    )
    parse.add_argument(
        "--late-call-grace",
        metavar="SECONDS",
        type=float,
        default=30.0,
        help="Seconds to wait, before exiting, for a timed-out call still running (default 30).",
    )
    parse.add_argument(
        "--termination-log",
        metavar="FILE",
        type=Path,
        default=Path("/dev/termination-log"),
        help="Where the kubelet reads the termination message.",
    )
    return parse


def load_confirmer(reference: str, url: str = "") -> Any:
    """The confirmer named by ``--confirmer`` (Python) or ``--confirmer-url`` (HTTP), if any."""
    if reference and url:
        raise InputError("--confirmer", "give --confirmer or --confirmer-url, not both")
    if url:
        from keelgate.adapters.confirmers import HttpConfirmer

        return HttpConfirmer(url)
    if not reference:
        return None
    from keelgate.adapters.loading import load_callable

    found = load_callable(reference, field="--confirmer")
    # A confirmer object, or a class / factory making one (a class has ``confirm`` too, but
    # unbound: it must be made first).
    if isinstance(found, type) or not hasattr(found, "confirm"):
        return found()
    return found


def _step(args: argparse.Namespace) -> int:
    from keelgate._startup import started
    from keelgate.core import tracing
    from keelgate.runners.step import StepRunner
    from keelgate.stores import read_store_url
    from keelgate.stores._holds import wait_for_running_calls

    if not args.store:
        raise InputError("--store", "a step needs the store URL (env KEELGATE_STORE)")
    epoch = args.epoch if args.epoch is not None else _epoch_from_environment()
    # Read once, here: the store URL is passed on read (libpq reads a PostgreSQL one once).
    store = read_store_url(args.store)  # imports the store's driver (psycopg: half the start-up)
    started()
    sys.path.insert(0, str(Path.cwd()))
    asked = _stop_on_sigterm()
    tracer = tracing.NO_TRACING
    if tracing.endpoint_set(os.environ):  # imported only then: a step's start pays nothing else
        from keelgate.adapters.tracing import configured

        # Each span is sent as it ends: what a crash cuts short of the step stays sent.
        tracer = configured(export_each_span=True)
    runner = StepRunner(
        store=store,
        confirmer=load_confirmer(args.confirmer, args.confirmer_url),
        tracer=tracer,
        epoch=epoch,
    )
    try:
        outcome = runner.step(args.namespace, args.run, asked_to_stop=asked.is_set)
    finally:
        # A call that timed out may still end and be recorded; cut off, it stays unknown.
        wait_for_running_calls(args.late_call_grace)
        tracer.close()
    line = json.dumps(outcome.to_json(), sort_keys=True)
    print(line, flush=True)
    log: Path = args.termination_log
    if log.is_file() and os.access(log, os.W_OK):
        log.write_text(line[:4096], encoding="utf-8")
    code = exit_code(outcome, asked=asked.is_set())
    if code == EXIT_PREEMPTED:
        _say(str(Preempted(args.namespace, args.run)), level="stopped")
    return code


def _stop_on_sigterm() -> threading.Event:
    """An event set by SIGTERM, which from now on asks the step to stop at its next
    checkpoint instead of ending the process (the call under way goes on: Python resumes an
    interrupted system call after the handler)."""
    asked = threading.Event()

    def handler(signum: int, frame: object) -> None:
        asked.set()

    signal.signal(signal.SIGTERM, handler)
    return asked


def main(argv: Sequence[str]) -> int:
    """Run ``keelgate step ARGS``; returns the exit code."""
    import logging

    from keelgate.core import failpoints
    from keelgate.core.redaction import log_to_stderr

    log_to_stderr(logging.WARNING, "keelgate: warning: %(message)s")
    if failpoints.environment_error is not None:  # a KEELGATE_FAILPOINTS nobody can arm
        _say(str(failpoints.environment_error))
        return EXIT_BAD_INPUT
    try:
        return _step(parser().parse_args(list(argv)))
    except SystemExit as done:  # --help
        return int(done.code or 0)
    except KeelgateError as error:
        _say(str(error))
        return error.exit_code
    except KeyboardInterrupt:
        _say("interrupted: nothing saved was lost; the operator starts the step again")
        return EXIT_INTERRUPTED
    except Exception as error:
        missing = MissingExtra.of(error) if isinstance(error, ImportError) else None
        if missing is not None:  # the image lacks an extra: say which, never an internal error
            _say(str(missing))
            return missing.exit_code
        if os.environ.get("KEELGATE_DEBUG"):
            raise
        _say(f"internal error: {type(error).__name__}: {error}")
        return EXIT_FAILED


def _say(message: str, *, level: str = "error") -> None:
    from keelgate.core.redaction import redact_text

    print(f"keelgate: {level}: {redact_text(message)}", file=sys.stderr, flush=True)
