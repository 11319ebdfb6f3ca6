"""Certificates and kubeconfigs for the local control plane.

Why it exists: kube-apiserver needs a serving certificate, a client CA for certificate users
(`admin` in system:masters, plain `alice` and `bob`, the controller-manager, the scheduler, the
node agent as `system:node:<name>`, and the apiserver's own client for the kubelet port), and a
service-account signing key. This module makes a throwaway CA and all of them, and writes
kubeconfig files that embed them.

It must never be used for anything but the loopback test cluster: keys are unencrypted on disk
and certificates name only 127.0.0.1 and cluster-internal names.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as files on disk."""

    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.write_bytes(pem)
    path.chmod(0o600)


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


class CertificateAuthority:
    """A self-signed CA that issues the cluster's server and client certificates."""

    def __init__(self, directory: Path, name: str = "keelgate-e2e-ca", stem: str = "ca") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._key = _key()
        now = dt.datetime.now(dt.UTC)
        subject = _name(name)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        self.pair = Pair(directory / f"{stem}.crt", directory / f"{stem}.key")
        self.pair.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self._key, self.pair.key)

    @property
    def cert_pem(self) -> bytes:
        """The CA certificate, PEM encoded."""
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        stem: str,
        cn: str,
        orgs: tuple[str, ...] = (),
        *,
        server: bool = False,
        client: bool = False,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
    ) -> Pair:
        """Issue a certificate for `cn` (groups `orgs`) and write `<stem>.crt` and `<stem>.key`."""
        key = _key()
        now = dt.datetime.now(dt.UTC)
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, orgs))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        alt: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        alt += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if alt:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = Pair(self.directory / f"{stem}.crt", self.directory / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pair.key)
        return pair


def write_service_account_keys(directory: Path) -> tuple[Path, Path]:
    """Write the service-account token signing key pair; return (private, public) paths."""
    key = _key()
    private = directory / "sa.key"
    public = directory / "sa.pub"
    _write_key(key, private)
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


def kubeconfig(
    path: Path,
    server: str,
    ca: Path,
    users: dict[str, Pair],
    current: str,
) -> None:
    """Write a kubeconfig with one context per user (named after it), embedding all PEM data."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "keelgate-e2e",
                "cluster": {"server": server, "certificate-authority-data": b64(ca)},
            }
        ],
        "users": [
            {
                "name": name,
                "user": {
                    "client-certificate-data": b64(pair.cert),
                    "client-key-data": b64(pair.key),
                },
            }
            for name, pair in users.items()
        ],
        "contexts": [
            {
                "name": name,
                "context": {"cluster": "keelgate-e2e", "user": name, "namespace": "default"},
            }
            for name in users
        ],
        "current-context": current,
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(path)
