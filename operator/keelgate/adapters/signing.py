"""DSSE envelopes signed and verified with Ed25519 or ECDSA P-256 keys (``cryptography``).

Why it exists: an exported audit chain (``keelgate.core.attestation``) must be checkable by an
auditor with nothing but the file and a public key, with the tools the supply-chain world already
has: the envelope is DSSE v1 (payload, payloadType, signatures of keyid and sig, each signature
over the pre-authentication encoding), as in-toto, sigstore and securesystemslib read it. An
Ed25519 signature is the raw 64 bytes; an ECDSA P-256 one is DER over SHA-256, as those tools
make them. A key's id is the sha256 of its public key (SubjectPublicKeyInfo, DER). This module
must never write or print a private key, and never accept an envelope none of whose signatures
verifies under the given key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from keelgate.core.attestation import PAYLOAD_TYPE, pae
from keelgate.errors import InputError

PrivateKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey
PublicKey = ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey


def _supported(key: Any, field: str) -> None:
    if isinstance(key, ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey):
        return
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) and isinstance(
        key.curve, ec.SECP256R1
    ):
        return
    raise InputError(field, "the key must be Ed25519 or ECDSA P-256 (PEM)")


def load_private_key(pem: bytes, *, field: str = "--sign-key") -> PrivateKey:
    """A PEM private key (PKCS#8 or the traditional EC form), unencrypted."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except TypeError:
        raise InputError(field, "the key is encrypted; give an unencrypted PEM key") from None
    except ValueError:
        raise InputError(field, "not a PEM private key") from None
    _supported(key, field)
    assert isinstance(key, ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey)
    return key


def load_public_key(pem: bytes, *, field: str = "--key") -> PublicKey:
    """A PEM public key; a private key is accepted too (its public half is used)."""
    try:
        key: Any = serialization.load_pem_public_key(pem)
    except ValueError:
        try:
            key = serialization.load_pem_private_key(pem, password=None).public_key()
        except (TypeError, ValueError):
            raise InputError(field, "not a PEM public key") from None
    _supported(key, field)
    assert isinstance(key, ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey)
    return key


def read_key_file(path: str, field: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(field, f"{path}: no such file") from None
    except OSError as error:
        raise InputError(field, f"{path}: {error.strerror or error}") from None


def key_id(key: PublicKey) -> str:
    """The sha256 of the public key's SubjectPublicKeyInfo (DER), hex."""
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


def sign_envelope(
    payload: bytes, key: PrivateKey, *, payload_type: str = PAYLOAD_TYPE
) -> dict[str, Any]:
    """A DSSE envelope of ``payload`` with one signature by ``key``."""
    message = pae(payload_type, payload)
    if isinstance(key, ed25519.Ed25519PrivateKey):
        signature = key.sign(message)
    else:
        signature = key.sign(message, ec.ECDSA(hashes.SHA256()))
    return {
        "payload": base64.b64encode(payload).decode(),
        "payloadType": payload_type,
        "signatures": [
            {"keyid": key_id(key.public_key()), "sig": base64.b64encode(signature).decode()}
        ],
    }


@dataclass(frozen=True)
class Opened:
    """An envelope whose signature verified: its payload, decoded, and the key id that signed."""

    payload: bytes
    payload_type: str
    keyid: str


class EnvelopeError(Exception):
    """The envelope is not one this key signed, or not an envelope at all (one line, why)."""


def open_envelope(text: bytes, key: PublicKey) -> Opened:
    """The payload of a DSSE envelope, once one of its signatures verifies under ``key``."""
    try:
        envelope = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise EnvelopeError("the file is not JSON (a DSSE envelope)") from None
    if not isinstance(envelope, dict) or not {"payload", "payloadType", "signatures"} <= set(
        envelope
    ):
        raise EnvelopeError("the file is not a DSSE envelope (payload, payloadType, signatures)")
    try:
        payload = base64.b64decode(str(envelope["payload"]), validate=True)
    except (binascii.Error, ValueError):
        raise EnvelopeError("the envelope's payload is not base64") from None
    payload_type = str(envelope["payloadType"])
    message = pae(payload_type, payload)
    signatures = envelope["signatures"] if isinstance(envelope["signatures"], list) else []
    for entry in signatures:
        try:
            signature = base64.b64decode(str(entry.get("sig", "")), validate=True)
        except (binascii.Error, ValueError, AttributeError):
            continue
        try:
            if isinstance(key, ed25519.Ed25519PublicKey):
                key.verify(signature, message)
            else:
                key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            continue
        return Opened(payload, payload_type, key_id(key))
    if not signatures:
        raise EnvelopeError("the envelope has no signature")
    raise EnvelopeError(
        f"no signature verifies under the key given (key id {key_id(key)[:16]}): the file was "
        "changed after it was signed, or signed with another key"
    )
