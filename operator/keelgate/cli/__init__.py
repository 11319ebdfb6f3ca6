"""The ``keelgate`` command line: run, resume, reconcile, approve and audit runs in-process.

It is a thin shell over the runners and the loop: it parses, calls, and prints. Exit codes are
part of the contract: 0 goal met, 3 resumable (a stop to act on, or a model server that could
not be reached: run again), 1 a failure, 2 bad input (one line naming the field, the user's own
code included), 4 the run is busy in another process, 5 the store cannot be opened or reached (so a
script can tell "try again when the database is back" from a failed run), 6 another holder
took the run over (a write under a stale epoch refused), 130 interrupted,
143 terminated (SIGTERM while a run is driven).
``dispatch`` applies them once, for ``keelgate`` and for ``kubectl-keelgate`` (whose exit 5
also covers an API server that cannot be reached). An error's code is its class's
``exit_code`` (the table in ``keelgate.errors``; the codes are named in ``keelgate.core.exits``,
which a step pod and the operator read too), never which
``except`` clause caught it. It must never print a traceback for a user's mistake, and never
print tool arguments or secrets: every error line goes through ``redact_text``, whatever text it
quotes.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from keelgate._startup import started, starting
from keelgate.core.exits import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
)
from keelgate.errors import (
    KeelgateError,
    MissingExtra,
    ModelUnavailable,
    RemoteError,
    RunBusy,
    StaleCheckpoint,
    StoreUnavailable,
)

if TYPE_CHECKING:
    import typer

    from keelgate.cli.driving import Interrupted

_INTERRUPTED = "interrupted: nothing saved was lost"


def _interrupted(stopped: Interrupted) -> str:
    name = "SIGTERM" if stopped.terminated else "Ctrl-C"
    if stopped.finished:
        return (
            f"stopped ({name}) at a checkpoint, after the WRITE being sent ended and was "
            f"recorded: nothing is unknown; `keelgate resume {stopped.run}` goes on from there"
        )
    said = "terminated (SIGTERM): nothing saved was lost" if stopped.terminated else _INTERRUPTED
    return (
        f"{said}; `keelgate resume {stopped.run}` continues from the last checkpoint "
        "(a WRITE cut off mid-call becomes an unknown outcome to settle)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``keelgate`` executable; returns the exit code."""
    from keelgate.cli.pipes import closed_pipes_are_quiet

    args = list(sys.argv[1:] if argv is None else argv) or ["--help"]
    with closed_pipes_are_quiet():
        return _main(args)


def _main(args: list[str]) -> int:
    if args[0] == "step" and not os.environ.get(COMPLETE_VAR):
        # A step pod's start-up: its own parser, no typer or rich (see keelgate.cli.step).
        from keelgate.cli.step import main as step_main

        return step_main(args[1:])
    if args[:2] in (["audit", "export"], ["audit", "verify"]) and not os.environ.get(COMPLETE_VAR):
        # `audit RUN` shows a run's chain; these two are commands of their own under its name.
        from keelgate.cli import audit_tools

        started()
        return dispatch(audit_tools.app, args[1:], prog_name="keelgate audit")
    from keelgate.cli import audit_tools as _audit  # noqa: F401 - registers audit RUN
    from keelgate.cli import cluster as _cluster  # noqa: F401 - registers step and operator
    from keelgate.cli import commands
    from keelgate.cli import temporal as _temporal  # noqa: F401 - registers temporal commands
    from keelgate.cli import tenant as _tenant  # noqa: F401 - registers tenant add|remove|list

    if os.environ.get(COMPLETE_VAR):
        # A shell asking for completions (`keelgate completion SHELL` wrote its script): the
        # shells' protocols are typer's, registered here for this one question.
        from typer._completion_classes import completion_init

        completion_init()
    started()
    return dispatch(commands.app, args, prog_name="keelgate", check_failpoints=True)


#: The variable a shell's completion script sets when it asks ``keelgate`` for completions.
COMPLETE_VAR = "_KEELGATE_COMPLETE"


def dispatch(
    app: typer.Typer,
    args: Sequence[str],
    *,
    prog_name: str,
    check_failpoints: bool = False,
) -> int:
    """Run ``app`` on ``args`` and turn whatever it raises into one line and an exit code.

    Shared by ``keelgate`` and ``kubectl-keelgate`` so both speak the same exit codes."""
    import typer

    from keelgate.cli import pipes
    from keelgate.cli.driving import Interrupted
    from keelgate.cli.render import Console
    from keelgate.core import failpoints
    from keelgate.core.redaction import log_to_stderr, redact_text

    # Errors and warnings name the program the user typed: `kubectl keelgate: error: ...`.
    Console.program = "kubectl keelgate" if prog_name.startswith("kubectl") else "keelgate"
    console = Console()
    # Warnings (an unknown outcome, a tool hint that disagrees with the manifest) go to stderr
    # as one line each; they never carry tool arguments or secrets.
    log_to_stderr(logging.WARNING, f"{Console.program}: warning: %(message)s")
    args = list(args) or ["--help"]
    as_json = _wants_json(args)

    def fail(code: int, message: str) -> int:
        """One line on stderr; with --output json, also one JSON object as stdout's last line."""
        # A message may quote what the user typed (a usage error quotes a stray argument): no
        # password in it may reach the terminal, a log collector or a script's JSON.
        message = redact_text(message)
        console.error(message)
        if as_json:
            console.json({"error": message, "exitCode": code})
        return code

    if check_failpoints and failpoints.environment_error is not None:
        return fail(EXIT_BAD_INPUT, str(failpoints.environment_error))
    command = typer.main.get_command(app)
    try:
        result = command.main(args, prog_name=prog_name, standalone_mode=False)
    except typer.Exit as done:
        return int(done.exit_code)
    except Interrupted as stopped:
        code = EXIT_TERMINATED if stopped.terminated else EXIT_INTERRUPTED
        return fail(code, _interrupted(stopped))
    except (typer.Abort, KeyboardInterrupt):
        return fail(EXIT_INTERRUPTED, _INTERRUPTED)
    except BrokenPipeError:
        # Help or a listing written past the guard into a pipe whose reader has gone (`| head`):
        # the reader has what it wanted, and that is no failure.
        pipes.reader_gone()
        return EXIT_OK
    except typer.TyperException as error:  # a usage error: bad or missing flag or argument
        return fail(EXIT_BAD_INPUT, _usage_line(error))
    except KeelgateError as error:
        # The error table decides the exit code (the same one a step pod exits with); only the
        # wording is the CLI's.
        return fail(_exit_code(error), _error_line(error))
    except Exception as error:
        # A package of an extra this install lacks, met where no command named it: which extra
        # to install, never an internal error.
        missing = MissingExtra.of(error) if isinstance(error, ImportError) else None
        if missing is not None:
            return fail(missing.exit_code, str(missing))
        if os.environ.get("KEELGATE_DEBUG"):
            raise
        return fail(
            EXIT_FAILED,
            f"internal error: {type(error).__name__}: {error} "
            "(set KEELGATE_DEBUG=1 for a traceback)",
        )
    code = int(result or 0)
    if code == EXIT_INTERRUPTED:  # typer turns Ctrl-C into a quiet exit 130
        return fail(EXIT_INTERRUPTED, _INTERRUPTED)
    return code


def _busy(error: KeelgateError) -> str:
    return f"{error} (another process is driving this run; nothing was done here)"


# How the CLI words an error beyond its message, by class: the most specific class of the error
# with an entry here wins (its MRO is walked), so no wording depends on the order of clauses.
_WORDING: dict[type[KeelgateError], Callable[[KeelgateError], str]] = {
    RunBusy: _busy,
    StaleCheckpoint: _busy,
    StoreUnavailable: lambda error: f"--store: {error}",
    ModelUnavailable: lambda error: (
        f"{error}: the run is where it was, nothing lost (no stop recorded); run the same "
        "command again once the model server answers"
    ),
}


def _exit_code(error: KeelgateError) -> int:
    # An error a Temporal worker met exits as the same mistake would here.
    return error.origin_exit_code if isinstance(error, RemoteError) else error.exit_code


def _error_line(error: KeelgateError) -> str:
    for cls in type(error).__mro__:
        wording = _WORDING.get(cls)
        if wording is not None:
            return wording(error)
    return str(error)


def _wants_json(args: Sequence[str]) -> bool:
    for index, arg in enumerate(args):
        if arg in ("--output=json", "-ojson"):
            return True
        if arg in ("--output", "-o") and index + 1 < len(args) and args[index + 1] == "json":
            return True
    return False


def _usage_line(error: typer.TyperException) -> str:
    format_message = getattr(error, "format_message", None)
    message = format_message() if callable(format_message) else str(error)
    return " ".join(str(message).split())


def run() -> None:
    """Console-script wrapper: exit with main's code."""
    starting()
    sys.exit(main())
