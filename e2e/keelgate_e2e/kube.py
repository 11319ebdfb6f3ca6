"""A small typed client for the Kubernetes REST API, on httpx, with client-certificate auth.

Why it exists: the node agent, the start-up code and the e2e tests need a handful of calls (get,
list, watch, create, patch, delete, pods/status) against the real API server, authenticated the
way a kubelet or a user is (client certificates from a kubeconfig). httpx is typed and well kept;
objects stay plain JSON dicts, exactly what the API sends.

It must never disable TLS verification of the API server, and never talk to anything but the
server named in its kubeconfig.
"""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import httpx
import yaml

JSON = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


class ApiError(RuntimeError):
    """The API server answered with an error status."""

    def __init__(self, status: int, body: str, method: str, path: str) -> None:
        self.status = status
        self.body = body
        try:
            parsed = json.loads(body)
            self.reason: str = str(parsed.get("reason", ""))
            message = str(parsed.get("message", body))
        except ValueError:
            self.reason = ""
            message = body
        super().__init__(f"{method} {path}: {status} {self.reason}: {message}")


def _ssl_context(ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    # load_cert_chain only reads files: write them to a private temporary directory briefly.
    with tempfile.TemporaryDirectory(prefix="keelgate-e2e-") as tmp:
        cert = Path(tmp) / "c.pem"
        key = Path(tmp) / "k.pem"
        cert.write_bytes(cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(key_pem)
        ctx.load_cert_chain(cert, key)
    return ctx


def _pem(entry: Mapping[str, Any], field: str, base: Path) -> bytes:
    if f"{field}-data" in entry:
        return base64.b64decode(entry[f"{field}-data"])
    if field in entry:
        path = Path(entry[field])
        return (path if path.is_absolute() else base / path).read_bytes()
    raise ValueError(f"kubeconfig entry has no {field}")


class Kube:
    """Client for one API server as one user."""

    def __init__(self, server: str, ctx: ssl.SSLContext, timeout: float = 30.0) -> None:
        self.server = server.rstrip("/")
        self._http = httpx.Client(
            base_url=self.server, verify=ctx, timeout=timeout, trust_env=False
        )
        self._watch_http = httpx.Client(
            base_url=self.server,
            verify=ctx,
            timeout=httpx.Timeout(timeout, read=None),
            trust_env=False,
        )

    @classmethod
    def from_kubeconfig(cls, path: Path, context: str | None = None) -> Kube:
        """Build a client from a kubeconfig (client-certificate users only)."""
        doc = yaml.safe_load(path.read_text())
        name = context or doc["current-context"]
        ctx_entry = next(c["context"] for c in doc["contexts"] if c["name"] == name)
        cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx_entry["cluster"])
        user = next(u["user"] for u in doc["users"] if u["name"] == ctx_entry["user"])
        base = path.parent
        ssl_ctx = _ssl_context(
            _pem(cluster, "certificate-authority", base),
            _pem(user, "client-certificate", base),
            _pem(user, "client-key", base),
        )
        return cls(cluster["server"], ssl_ctx)

    def close(self) -> None:
        """Close the connection pools."""
        self._http.close()
        self._watch_http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: JSON | None = None,
        params: Mapping[str, str | int] | None = None,
        content_type: str = "application/json",
    ) -> JSON:
        """Send one request; return the decoded JSON body; raise ApiError on an error status."""
        content = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if content is not None:
            headers["Content-Type"] = content_type
        resp = self._http.request(method, path, content=content, params=params, headers=headers)
        if resp.status_code >= 400:
            raise ApiError(resp.status_code, resp.text, method, path)
        if not resp.content:
            return {}
        return cast(JSON, resp.json())

    def text(self, path: str, params: Mapping[str, str | int] | None = None) -> str:
        """GET a non-JSON resource (e.g. pods/log)."""
        resp = self._http.get(path, params=params)
        if resp.status_code >= 400:
            raise ApiError(resp.status_code, resp.text, "GET", path)
        return resp.text

    def get(self, path: str, params: Mapping[str, str | int] | None = None) -> JSON:
        """GET `path`."""
        return self.request("GET", path, params=params)

    def create(self, path: str, body: JSON) -> JSON:
        """POST `body` to the collection at `path`."""
        return self.request("POST", path, body=body)

    def replace(self, path: str, body: JSON) -> JSON:
        """PUT `body` at `path` (optimistic concurrency through metadata.resourceVersion)."""
        return self.request("PUT", path, body=body)

    def patch(self, path: str, body: JSON, content_type: str = MERGE_PATCH) -> JSON:
        """PATCH `path` with a merge patch (or another patch type)."""
        return self.request("PATCH", path, body=body, content_type=content_type)

    def delete(self, path: str, body: JSON | None = None) -> JSON:
        """DELETE `path`, with DeleteOptions `body` if given."""
        return self.request("DELETE", path, body=body)

    def exists(self, path: str) -> bool:
        """True if GET `path` succeeds, False on 404."""
        try:
            self.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def watch(
        self, path: str, params: Mapping[str, str | int], timeout_seconds: int = 240
    ) -> Iterator[JSON]:
        """Stream watch events ({"type", "object"}) for the collection at `path`."""
        query: dict[str, str | int] = dict(params)
        query.update({"watch": "1", "timeoutSeconds": timeout_seconds})
        query.setdefault("allowWatchBookmarks", "true")
        with self._watch_http.stream(
            "GET", path, params=query, headers={"Accept": "application/json"}
        ) as resp:
            if resp.status_code >= 400:
                resp.read()
                raise ApiError(resp.status_code, resp.text, "WATCH", path)
            for line in resp.iter_lines():
                if line:
                    yield cast(JSON, json.loads(line))
