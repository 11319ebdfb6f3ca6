"""How the CLI shows outcomes and audit trails to a person, and as JSON to a script.

Human output goes through rich; ``--output json`` prints exactly one JSON object as the last
line of stdout. Nothing here may print tool arguments: outcomes and audit events never hold them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any, ClassVar

from rich.console import Console as RichConsole
from rich.text import Text

from keelgate.core.audit import AuditEvent, ChainReport
from keelgate.core.redaction import redact_text
from keelgate.core.types import (
    LateResult,
    Outcome,
    PendingApproval,
    RunPhase,
    StopReason,
    UnknownAction,
)

_STYLE = {
    RunPhase.SUCCEEDED: "bold green",
    RunPhase.STOPPED: "bold yellow",
    RunPhase.FAILED: "bold red",
    RunPhase.RUNNING: "bold blue",
    RunPhase.PENDING: "bold blue",
}


def _no_stop_yet(outcome: Outcome, *, command: str, scope: str, driven: bool | None) -> str:
    """What a run with no stop recorded is doing, as far as this process can tell."""
    resume = f"`{command} resume {outcome.run}{scope}`"
    if driven:
        return (
            "  no stop yet: another process is driving it now; leave it be (a second "
            f"driver is refused), and ask again with `{command} status {outcome.run}"
            f"{scope}`"
        )
    if driven is False:
        return (
            "  no stop recorded, and no process drives it: the one that did ended before "
            "the run stopped (a crash, Ctrl-C, a model server that could not be reached); "
            f"{resume} continues it from its last checkpoint"
        )
    return (
        "  no stop recorded: running in another process now, or its process died; "
        f"{resume} continues it from its last checkpoint"
    )


def _late(late: LateResult) -> str:
    """A call that ended after someone settled it."""
    return (
        f"{late.tool} (action {late.action}) ended {late.status} after "
        f"{late.settled_by or 'someone'} settled it as {late.recorded}; "
        "the settlement stands: check the system it changes"
    )


def _next_step(outcome: Outcome, *, command: str, scope: str) -> str:
    """How to go on from a stop that nothing else above tells how to leave ("" for none)."""
    reason = outcome.stop.reason
    if reason is StopReason.VERIFIER_REJECTIONS:
        return (
            f"  to go on, raise the limit: {command} resume {outcome.run}{scope} "
            "--max-verifier-rejections N"
        )
    if reason is StopReason.COST_UNKNOWN:
        return (
            "  state the model's price (spec.pricing), or give a pricing file: "
            f"{command} resume {outcome.run}{scope} --pricing prices.yaml"
        )
    if outcome.resumable and not outcome.unknown_actions and not outcome.pending_approvals:
        return (
            f"  resume with: {command} resume {outcome.run}{scope} "
            "[--tokens N] [--dollars D] [--max-iterations N] [--timeout S]"
        )
    return ""


class Console:
    #: The program the user typed, which every error and warning line starts with.
    program: ClassVar[str] = "keelgate"

    def __init__(self) -> None:
        self.out = RichConsole(highlight=False, soft_wrap=True)
        self.err = RichConsole(stderr=True, highlight=False, soft_wrap=True)

    def error(self, message: str) -> None:
        self.err.print(Text(f"{self.program}: error: ", style="bold red") + Text(message))

    def warn(self, message: str) -> None:
        self.err.print(Text(f"{self.program}: warning: ", style="bold yellow") + Text(message))

    def say(self, message: str, *, style: str = "") -> None:
        self.out.print(Text(message, style=style))

    def json(self, data: Any) -> None:
        sys.stdout.write(json.dumps(data, separators=(",", ":")) + "\n")
        sys.stdout.flush()

    def outcome(
        self,
        outcome: Outcome,
        *,
        command: str = "keelgate",
        scope: str = "",
        driven: bool | None = None,
    ) -> None:
        """Where a run stands, with the next commands to type; ``command`` is the program that
        drives it (``keelgate temporal`` for a run in a Temporal workflow) and ``scope`` what
        those commands need after the run's name to find it (e.g. `` -n shop``). ``driven``,
        for a run with no stop: whether a process drives it now (None: not known)."""
        title = Text(f"{outcome.run}  ", style="bold")
        title += Text(outcome.phase.value, style=_STYLE[outcome.phase])
        if outcome.phase is RunPhase.RUNNING:
            self.out.print(title)
            self.out.print(_no_stop_yet(outcome, command=command, scope=scope, driven=driven))
            return
        self._stopped(outcome, title)
        for unknown in outcome.unknown_actions:
            self._outcome_unknown(outcome.run, unknown, command=command, scope=scope)
        for late in outcome.late_results:
            self.out.print(Text("  late result: ", style="bold red") + Text(_late(late)))
        for pending in outcome.pending_approvals:
            self._awaiting(outcome.run, pending, command=command, scope=scope)
        hint = _next_step(outcome, command=command, scope=scope)
        if hint:
            self.out.print(hint, style="dim")

    def _stopped(self, outcome: Outcome, title: Text) -> None:
        """The stop (its reason, whether it resumes), what the run used, its message, its
        answer."""
        stop = outcome.stop
        title += Text(f"  {stop.reason.value}")
        title += Text(" (resumable)" if outcome.resumable else "", style="dim")
        self.out.print(title)
        usage = outcome.usage
        self.out.print(
            f"  iteration {outcome.iteration} · tokens {usage.tokens} "
            f"(in {usage.input_tokens} / out {usage.output_tokens}) · "
            f"${usage.dollars} · active {usage.active_seconds:.1f}s",
            style="dim",
        )
        if stop.message and stop.reason is not StopReason.GOAL_MET:
            self.out.print(f"  {stop.message}")
        if outcome.answer:
            self.out.print(Text("  answer: ", style="bold") + Text(outcome.answer))

    def _outcome_unknown(
        self, run: str, unknown: UnknownAction, *, command: str, scope: str
    ) -> None:
        """A WRITE whose outcome is unknown, and the two commands that settle it."""
        self.out.print(
            Text("  outcome unknown: ", style="bold yellow")
            + Text(f"{unknown.tool} (action {unknown.action}, key {unknown.idempotency_key})")
        )
        after = (
            f" (from {unknown.not_executed_after}: until then it may still be sent)"
            if unknown.not_executed_after
            else ""
        )
        self.out.print(
            "  Check the system it changes, then settle it:\n"
            f"    {command} reconcile {run} {unknown.action} --executed "
            f"--by YOU{scope}      # it happened\n"
            f"    {command} reconcile {run} {unknown.action} --not-executed "
            f"--by YOU{scope}  # it did not: never retried under this key{after}"
        )

    def _awaiting(self, run: str, pending: PendingApproval, *, command: str, scope: str) -> None:
        """A call awaiting approval (what its rule still needs), and the two commands that
        decide it."""
        needs = ""
        if pending.rule is not None:
            needs = f": {pending.approvals} of {pending.rule.describe()}"
            if pending.approved_by:
                needs += f" (so far {', '.join(pending.approved_by)})"
            if pending.expires_at:
                needs += f"; the first expires at {pending.expires_at}"
        self.out.print(
            Text("  awaiting approval: ", style="bold yellow")
            + Text(f"{pending.tool} (action {pending.action}){needs}")
        )
        self.out.print(
            f"    {command} approve {run} {pending.action} --approve --by YOU{scope}"
            f"\n"
            f"    {command} approve {run} {pending.action} --deny --by YOU{scope}"
        )

    def audit(
        self, run: str, trail: Trail, report: ChainReport | None, *, unsigned: str = ""
    ) -> None:
        """The trail, then what ``--verify`` found: every link intact, or one line per broken
        link. ``unsigned`` is the problem that says the chain has no signed head: not a broken
        link, so said as what it is."""
        # A plain table, written straight out: rich's Table measures and wraps every cell,
        # which took tens of seconds for a run of 10,000 iterations (40,000 rows).
        out = self.out.file
        out.write(f"audit trail of {_printable(run)}\n")
        out.writelines(trail.lines())
        out.flush()
        if report is not None:
            broken = [problem for problem in report.problems if problem != unsigned]
            if not broken:
                self.out.print(
                    Text(
                        f"chain verified: {report.events} events, every link intact",
                        style="bold green",
                    )
                )
            # One line per problem, each naming the run, so a line alone says it all.
            for problem in broken:
                line = Text("chain BROKEN: ", style="bold red")
                self.out.print(line + Text(f"run {run!r}: {_printable(problem)}"))
            if unsigned and unsigned in report.problems:
                line = Text("not verified with --key: ", style="bold yellow")
                self.out.print(line + Text(f"run {run!r}: {unsigned}"))


_HEADER = ("#", "time (UTC)", "event", "actor", "written by", "details")


class Trail:
    """An audit trail as it is shown, gathered one event at a time while the chain is read.

    Only the shown text of each event is kept, never the event. Every cell goes through
    ``_printable``: an actor or a goal is text a user typed, and must not drive the terminal.
    """

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str, str, str]] = []

    def add(self, event: AuditEvent) -> None:
        self.rows.append(
            (
                str(event.seq),
                _printable(event.at[:23].replace("T", " ")),  # 2026-10-05 12:00:00.000: the date
                _printable(event.type.removeprefix("loop.")),
                _printable(event.actor),
                # The database role that wrote it (PostgreSQL); "-" where none is recorded.
                _printable(event.writer) if event.writer else "-",
                _printable(_details(event)),
            )
        )

    def lines(self) -> Iterator[str]:
        """The header and one line per event, columns aligned to their widest cell. The
        writer's column is shown only where the store records writers (PostgreSQL)."""
        named = any(row[4] != "-" for row in self.rows)
        widths = [len(h) for h in _HEADER[:5]]
        for row in self.rows:
            for i in range(5):
                widths[i] = max(widths[i], len(row[i]))
        w0, w1, w2, w3, w4 = widths
        for seq, at, kind, actor, writer, details in (_HEADER, *self.rows):
            cells = [seq.rjust(w0), at.ljust(w1), kind.ljust(w2), actor.ljust(w3)]
            if named:
                cells.append(writer.ljust(w4))
            yield "  ".join((*cells, details)).rstrip() + "\n"


# C0 and C1 control characters (and DEL) shown as escapes, never written to a terminal as is.
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}


def _printable(text: str) -> str:
    # isprintable is a quick check; most text has nothing to escape.
    return text if text.isprintable() else text.translate(_CONTROL)


def _details(event: AuditEvent) -> str:
    # One pass over the event's data, in its order (a long trail calls this per event).
    parts = []
    for key, value in event.data.items():
        if key == "idempotencyKey" or (key == "replayed" and value is False):
            continue
        if key == "actions" and isinstance(value, list):
            value = (
                ", ".join(
                    f"{a.get('action')} {a.get('tool')}" for a in value if isinstance(a, dict)
                )
                or "none"
            )
        elif value in (None, "", []):
            continue
        elif isinstance(value, list):
            value = ",".join(str(v) for v in value)
        parts.append(f"{key}={value}")
    # The chain keeps what was recorded; what is shown goes through the one redactor (a goal
    # recorded before goals were redacted may hold a secret).
    text = redact_text(" ".join(parts))
    # A run's goal can be long; the table is for reading (--output json has every byte).
    return text if len(text) <= 240 else text[:239] + "…"
