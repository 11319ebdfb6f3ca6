"""Lists as kubectl prints them, for ``keelgate runs`` and ``kubectl keelgate list|pending``.

Why it exists: both tools list runs, and a kubectl user expects one way for both: a plain table
(``-o wide`` adds columns, ``AGE`` as ``45s``, ``12m``, ``3h``, ``2d``), ``-o json`` and
``-o yaml`` (one document), ``-o name`` (``kind.group/name`` lines). Each command builds its
rows and its document; this module only prints them. It must never print a tool's argument
(nothing it is given holds one).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Any

import typer

from keelgate.kube.naming import GROUP
from keelgate.kube.times import parse_time

__all__ = ["GROUP", "AllNamespacesOption", "ListOutput", "ListOutputOption", "age", "emit"]


class ListOutput(StrEnum):
    text = "text"
    wide = "wide"
    json = "json"
    yaml = "yaml"
    name = "name"


ListOutputOption = Annotated[
    ListOutput,
    typer.Option(
        "--output", "-o", metavar="FORMAT", help="text, wide, json, yaml or name (as kubectl)."
    ),
]
AllNamespacesOption = Annotated[
    bool,
    typer.Option("--all-namespaces", "-A", help="Every namespace you may list, not just one."),
]


def age(created: str | None, now: dt.datetime) -> str:
    """kubectl's age: 45s, 12m, 3h, 2d."""
    when = parse_time(created)
    if when is None:
        return "<unknown>"
    return span(max(0, int((now - when).total_seconds())))


def span(seconds: int) -> str:
    """A number of seconds in kubectl's largest whole unit: 45s, 12m, 3h, 2d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def against(used: Any, limit: Any) -> str:
    """``used/limit``, or ``used`` alone when there is no limit (a wide column's cell)."""
    return f"{used}/{limit}" if limit not in (None, "") else str(used)


def table(rows: Sequence[Sequence[str]]) -> str:
    """Columns aligned to their widest cell, three spaces apart, as kubectl's."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "   ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    )


def emit(
    output: ListOutput,
    document: Any,
    names: Sequence[str],
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    empty: str,
) -> None:
    """Print a list: ``document`` for json and yaml, ``names`` for name (one a line, already
    ``kind.group/name``), else the table of ``header`` and ``rows`` (``empty`` if none)."""
    if output is ListOutput.json:
        print(json.dumps(document, indent=2))
    elif output is ListOutput.yaml:
        import yaml

        print(yaml.safe_dump(document, sort_keys=False), end="")
    elif output is ListOutput.name:
        for name in names:
            print(name)
    elif not rows:
        print(empty)
    else:
        print(table([list(header), *rows]))
