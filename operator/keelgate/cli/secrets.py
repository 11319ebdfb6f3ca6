"""The one Secret ``keelgate tenant`` writes in a tenant's namespace: the store URL (key ``url``)
its step pods read, as the kubeconfig's user, through the official client.

Why it exists apart from the plugin's client: ``kubectl keelgate`` reads no Secret (but the signing
key ``audit export --sign-key-secret`` names), and this does (to keep a password that still works,
and to delete only a Secret it wrote). It must never show a Secret's data: it is decoded only to be
compared, never printed or put in a message.
"""

from __future__ import annotations

import base64
import contextlib

from kubernetes import client

from keelgate.cli.plugin.client import FIELD_MANAGER, NotFound, SecretReader
from keelgate.errors import InputError

#: Marks a Secret ``keelgate tenant add`` wrote, and the role its URL logs in as.
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "keelgate-tenant"
ROLE_ANNOTATION = "keelgate.dev/store-role"


class StoreSecrets(SecretReader):
    """The one Secret ``keelgate tenant`` writes in a namespace (the plugin itself never reads
    Secrets); its data is never shown."""

    def write(self, name: str, url: str, role: str, *, exists: bool, dry_run: bool = False) -> None:
        """Create the Secret or patch its ``url`` (and the marks). ``dry_run``: only ask the API
        server whether it would (the namespace exists, the user may), changing nothing; a
        namespace that does not exist is refused naming NAMESPACE."""
        try:
            self._write(name, url, role, exists=exists, dry_run=dry_run)
        except NotFound:
            raise InputError(
                "NAMESPACE",
                f"no namespace {self.namespace} in the cluster ({self.target.where}); create "
                "it first",
            ) from None

    def _write(self, name: str, url: str, role: str, *, exists: bool, dry_run: bool) -> None:
        metadata = {
            "name": name,
            "labels": {MANAGED_BY: MANAGER},
            "annotations": {ROLE_ANNOTATION: role},
        }
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": "Opaque"}
        what = f"write secret {self.namespace}/{name}"
        dry = {"dry_run": "All"} if dry_run else {}
        if exists:
            # A merge patch: the url key and the marks change; other keys are left alone.
            self._call(
                what,
                self.core.patch_namespaced_secret,
                name,
                self.namespace,
                {"metadata": metadata, "stringData": {"url": url}},
                field_manager=FIELD_MANAGER,
                writes=True,
                **dry,
            )
        else:
            self._call(
                what,
                self.core.create_namespaced_secret,
                self.namespace,
                {**body, "stringData": {"url": url}},
                field_manager=FIELD_MANAGER,
                writes=True,
                **dry,
            )

    def delete(self, name: str) -> None:
        with contextlib.suppress(NotFound):  # gone already: what was asked
            self._call(
                f"delete secret {self.namespace}/{name}",
                self.core.delete_namespaced_secret,
                name,
                self.namespace,
                writes=True,
            )

    @staticmethod
    def url_of(secret: client.V1Secret | None) -> str:
        """The Secret's ``url``, decoded ("" if it has none)."""
        data = (secret.data or {}) if secret is not None else {}
        raw = data.get("url")
        if not raw:
            return ""
        try:
            return base64.b64decode(raw).decode()
        except (ValueError, UnicodeDecodeError):
            return ""

    @staticmethod
    def ours(secret: client.V1Secret | None, role: str) -> bool:
        """Whether ``keelgate tenant add`` wrote the Secret, for ``role``."""
        meta = secret.metadata if secret is not None else None
        labels = (meta.labels or {}) if meta is not None else {}
        annotations = (meta.annotations or {}) if meta is not None else {}
        return labels.get(MANAGED_BY) == MANAGER and annotations.get(ROLE_ANNOTATION) == role
