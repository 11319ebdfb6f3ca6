"""``keelgate audit RUN``, the run's hash-chained trail as its store holds it (``--verify`` checks
every link; ``--key`` also the heads the operator signed), and ``keelgate audit export`` and
``keelgate audit verify``: the chain as a signed file, and its check with nothing but that file
and a public key.

Why the last two exist: ``keelgate audit --verify`` trusts the store the chain lives in. An
auditor gets the chain as an in-toto Statement in a DSSE envelope (``keelgate.core.attestation``,
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
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from keelgate.cli.commands import (
    NamespaceOption,
    OutputFormat,
    OutputOption,
    StoreOption,
    _opened,
    complete_run,
)
from keelgate.cli.commands import app as main_app
from keelgate.cli.help import App
from keelgate.cli.render import Console, Trail
from keelgate.core.attestation import check_statement, spec_digest, statement
from keelgate.core.audit import AuditEvent, ChainReport, utc_now
from keelgate.errors import InputError
from keelgate.stores import DEFAULT_URL


def _complete_audit_run(ctx: typer.Context, incomplete: str) -> list[str]:
    commands = [word for word in ("export", "verify") if word.startswith(incomplete)]
    return commands + complete_run(ctx, incomplete)


AuditRunArgument = Annotated[
    str,
    typer.Argument(
        help="The run's name (`export` and `verify` are commands: see below).",
        autocompletion=_complete_audit_run,
        show_default=False,
    ),
]


class SignedHeads:
    """``audit --verify --key``: the chain's hashes and the operator's signed heads, seen as the
    chain is read once, then each head checked (its signature under the key, and that the chain
    still leads to it)."""

    def __init__(self, key_file: str) -> None:
        from keelgate.adapters.signing import load_public_key, read_key_file

        self._key = load_public_key(read_key_file(key_file, "--key"))
        self._hashes: dict[int, str] = {}
        self._heads: list[AuditEvent] = []

    #: What a chain with no signed head is (not a broken link): heads are signed only by an
    #: operator started with --audit-sign-key, as a run stops; a run driven from the command
    #: line has none, and a chain that should have some may have had them removed.
    unsigned = (
        "no signed head on the chain, so --key has nothing to check: heads are signed only by "
        "an operator started with --audit-sign-key, when a run stops (a run driven by "
        "`keelgate run` has none), or they were removed"
    )

    def watching(self, each: Callable[[AuditEvent], None]) -> Callable[[AuditEvent], None]:
        from keelgate.core.attestation import HEAD_EVENT

        def seen(event: AuditEvent) -> None:
            self._hashes[event.seq] = event.hash
            if event.type == HEAD_EVENT:
                self._heads.append(event)
            each(event)

        return seen

    def report(self, tenant: str, run: str, chain: ChainReport) -> ChainReport:
        from keelgate.adapters.signing import EnvelopeError, open_envelope
        from keelgate.core.attestation import check_signed_head

        problems = list(chain.problems)
        if not self._heads:
            problems.append(self.unsigned)
        for event in self._heads:
            envelope = event.data.get("envelope")
            try:
                opened = open_envelope(json.dumps(envelope).encode(), self._key)
                signed = json.loads(opened.payload)
            except (EnvelopeError, ValueError) as error:
                problems.append(f"event {event.seq} (signed head): {error}")
                continue
            problems.extend(check_signed_head(tenant, run, signed, self._hashes))
        return ChainReport(not problems, chain.events, tuple(problems))


@main_app.command("audit")
def audit_command(
    run: AuditRunArgument,
    check: Annotated[
        bool, typer.Option("--verify", help="Check every link; exit 1 if the chain is broken.")
    ] = False,
    namespace: NamespaceOption = None,
    store: StoreOption = DEFAULT_URL,
    output: OutputOption = OutputFormat.text,
    key: Annotated[
        str,
        typer.Option(
            "--key",
            help="With --verify: a PEM public key; check the chain against the heads the "
            "operator signed with its private key (docs/audit.md).",
        ),
    ] = "",
) -> int:
    """Show the run's hash-chained audit trail. `keelgate audit export RUN --sign-key KEY`
    writes it as a signed file; `keelgate audit verify FILE --key PUB` checks one offline."""
    # The chain is read once, a page at a time, and each event is kept only as what is shown
    # of it, so a run of any length is shown (and verified) in time linear in its events.
    json_out = output is OutputFormat.json
    documents: list[dict[str, Any]] = []
    trail = Trail()
    keep: Callable[[AuditEvent], None] = (
        (lambda event: documents.append(event.to_json())) if json_out else trail.add
    )
    report = None
    if key and not check:
        raise InputError("--key", "checks signed heads: give it with --verify")
    heads = SignedHeads(key) if key else None
    with _opened(store, run, namespace, read_only=True) as (loop, tenant, run):
        if check:
            each = keep if heads is None else heads.watching(keep)
            report = loop.verify_audit(tenant, run, each=each)
            if heads is not None:
                report = heads.report(tenant, run, report)
        else:
            for event in loop.stores.audit.iter_events(tenant, run):
                keep(event)
    console = Console()
    if json_out:
        console.json(
            {
                "run": run,
                "events": documents,
                **({"verified": report.ok, "problems": list(report.problems)} if report else {}),
            }
        )
    else:
        console.audit(run, trail, report, unsigned=SignedHeads.unsigned)
    return 1 if report is not None and not report.ok else 0


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
