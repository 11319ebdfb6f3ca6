"""``kubectl keelgate audit export`` and ``kubectl keelgate audit verify``: the signed audit export
of ``keelgate audit export|verify`` (``keelgate.cli.audit_tools``), from a cluster user's seat.

Why it exists: in a cluster the signing key is kept in a Secret, so export may take it from one
(``--sign-key-secret NAME``, in the run's namespace, read as the kubeconfig's user: RBAC decides
who may sign) instead of a file. The chain itself is read from the operator's store, as
``kubectl keelgate audit`` reads it. This module must never print, log or write the key: it is
read, used to sign, and dropped.
"""

from __future__ import annotations

import base64
from typing import Annotated

import typer

from keelgate.cli import audit_tools
from keelgate.cli.commands import OutputFormat, OutputOption
from keelgate.cli.help import App
from keelgate.cli.plugin.client import SecretReader
from keelgate.cli.plugin.commands import (
    ContextOption,
    KubeconfigOption,
    NamespaceOption,
    StoreOption,
)
from keelgate.cli.plugin.target import namespace_only, resolve
from keelgate.errors import InputError

app = App(
    name="audit",
    help="A run's audit chain as a signed file (export), and its offline check (verify).",
)


class SigningKeySecret(SecretReader):
    """The one Secret holding a signing key; its data is never shown."""

    def key(self, name: str, item: str) -> bytes:
        secret = self.read(name)
        if secret is None:
            raise InputError("--sign-key-secret", f"no Secret {name} in {self.namespace}")
        data = (secret.data or {}).get(item)
        if not data:
            raise InputError("--sign-key-secret", f"the Secret {name} has no key {item!r}")
        return base64.b64decode(data)


@app.command("export")
def export_command(
    run: Annotated[str, typer.Argument(help="The run's name (its AgentRun may be deleted).")],
    sign_key: Annotated[
        str | None,
        typer.Option("--sign-key", help="A PEM private key file (Ed25519 or ECDSA P-256)."),
    ] = None,
    sign_key_secret: Annotated[
        str | None,
        typer.Option(
            "--sign-key-secret",
            help="A Secret in the run's namespace holding the PEM private key instead.",
        ),
    ] = None,
    secret_key: Annotated[
        str, typer.Option("--secret-key", help="The Secret's key holding the PEM.")
    ] = "key.pem",
    out: audit_tools.OutputFileOption = "-",
    store: StoreOption = None,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    namespace: NamespaceOption = None,
    output: audit_tools.ExportOutputOption = "text",
) -> int:
    """Write the run's chain as an in-toto Statement in a DSSE envelope, signed with the key
    of --sign-key or --sign-key-secret; the chain comes from the operator's store (--store)."""
    shown = audit_tools.export_format(output)
    if (sign_key is None) == (sign_key_secret is None):
        raise InputError("--sign-key", "give --sign-key FILE or --sign-key-secret NAME (one)")
    if not store:
        raise InputError(
            "--store",
            "the audit trail is kept in the operator's store, not in the cluster: give "
            "--store postgresql://... or KEELGATE_STORE",
        )
    if sign_key is not None:
        from keelgate.adapters.signing import read_key_file

        pem = read_key_file(sign_key, "--sign-key")
        tenant = namespace_only(kubeconfig, context, namespace)
    else:
        assert sign_key_secret is not None
        target = resolve(kubeconfig, context, namespace)
        pem = SigningKeySecret(target).key(sign_key_secret, secret_key)
        tenant = target.namespace
    return audit_tools.export_run(run, pem, out, tenant, store, output=shown)


@app.command("verify")
def verify_command(
    file: Annotated[str, typer.Argument(help="The envelope `audit export` wrote ('-': stdin).")],
    key: Annotated[str, typer.Option("--key", help="The PEM public key it must be signed with.")],
    output: OutputOption = OutputFormat.text,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    namespace: NamespaceOption = None,
) -> int:
    """Check an exported chain offline: the signature, every event's hash and link, and that
    the chain is whole from the run's start to its head. Neither the cluster nor the store is
    asked (kubectl's flags are accepted and unused)."""
    return audit_tools.verify_command(file, key, output)
