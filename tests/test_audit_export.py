"""Signed audit exports (`keelgate audit export`, `keelgate audit verify`), checked offline.

What a user (an auditor) would notice if these broke: a file that verifies although an event was
changed, dropped, reordered or cut off, or although another key signed it; a file that only our
own code can read (the envelope is also verified here by securesystemslib, an independent DSSE
implementation); a private key or a tool argument in the file or the output; an export that
signs a chain already broken in its store.
"""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from keelgate.adapters.signing import key_id, load_private_key, sign_envelope
from keelgate.cli import main

SECRET_ARG = "gate-code-4417"
Tamper = Callable[[list[dict[str, Any]]], None]


def _pem(key: Any) -> tuple[bytes, bytes]:
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


@pytest.fixture(params=["ed25519", "ecdsa-p256"])
def keys(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path]:
    key: Any = (
        ed25519.Ed25519PrivateKey.generate()
        if request.param == "ed25519"
        else ec.generate_private_key(ec.SECP256R1())
    )
    private, public = _pem(key)
    (tmp_path / "sign.pem").write_bytes(private)
    (tmp_path / "sign.pub").write_bytes(public)
    return tmp_path / "sign.pem", tmp_path / "sign.pub"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A run that ordered once (its argument a secret) and was approved by alice first."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    url = f"sqlite:///{tmp_path / 'keelgate.db'}"
    manifest = tmp_path / "run.yaml"
    manifest.write_text(
        json.dumps(
            {
                "apiVersion": "keelgate.dev/v1alpha1",
                "kind": "AgentRun",
                "metadata": {"name": "restock", "namespace": "shop"},
                "spec": {
                    "goal": "restock",
                    "model": {
                        "provider": "scripted",
                        "script": [
                            {"actions": [{"tool": "place_order", "args": {"code": SECRET_ARG}}]},
                            {"done": True, "answer": "ordered"},
                        ],
                    },
                    "tools": [
                        {
                            "name": "place_order",
                            "sideEffect": "WRITE",
                            "requiresApproval": True,
                            "python": {"callable": "support.operator_tools:place_order"},
                        }
                    ],
                },
            }
        )
    )
    assert main(["run", "-f", str(manifest), "--store", url]) == 3
    assert main(["approve", "restock", "1:0", "--approve", "--by", "alice", "--store", url]) == 0
    assert main(["resume", "restock", "--store", url]) == 0
    return url


def _export(store: str, sign: Path, out: Path) -> int:
    return main(
        [
            "audit",
            "export",
            "restock",
            "--sign-key",
            str(sign),
            "--output-file",
            str(out),
            "--store",
            store,
        ]
    )


def _verify(file: Path, pub: Path) -> int:
    return main(["audit", "verify", str(file), "--key", str(pub)])


def test_an_exported_chain_verifies_offline_and_holds_no_secret(
    store: str, keys: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Export writes a DSSE envelope of an in-toto Statement (Keelgate's predicate: the run,
    its tenant, its spec's digest, every event with its hash); verify, with only the file and
    the public key, says how many events verified and exits 0. Neither the file nor the output
    holds the private key or the tool's argument."""
    sign, pub = keys
    out = tmp_path / "restock.dsse.json"
    assert _export(store, sign, out) == 0
    envelope = json.loads(out.read_text())
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://keelgate.dev/audit-chain/v1"
    predicate = statement["predicate"]
    assert (predicate["tenant"], predicate["run"]) == ("shop", "restock")
    types = [e["type"] for e in predicate["events"]]
    assert types[0] == "loop.started" and "loop.approved" in types
    assert statement["subject"] == [
        {"name": "shop/restock", "digest": {"sha256": predicate["events"][-1]["hash"]}}
    ]
    assert len(predicate["spec"]["digest"]["sha256"]) == 64
    capsys.readouterr()
    assert _verify(out, pub) == 0
    said = capsys.readouterr()
    assert said.out.strip() == f"shop/restock: {len(types)} events, signature and chain verified"
    private = sign.read_text()
    for text in (out.read_text(), base64.b64decode(envelope["payload"]).decode(), said.out):
        assert SECRET_ARG not in text and private not in text


def test_securesystemslib_verifies_the_envelope_so_the_format_is_the_standard_one(
    store: str, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    """An independent DSSE implementation (securesystemslib, as in-toto uses it) accepts the
    envelope under the public key, and refuses it under another key."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError
    from securesystemslib.signer import SSlibKey

    sign, pub = keys
    out = tmp_path / "restock.dsse.json"
    assert _export(store, sign, out) == 0
    public = serialization.load_pem_public_key(pub.read_bytes())
    assert isinstance(public, ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey)
    envelope = Envelope.from_dict(json.loads(out.read_text()))
    verified = envelope.verify([SSlibKey.from_crypto(public, keyid=key_id(public))], 1)
    assert list(verified) == [key_id(public)]
    other = ed25519.Ed25519PrivateKey.generate().public_key()
    with pytest.raises(VerificationError):
        envelope.verify([SSlibKey.from_crypto(other, keyid=key_id(public))], 1)


def _resigned(out: Path, sign: Path, tamper: Tamper) -> None:
    """The file with its events changed by ``tamper`` and signed again with the same key (as a
    store's writer who also held the key would): only the chain's own checks can catch it."""
    envelope = json.loads(out.read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    tamper(statement["predicate"]["events"])
    payload = json.dumps(statement).encode()
    out.write_text(json.dumps(sign_envelope(payload, load_private_key(sign.read_bytes()))))


def _edit(events: list[dict[str, Any]]) -> None:
    events[1]["actor"] = "mallory"


def _drop(events: list[dict[str, Any]]) -> None:
    del events[2]


def _swap(events: list[dict[str, Any]]) -> None:
    events[2], events[3] = events[3], events[2]


def _truncate(events: list[dict[str, Any]]) -> None:
    del events[-1]


def _behead(events: list[dict[str, Any]]) -> None:
    del events[0]


@pytest.mark.parametrize(
    ("tamper", "words"),
    [
        (_edit, "event 2 (loop.plan_saved): its content does not match its hash"),
        (_drop, "expected event 3 here: events are missing or out of order"),
        (_swap, "expected event 3 here"),
        (_truncate, "events were removed from its end"),
        (_behead, "does not start with loop.started"),
    ],
    ids=["edit", "drop", "reorder", "truncate", "cut-the-start"],
)
def test_a_changed_chain_fails_naming_the_event_even_when_signed_again(
    store: str,
    keys: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tamper: Tamper,
    words: str,
) -> None:
    """Change an event, drop one, swap two, cut off the tail or the start, and sign the result
    again with the same key: verify exits 1 with one line per problem, naming the event."""
    sign, pub = keys
    out = tmp_path / "restock.dsse.json"
    assert _export(store, sign, out) == 0
    _resigned(out, sign, tamper)
    capsys.readouterr()
    assert _verify(out, pub) == 1
    err = capsys.readouterr().err
    assert words in err, err
    assert all(line.startswith(f"{out}: ") for line in err.splitlines())


def test_a_flipped_byte_or_another_key_fails_the_signature(
    store: str, keys: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One byte of the signed payload changed (without signing again), or the file checked
    against a key that did not sign it: verify exits 1 saying no signature verifies."""
    sign, pub = keys
    out = tmp_path / "restock.dsse.json"
    assert _export(store, sign, out) == 0
    envelope = json.loads(out.read_text())
    payload = bytearray(base64.b64decode(envelope["payload"]))
    payload[len(payload) // 2] ^= 0x01
    flipped = tmp_path / "flipped.json"
    flipped.write_text(json.dumps({**envelope, "payload": base64.b64encode(payload).decode()}))
    other = tmp_path / "other.pub"
    other.write_bytes(_pem(ed25519.Ed25519PrivateKey.generate())[1])
    for file, key in ((flipped, pub), (out, other)):
        capsys.readouterr()
        assert _verify(file, key) == 1
        err = capsys.readouterr().err
        assert "no signature verifies under the key given" in err, err


def test_export_refuses_to_sign_a_chain_broken_in_its_store(
    store: str, keys: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Someone rewrote an event in the store: export says which event breaks the chain, exits
    1, and writes no file (a signature would vouch for the rewrite)."""
    sign, _ = keys
    path = store.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE keelgate_audit SET actor = 'mallory' WHERE seq = 2")
    out = tmp_path / "restock.dsse.json"
    capsys.readouterr()
    assert _export(store, sign, out) == 1
    err = capsys.readouterr().err
    assert "not signed" in err and not out.exists()


@pytest.mark.parametrize(
    ("flag", "content", "words"),
    [
        ("--sign-key", None, "no such file"),
        ("--sign-key", b"not a key", "not a PEM private key"),
        ("--sign-key", "rsa", "must be Ed25519 or ECDSA P-256"),
        ("--key", b"junk", "not a PEM public key"),
    ],
)
def test_a_bad_key_is_one_line_naming_the_flag(
    store: str,
    keys: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flag: str,
    content: bytes | str | None,
    words: str,
) -> None:
    """A missing key file, a file that is no key, an RSA key: exit 2, one line naming the flag."""
    sign, _ = keys
    bad = tmp_path / "bad.pem"
    if content == "rsa":
        bad.write_bytes(_pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))[0])
    elif isinstance(content, bytes):
        bad.write_bytes(content)
    out = tmp_path / "out.json"
    capsys.readouterr()
    if flag == "--sign-key":
        code = _export(store, bad, out)
    else:
        assert _export(store, sign, out) == 0
        capsys.readouterr()
        code = _verify(out, bad)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert flag in err and words in err, err


def _rewrite_consistently(path: str, tenant: str, run: str, seq: int) -> None:
    """What someone who can write the store does: change event ``seq`` and recompute every hash
    from there on, so that the chain's own links hold again."""
    from keelgate.core.audit import AuditEvent, event_hash

    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT seq, type, actor, at, data, key, prev, hash FROM keelgate_audit "
            "WHERE tenant = ? AND run = ? ORDER BY seq",
            (tenant, run),
        ).fetchall()
        prev = None
        for number, type_, actor, at, data, key, old_prev, _ in rows:
            if number == seq:
                actor = "mallory"
            event = AuditEvent(
                number,
                type_,
                actor,
                at,
                json.loads(data),
                key,
                old_prev if prev is None else prev,
                "",
            )
            digest = event_hash(tenant, run, event)
            conn.execute(
                "UPDATE keelgate_audit SET actor = ?, prev = ?, hash = ? "
                "WHERE tenant = ? AND run = ? AND seq = ?",
                (actor, event.prev, digest, tenant, run, number),
            )
            prev = digest if number >= seq or prev is not None else None


def test_the_operator_signs_a_stopped_runs_head_and_a_consistent_rewrite_is_then_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An operator started with --audit-sign-key: when the run stops it puts its signature over
    the chain's head on the chain (an audit.head_signed event, once, by keelgate-operator).
    `keelgate audit RUN --verify --key PUB` then passes; after someone with the store rewrites
    an event and every hash after it (so plain --verify still passes), --verify --key fails
    naming the signed event; and --key without any signed head says so."""
    from keelgate.kube.controller.context import ControllerSettings
    from support.operator_rig import Operator, agentrun_spec

    key = ed25519.Ed25519PrivateKey.generate()
    private, public = _pem(key)
    pub = tmp_path / "operator.pub"
    pub.write_bytes(public)
    signer = load_private_key(private)
    settings = ControllerSettings(sign_head=lambda payload: sign_envelope(payload, signer))
    kube = Operator(tmp_path, settings=settings)
    try:
        kube.apply("restock", agentrun_spec())
        kube.drive("restock")
        assert kube.status("restock")["phase"] == "Succeeded"
        kube.reconcile("restock")  # at rest again: nothing more to sign
        events = kube.stores.audit.events("shop", "restock")
        signed = [e for e in events if e.type == "audit.head_signed"]
        assert len(signed) == 1 and signed[0].actor == "keelgate-operator"
        assert signed[0].data["seq"] == signed[0].seq - 1
        assert signed[0].data["hash"] == events[signed[0].seq - 2].hash
    finally:
        kube.close()
    store = kube.store_url
    audit = ["audit", "restock", "-n", "shop", "--verify", "--store", store]
    capsys.readouterr()
    assert main([*audit, "--key", str(pub)]) == 0
    _rewrite_consistently(store.removeprefix("sqlite:///"), "shop", "restock", 2)
    assert main(audit) == 0  # the links hold: the store alone cannot tell
    capsys.readouterr()
    assert main([*audit, "--key", str(pub)]) == 1
    out = capsys.readouterr().out
    assert "is not the one that was signed" in out and "rewritten" in out, out
    other = tmp_path / "other.pub"
    other.write_bytes(_pem(ed25519.Ed25519PrivateKey.generate())[1])
    assert main([*audit, "--key", str(other)]) == 1
    assert "no signature verifies" in capsys.readouterr().out


def test_verify_with_a_key_on_a_chain_nobody_signed_says_so(
    store: str, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """`--verify --key` on a run whose chain has no signed head (run without an operator
    signing, or its signed heads deleted): exit 1, saying what it is (its links intact, no head
    signed, who signs heads), never "chain BROKEN"; --key without --verify is refused naming
    --key."""
    _, pub = keys
    capsys.readouterr()
    assert main(["audit", "restock", "--verify", "--key", str(pub), "--store", store]) == 1
    out = capsys.readouterr().out
    assert "no signed head on the chain" in out and "--audit-sign-key" in out
    assert "every link intact" in out and "BROKEN" not in out
    assert main(["audit", "restock", "--key", str(pub), "--store", store]) == 2
    assert "--key" in capsys.readouterr().err
