"""One layout for every ``--help`` of ``keelgate`` and ``kubectl keelgate``: kubectl's and Helm's.

Why it exists: help is the first thing a new user reads, and kubectl users know one shape of it
(Cobra's): what the command does, ``Usage:``, ``Examples:``, the commands, ``Flags:`` as
``-n, --namespace NS`` with a value name, not a type in angle brackets. Every page fits 80
columns (a narrower terminal's width if less), whatever the terminal says, so nothing is cut
and a page piped into a file reads the same. The typer commands (``keelgate.cli.help``) and the
step pod's argparse parser (``keelgate.cli.step``) both describe a page here and print it as
text. This module imports nothing but the standard library: a step pod's start-up must not pay
for typer or rich.
"""

from __future__ import annotations

import shutil
import textwrap
from dataclasses import dataclass

#: The widest a help page is ever printed.
WIDTH = 80
#: How wide the flag column may grow before a flag's help starts on the next line instead.
_FLAG_COLUMN = 30


@dataclass(frozen=True)
class Flag:
    """One flag as the page shows it: ``names`` short first (``-n``, ``--namespace``), the
    name of its value (``NS``; "" for a switch), and what it does."""

    names: tuple[str, ...]
    value: str
    help: str


@dataclass(frozen=True)
class Page:
    """A help page. ``epilog`` is text already laid out (``Examples:`` and other sections, each
    a header line and indented lines); its ``Examples:`` section is shown right after the usage,
    the others last."""

    about: str
    usage: tuple[str, ...]
    arguments: tuple[tuple[str, str], ...] = ()
    commands: tuple[tuple[str, str], ...] = ()
    flags: tuple[Flag, ...] = ()
    epilog: str = ""


def width() -> int:
    """80 columns, or the terminal's width if it is narrower (never under 40)."""
    columns = shutil.get_terminal_size((WIDTH, 24)).columns
    return max(40, min(WIDTH, columns))


def render(page: Page, *, columns: int | None = None) -> str:
    """The page as text, every line at most ``columns`` (default ``width()``) wide."""
    limit = columns or width()
    examples, rest = _split_epilog(page.epilog)
    out: list[str] = []
    for paragraph in _paragraphs(page.about):
        out.extend(textwrap.wrap(paragraph, limit) or [""])
        out.append("")
    out.append("Usage:")
    out.extend(_indented(line, limit, "  ") for line in page.usage)
    if examples:
        out.append("")
        out.extend(_fit(examples, limit))
    if page.commands:
        out.append("")
        out.append("Commands:")
        out.extend(_two_columns(page.commands, limit))
    if page.arguments:
        out.append("")
        out.append("Arguments:")
        out.extend(_two_columns(page.arguments, limit))
    if page.flags:
        out.append("")
        out.append("Flags:")
        out.extend(_flag_lines(page.flags, limit))
    if rest:
        out.append("")
        out.extend(_fit(rest, limit))
    return "\n".join(line.rstrip() for line in out).rstrip() + "\n"


def _paragraphs(text: str) -> list[str]:
    """Paragraphs of a docstring-like text, each joined into one line."""
    blocks = textwrap.dedent(text).strip().split("\n\n")
    return [" ".join(block.split()) for block in blocks if block.strip()]


def _split_epilog(epilog: str) -> tuple[str, str]:
    """(the ``Examples:`` section, every other section) of an epilog. A section starts at a
    line that is not indented (its header) and holds the indented and blank lines after it."""
    sections: list[list[str]] = []
    for line in textwrap.dedent(epilog).splitlines():
        if line.strip() and not line[0].isspace():
            sections.append([line])
        elif sections:
            sections[-1].append(line)
    texts = ["\n".join(lines).strip("\n") for lines in sections]
    examples = [s for s in texts if s.startswith("Examples:")]
    rest = [s for s in texts if not s.startswith("Examples:")]
    return "\n\n".join(examples), "\n\n".join(rest)


def _fit(text: str, limit: int) -> list[str]:
    """Laid-out text kept as it is, but a line too long is wrapped under its own indent."""
    lines: list[str] = []
    for line in text.splitlines():
        indent = line[: len(line) - len(line.lstrip())]
        lines.append(_indented(line.strip(), limit, indent) if line.strip() else "")
    return lines


def _indented(text: str, limit: int, indent: str) -> str:
    wrapped = textwrap.wrap(
        text,
        limit,
        initial_indent=indent,
        subsequent_indent=indent + "    ",
        break_on_hyphens=False,
        break_long_words=True,
    )
    return "\n".join(wrapped)


def _two_columns(rows: tuple[tuple[str, str], ...], limit: int) -> list[str]:
    column = min(max((len(name) for name, _ in rows), default=0), _FLAG_COLUMN) + 4
    lines: list[str] = []
    for name, text in rows:
        lines.extend(_row("  " + name, text, column, limit))
    return lines


def _flag_lines(flags: tuple[Flag, ...], limit: int) -> list[str]:
    shown = [(_flag_name(flag), flag.help) for flag in flags]
    column = min(max(len(name) for name, _ in shown), _FLAG_COLUMN) + 2
    lines: list[str] = []
    for name, text in shown:
        lines.extend(_row(name, text, column, limit))
    return lines


def _flag_name(flag: Flag) -> str:
    """``  -n, --namespace NS``, or ``      --store URL`` (long flags line up, as Cobra's)."""
    shorts = [n for n in flag.names if not n.startswith("--")]
    longs = [n for n in flag.names if n.startswith("--")]
    lead = ", ".join(shorts) + ", " if shorts else "    "
    name = "  " + lead + ", ".join(longs or shorts)
    if not longs:  # a flag with a short name only
        name = "  " + ", ".join(shorts)
    return f"{name} {flag.value}" if flag.value else name


def _row(name: str, text: str, column: int, limit: int) -> list[str]:
    """``name`` then ``text`` wrapped in the column from ``column``; a name too wide for the
    column gets the text on the lines below it."""
    room = max(20, limit - column)
    wrapped = textwrap.wrap(" ".join(text.split()), room, break_on_hyphens=False) or [""]
    if len(name) + 2 > column:
        return [name, *(" " * column + part for part in wrapped)]
    first = name.ljust(column) + wrapped[0]
    return [first, *(" " * column + part for part in wrapped[1:])]
