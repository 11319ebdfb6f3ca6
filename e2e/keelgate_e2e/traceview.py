"""A trace as a picture: one run's spans, read from Jaeger's query API, drawn as a waterfall.

Why it exists: docs/observability.md shows what one run's trace looks like. The Jaeger built from
Go modules has no UI (its UI is a separate JavaScript build), so this draws the same waterfall a
trace UI draws (a row per span in tree order, a bar from its start to its end, its service, its
status) as a self-contained HTML page, and Chromium (headless, Debian's package) photographs it.
Test and documentation tooling only.

    python -m keelgate_e2e.traceview --trace trace.json --out docs/images/trace.png
"""

from __future__ import annotations

import argparse
import html
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

JSON = dict[str, Any]

COLOURS = {"keelgate-operator": "#6b8fd6", "keelgate-step": "#5fb37f", "keelgate": "#5fb37f"}
SHOWN = (
    "keelgate.outcome",
    "keelgate.idempotency_key",
    "keelgate.step.end",
    "gen_ai.usage.input_tokens",
)


def _tags(span: JSON) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span.get("tags", [])}


def _parent(span: JSON) -> str:
    refs = [r for r in span.get("references", []) if r.get("refType") == "CHILD_OF"]
    return str(refs[0]["spanID"]) if refs else ""


def ordered(spans: list[JSON]) -> list[tuple[int, JSON]]:
    """The spans in tree order (each after its parent, siblings by start), with their depth."""
    children: dict[str, list[JSON]] = {}
    ids = {s["spanID"] for s in spans}
    for span in spans:
        parent = _parent(span)
        children.setdefault(parent if parent in ids else "", []).append(span)
    out: list[tuple[int, JSON]] = []

    def walk(parent: str, depth: int) -> None:
        for span in sorted(children.get(parent, []), key=lambda s: s["startTime"]):
            out.append((depth, span))
            walk(span["spanID"], depth + 1)

    walk("", 0)
    return out


def page(trace: JSON, *, title: str) -> str:
    """The waterfall of one Jaeger trace (``/api/traces/<id>``'s ``data[0]``) as HTML."""
    spans = trace["spans"]
    processes = trace["processes"]
    start = min(s["startTime"] for s in spans)
    end = max(s["startTime"] + s["duration"] for s in spans)
    total = max(end - start, 1)
    rows = []
    for depth, span in ordered(spans):
        tags = _tags(span)
        service = processes[span["processID"]]["serviceName"]
        left = 100 * (span["startTime"] - start) / total
        width = max(100 * span["duration"] / total, 0.3)
        failed = tags.get("otel.status_code") == "ERROR"
        colour = "#d65f5f" if failed else COLOURS.get(service, "#999")
        detail = " · ".join(f"{k.split('.')[-1]}={tags[k]}" for k in SHOWN if k in tags)
        name = html.escape(span["operationName"])
        rows.append(
            f'<tr><td class="name" style="padding-left:{8 + 16 * depth}px">{name}'
            f'<span class="svc">{html.escape(service)}</span></td>'
            f'<td class="lane"><div class="bar" style="left:{left:.2f}%;width:{width:.2f}%;'
            f'background:{colour}"></div><span class="detail" style="left:{min(left, 55):.2f}%">'
            f"{html.escape(detail)}</span></td>"
            f'<td class="ms">{span["duration"] / 1000:.0f} ms</td></tr>'
        )
    return f"""<!doctype html><html><head><meta charset="utf-8"><style>
body {{ font: 13px sans-serif; margin: 16px; color: #222; }}
h1 {{ font-size: 16px; margin: 0 0 10px; }}
table {{ border-collapse: collapse; width: 100%; }}
td {{ border-bottom: 1px solid #eee; padding: 3px 6px; white-space: nowrap; }}
td.name {{ width: 330px; }} td.ms {{ width: 70px; text-align: right; color: #555; }}
td.lane {{ position: relative; }}
.bar {{ position: absolute; top: 4px; height: 12px; border-radius: 2px; }}
.detail {{ position: absolute; top: 16px; font-size: 10px; color: #666; }}
tr {{ height: 30px; }}
.svc {{ color: #888; font-size: 11px; margin-left: 6px; }}
</style></head><body><h1>{html.escape(title)}</h1><table>{"".join(rows)}</table></body></html>"""


def photograph(document: str, out: Path, *, width: int = 1500, height: int = 1100) -> None:
    """Render ``document`` with headless Chromium into a PNG at ``out``."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("chromium is not installed (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "trace.html"
        source.write_text(document, encoding="utf-8")
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--screenshot={out.resolve()}",
                f"--window-size={width},{height}",
                source.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keelgate_e2e.traceview")
    parser.add_argument("--trace", type=Path, required=True, help="a Jaeger /api/traces answer")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--title", default="One AgentRun's trace")
    args = parser.parse_args(argv)
    answer = json.loads(args.trace.read_text())
    trace = answer["data"][0] if "data" in answer else answer
    photograph(page(trace, title=args.title), args.out, height=80 + 30 * len(trace["spans"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
