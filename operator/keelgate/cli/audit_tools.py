"""``keelgate audit export`` and ``keelgate audit verify``: a run's audit chain as a signed file,
and its check with nothing but that file and a public key.

Why it exists: ``keelgate audit --verify`` trusts the store the chain lives in. An auditor gets
the chain as an in-toto Statement in a DSSE envelope (``keelgate.core.attestation``,
``keelgate.adapters.signing``), signed with a key the store's writers need not hold, and checks
it offline: the signature, every event's hash and link, and that the chain runs whole from the
run's start to its head. Export refuses to sign a chain that does not verify in its store.
Exit codes: 0 verified (or exported), 1 a file or chain that does not verify (one line per
problem, naming the event), 2 bad input, 5 the store cannot be reached. This module must never
print or write a private key, and never a tool argument (events hold none).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from keelgate.cli.commands import NamespaceOption, OutputFormat, OutputOption, StoreOption, _opened
from keelgate.cli.help import App
from keelgate.cli.render import Console
from keelgate.core.attestation import check_statement, spec_digest, statement
from keelgate.core.audit import AuditEvent, utc_now
from keelgate.errors import InputError
from keelgate.stores import DEFAULT_URL

app = App(
    name="audit",
    help="A run's audit chain as a signed file (export), and its offline check (verify).",
)


OutputFileOption = Annotated[
    str,
    typer.Option(
        "--output-file",
        metavar="FILE",
        help="Where to write the signed envelope ('-', the default: stdout).",
    ),
]
ExportOutputOption = Annotated[
    str,
    typer.Option(
        "--output",
        "-o",
        metavar="text|json",
        help="What is said once the file is written: text, or json (one object, last line).",
    ),
]


@app.command("export")
def export_command(
    run: Annotated[str, typer.Argument(help="The run's name.")],
    sign_key: Annotated[
        str,
        typer.Option(
            "--sign-key",
            metavar="FILE",
            help="A PEM private key, Ed25519 or ECDSA P-256, to sign with.",
        ),
    ],
    out: OutputFileOption = "-",
    namespace: NamespaceOption = None,
    store: StoreOption = DEFAULT_URL,
    output: ExportOutputOption = "text",
) -> int:
    """Write the run's chain as an in-toto Statement in a DSSE envelope signed with --sign-key."""
    from keelgate.adapters.signing import read_key_file

    shown = export_format(output)
    return export_run(
        run, read_key_file(sign_key, "--sign-key"), out, namespace, store, output=shown
    )


def export_format(output: str) -> OutputFormat:
    """``-o`` of ``audit export``: the format, as for every command. It used to name the file,
    so a file name given to it is refused with the flag that writes a file now (never taken as
    a format, nor written to a file named ``json``)."""
    try:
        return OutputFormat(output)
    except ValueError:
        raise InputError(
            "--output",
            f"{output!r} is not a format (text or json): -o is the output format of every "
            f"command; write the envelope to a file with --output-file {output}",
        ) from None


def export_run(
    run: str,
    pem: bytes,
    out: str,
    namespace: str | None,
    store: str,
    *,
    output: OutputFormat = OutputFormat.text,
) -> int:
    """Export ``run``'s chain signed with the PEM private key ``pem`` (``keelgate audit export``
    and ``kubectl keelgate audit export``, whose key may come from a Secret)."""
    from keelgate.adapters.signing import load_private_key, sign_envelope

    key = load_private_key(pem)
    with _opened(store, run, namespace, read_only=True) as (loop, tenant, name):
        events: list[AuditEvent] = []
        report = loop.verify_audit(tenant, name, each=events.append)
        if not report.ok:
            console = Console()
            for problem in report.problems:
                console.error(problem)
            console.error(f"the chain of {name} does not verify in its store: not signed")
            return 1
        spec = loop.state(tenant, name).spec.to_json()
    document = statement(tenant, name, events, spec_sha256=spec_digest(spec), exported_at=utc_now())
    payload = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    envelope = json.dumps(sign_envelope(payload, key), indent=2) + "\n"
    if out == "-":
        sys.stdout.write(envelope)
        return 0
    try:
        Path(out).write_text(envelope)
    except OSError as error:
        raise InputError("--output-file", f"{out}: {error.strerror or error}") from None
    kind = document["predicateType"]
    if output is OutputFormat.json:
        Console().json(
            {
                "run": name,
                "namespace": tenant,
                "events": len(events),
                "file": out,
                "predicateType": kind,
            }
        )
    else:
        print(f"{name}: {len(events)} events exported to {out}, signed ({kind})")
    return 0


@app.command("verify")
def verify_command(
    file: Annotated[str, typer.Argument(help="The envelope `keelgate audit export` wrote.")],
    key: Annotated[str, typer.Option("--key", help="The PEM public key it must be signed with.")],
    output: OutputOption = OutputFormat.text,
) -> int:
    """Check an exported chain offline: the signature, every event's hash and link, and that
    the chain is whole from the run's start to its head. No store is needed."""
    from keelgate.adapters.signing import (
        EnvelopeError,
        load_public_key,
        open_envelope,
        read_key_file,
    )
    from keelgate.core.attestation import PAYLOAD_TYPE

    public = load_public_key(read_key_file(key, "--key"))
    try:
        text = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
    except FileNotFoundError:
        raise InputError("FILE", f"{file}: no such file") from None
    except OSError as error:
        raise InputError("FILE", f"{file}: {error.strerror or error}") from None
    problems: list[str] = []
    document: dict[str, object] = {}
    try:
        opened = open_envelope(text, public)
    except EnvelopeError as error:
        problems.append(str(error))
    else:
        if opened.payload_type != PAYLOAD_TYPE:
            problems.append(f"the payload type is {opened.payload_type!r}, not {PAYLOAD_TYPE}")
        try:
            document = json.loads(opened.payload)
        except (UnicodeDecodeError, json.JSONDecodeError):
            problems.append("the signed payload is not JSON")
        else:
            problems.extend(check_statement(document))
    predicate = document.get("predicate") if isinstance(document, dict) else None
    events = len(predicate.get("events", [])) if isinstance(predicate, dict) else 0
    where = (
        f"{predicate.get('tenant')}/{predicate.get('run')}" if isinstance(predicate, dict) else file
    )
    if output is OutputFormat.json:
        Console().json(
            {
                "file": file,
                "run": where,
                "events": events,
                "verified": not problems,
                "problems": problems,
            }
        )
    elif problems:
        for problem in problems:
            print(f"{file}: {problem}", file=sys.stderr)
    else:
        print(f"{where}: {events} events, signature and chain verified")
    return 1 if problems else 0
