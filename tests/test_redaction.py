"""The one redactor (``keelgate.core.redaction``): the secrets it must hide and the look-alikes
it must leave, wherever Keelgate shows text: the decision inbox, the audit trail, log lines.

The table holds common secret shapes as they arrive in a tool's arguments (under any key, in a
header list, in free text) and what people and systems write that only looks like one.
"""

from __future__ import annotations

import json
import random
import shutil
import string
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from keelgate.cli import main
from keelgate.cli.plugin.ui import pages
from keelgate.cli.plugin.ui.views import Waiting, _plan_args
from keelgate.core.redaction import REDACTED, redact_text, redact_value, secret_name

ROOT = Path(__file__).resolve().parents[1]

# Made-up credentials of the real shapes (none is live).
AWS_KEY_ID = "AKIAZ7QW3EXAMPLE0K5R"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
GOOGLE_KEY = "AIzaSyD3-x9QeXAMPLEc0ffee_9A8b7C6d5E4f3"
GITHUB_CLASSIC = "ghp_R2d2C3poXAMPLE0123456789abcdefABCDEF"
GITHUB_FINE = "github_pat_11ABCDEFG0aBcDeFgHiJkL_mNoPqRsTuVwXyZ0123456789aBcDeFgHiJkLmNoPqRsTuVw"
SLACK = "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
SLACK_HOOK_PATH = "T0ABCDEF1/B0ABCDEF2/AbCdEfGhIjKlMnOpQrStUvWx"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJhbGljZSIsImV4cCI6MTkwMDAwMDAwMH0."
    "Yx2p9bEXAMPLEsig-_0123456789abcdef"
)
PEM_BODY = "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0"
PEM = f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----\n"
BASIC = "dXNlcjpTM2NyM3RQYXNz"  # user:S3cr3tPass
BEARER = "mF_9.B5f-4.1JqM"
CARD = "4242 4242 4242 4242"  # Luhn-valid, a card's first digit
CVV = "737"
PIN = "4921"
OPENAI = "sk-proj-AbCdEf0123456789GhIjKl"
# A token of sixteen lowercase letters, as some services issue (drawn once, seed fixed).
LOWER_TOKEN = "".join(random.Random(52).choices(string.ascii_lowercase, k=16))

# name -> (arguments as a tool gets them, the secret parts that must not be shown)
SECRETS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "AWS access key id under a plain key": ({"key": AWS_KEY_ID}, (AWS_KEY_ID,)),
    "AWS secret key under a plain key": ({"value": AWS_SECRET}, (AWS_SECRET,)),
    "AWS keys in text": (
        {"note": f"aws configure set {AWS_KEY_ID} {AWS_SECRET}"},
        (AWS_KEY_ID, AWS_SECRET),
    ),
    "Google API key": ({"q": f"https://maps.example/api?k={GOOGLE_KEY}"}, (GOOGLE_KEY,)),
    "GitHub classic token": ({"repo_hint": f"clone with {GITHUB_CLASSIC}"}, (GITHUB_CLASSIC,)),
    "GitHub fine-grained token": ({"with": GITHUB_FINE}, (GITHUB_FINE,)),
    "Slack token": ({"bot": SLACK}, (SLACK,)),
    "Slack webhook": (
        {"hook": f"https://hooks.slack.com/services/{SLACK_HOOK_PATH}"},
        (SLACK_HOOK_PATH,),
    ),
    "JWT": ({"id": JWT}, (JWT, JWT.split(".")[1])),
    "PEM private key": ({"material": PEM}, (PEM_BODY,)),
    "Basic header in a header list": (
        {"headers": [f"Authorization: Basic {BASIC}", "Accept: application/json"]},
        (BASIC,),
    ),
    "lowercase bearer": ({"headers": [f"authorization: bearer {BEARER}"]}, (BEARER,)),
    "bearer alone, any case": ({"note": f"send BeArEr {BEARER} with it"}, (BEARER,)),
    "bearer and sixteen lowercase letters": (
        {"note": f"curl -H 'bearer {LOWER_TOKEN}' ..."},
        (LOWER_TOKEN,),
    ),
    "basic and sixteen lowercase letters": ({"note": f"basic {LOWER_TOKEN}"}, (LOWER_TOKEN,)),
    "Authorization header under its name": ({"Authorization": f"Bearer {BEARER}"}, (BEARER,)),
    "Authorization in a header map under another key": (
        {"h": {"proxy-authorization": f"Basic {BASIC}"}},
        (BASIC,),
    ),
    "URL password": ({"callback": "https://bob:hunter2@example.com/hook"}, ("hunter2",)),
    "card number with its CVV": ({"card": CARD, "cvv": CVV}, (CARD, CARD.replace(" ", ""), CVV)),
    "card number as a number": ({"pan": int(CARD.replace(" ", ""))}, (CARD.replace(" ", ""),)),
    "card and CVV in text": (
        {"note": f"pay with {CARD.replace(' ', '-')} cvv {CVV}"},
        (CARD.replace(" ", "-"), CVV),
    ),
    "PIN under a pin-ish key": ({"pin": PIN, "cardPin": int(PIN), "pin_code": PIN}, (PIN,)),
    "PIN in text": ({"note": f"PIN {PIN}"}, (PIN,)),
    "secret-named keys": (
        {
            "password": "correct-horse",
            "api_key": "abc123",
            "X-Api-Key": "k-9",
            "clientSecret": "cs-1",
            "session_id": "s-77",
            "privateKey": {"d": "x-1"},
        },
        ("correct-horse", "abc123", "k-9", "cs-1", "s-77", "x-1"),
    ),
    "secret-named assignment in text": (
        {"query": "user=bob&password=correct-horse&lang=en"},
        ("correct-horse",),
    ),
    "provider key": ({"note": f"use {OPENAI} please"}, (OPENAI,)),
}

LOOK_ALIKES: dict[str, Any] = {
    "order id": "ORD-2026-000123",
    "numeric order id": "order 20261205000123",
    "SKU": "SKU-AB12-XL",
    "lowercase SKU": "sk-blue-widget-2026",
    "UUID": "3f2b8c1e-9a4d-4c7b-8e2f-1a2b3c4d5e6f",
    "ISO date": "2026-12-05",
    "ISO time": "2026-12-05T08:00:00.000Z",
    "short number": 1234,
    "quantity": 2,
    "a non-Luhn 16-digit number": "4242424242424241",
    "a non-Luhn 16-digit integer": 4242424242424241,
    "an epoch in milliseconds": 1764921600000,
    "phone number": "+49 151 23456789",
    "bearer in prose": "the bearer of this note may collect the parcel",
    "Bearer tokens in prose": "Bearer tokens expire after an hour",
    "basic in prose": "Basic plan, basic support",
    "long words after bearer and basic": (
        "basic responsibilities, basic telecommunications, bearer certificates, Basic "
        "Authentication, basic compatibility, basic troubleshooting, basic bookkeeping, basic "
        "internationalization, bearer transferability, basic understanding"
    ),
    "an audit hash": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "an idempotency key": "kg-7c1e2b9f0a4d",
    "a path": "/var/lib/keelgate/runs/Shop2026/restock/",
    "an email": "mailto:bob@example.com",
    "a token count": {"max_tokens": 400, "token_count": 12},
    "an author": {"author": "Ann Author", "passenger": "Pat"},
    "a reference to a secret": {"apiKeySecretRef": {"name": "openai", "key": "api-key"}},
    "a URL without a password": "https://example.com/orders/123?sku=A1",
    "a header list without credentials": ["Accept: application/json", "X-Trace: t-1"],
    "a store URL without a password": "postgresql://keelgate@db:5432/k",
}


def _shown(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


@pytest.mark.parametrize("case", list(SECRETS), ids=list(SECRETS))
def test_a_secret_in_a_tools_arguments_is_never_shown(case: str) -> None:
    """Each secret shape, where a tool's arguments carry it, is replaced, and what stands
    beside it is still shown."""
    args, secrets = SECRETS[case]
    shown = _shown(redact_value({**args, "sku": "A1"}))
    for secret in secrets:
        assert secret not in shown, (case, shown)
    assert shown != _shown({**args, "sku": "A1"}) and '"sku": "A1"' in shown


@pytest.mark.parametrize("case", list(SECRETS), ids=list(SECRETS))
def test_a_secret_in_a_line_of_text_is_never_shown(case: str) -> None:
    """The same secrets in a log or error line (the arguments as Python would print them, and
    as JSON) are replaced too: one redactor for structured values and for text."""
    args, secrets = SECRETS[case]
    for line in (f"calling tool with {args!r}", f"args={json.dumps(args)}"):
        shown = redact_text(line)
        for secret in secrets:
            assert secret not in shown, (case, shown)


@pytest.mark.parametrize("case", list(LOOK_ALIKES), ids=list(LOOK_ALIKES))
def test_a_look_alike_is_shown_as_it_is(case: str) -> None:
    """Order ids, SKUs, UUIDs, dates, short and non-Luhn numbers, hashes, paths and the word
    bearer in prose are not secrets: they are shown unchanged, as values and in text."""
    value = LOOK_ALIKES[case]
    assert redact_value({"value": value}) == {"value": value}
    assert redact_text(f"value={value!r}") == f"value={value!r}"


@pytest.mark.parametrize(("letters", "at_least"), [(12, 0.975), (16, 0.99), (24, 0.995)])
def test_random_lowercase_tokens_after_bearer_are_hidden(letters: int, at_least: float) -> None:
    """A token of lowercase letters only, after "bearer" or "basic", has no digit or capital to
    tell it from a word: from 12 letters on it is hidden unless it reads as English. Measured
    on 2000 random tokens of each length (a fixed seed): the share hidden is at least
    ``at_least`` (the rest read as English by chance; docs/observability.md says so)."""
    draw = random.Random(letters)
    tokens = ["".join(draw.choices(string.ascii_lowercase, k=letters)) for _ in range(2000)]
    hidden = sum(token not in redact_text(f"Bearer {token}") for token in tokens)
    assert hidden / len(tokens) >= at_least, hidden / len(tokens)


def test_redacting_twice_changes_nothing_more() -> None:
    """What the redactor returns is stable: a line redacted at the source and again where it
    is shown reads the same."""
    for args, _ in SECRETS.values():
        once = redact_text(repr(args))
        assert redact_text(once) == once
        assert redact_value(redact_value(args)) == redact_value(args)


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("password", True),
        ("X-Api-Key", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("pinCode", True),
        ("OAuthToken", True),
        ("set-cookie", True),
        ("author", False),
        ("spin", False),
        ("max_tokens", False),
        ("auth_url", False),
        ("idempotencyKey", False),
        ("apiKeySecretRef", False),
    ],
)
def test_a_key_name_says_secret_by_its_words(name: str, secret: bool) -> None:
    """A name is read word by word: password, token, api key, PIN ... say secret; author, spin,
    a token count, a URL or a reference to a Secret do not."""
    assert secret_name(name) is secret


def test_the_inbox_shows_none_of_the_secrets_in_a_plans_arguments() -> None:
    """The arguments the inbox shows come from the write-ahead plan through the redactor: the
    rendered page holds none of the secrets, and the rest of the arguments."""
    args: dict[str, Any] = {"sku": "A1", "qty": 2}
    for index, (case_args, _) in enumerate(SECRETS.values()):
        args[f"case{index}"] = case_args
    state = {"plan": {"iteration": 1, "actions": [{"id": "1:0", "tool": "pay", "args": args}]}}
    shown = _plan_args(state)[0]["1:0"]
    html = pages.inbox([_waiting(args=shown)], csrf="c", scope="s")
    for _, secrets in SECRETS.values():
        for secret in secrets:
            assert secret not in html and json.dumps(secret)[1:-1] not in html
    assert "&quot;sku&quot;: &quot;A1&quot;" in html


def test_a_secret_in_a_goal_is_not_kept_in_the_audit_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A goal is text a person wrote: one holding a token is recorded redacted in the chain
    (which still verifies), and `keelgate audit` shows no secret."""
    for name in ("agentrun.yaml", "shop.py"):
        shutil.copy(ROOT / "examples" / "restock" / name, tmp_path / name)
    manifest = (tmp_path / "agentrun.yaml").read_text()
    assert 'goal: "' in manifest
    manifest = manifest.replace('goal: "', f'goal: "Use {GITHUB_CLASSIC} and password=hunter2. ', 1)
    (tmp_path / "agentrun.yaml").write_text(manifest)
    url = f"sqlite:///{tmp_path / 'kg.db'}"
    monkeypatch.chdir(tmp_path)
    assert main(["run", "-f", "agentrun.yaml", "--store", url]) == 0
    capsys.readouterr()
    assert main(["audit", "restock", "--verify", "--store", url, "-o", "json"]) == 0
    out = capsys.readouterr().out
    document = json.loads(out)
    (started,) = [e for e in document["events"] if e["type"] == "loop.started"]
    assert GITHUB_CLASSIC not in out and "hunter2" not in out
    assert started["data"]["goal"].startswith(f"Use {REDACTED} and password={REDACTED}")
    assert document["verified"] is True


def test_every_log_line_goes_through_the_redactor() -> None:
    """A process that logs as Keelgate's do (the CLI, the step runner, the operator, the
    Temporal worker) writes no secret, in the message or in a traceback."""
    script = (
        "import logging\n"
        "from keelgate.core.redaction import log_to_stderr\n"
        "log_to_stderr(logging.INFO, '%(levelname)s %(name)s: %(message)s')\n"
        "log = logging.getLogger('keelgate.tools')\n"
        f"log.warning('tool said: %s', {f'Authorization: Bearer {BEARER}'!r})\n"
        "try:\n"
        f"    raise ValueError({f'bad key {AWS_KEY_ID} for {JWT}'!r})\n"
        "except ValueError:\n"
        "    log.exception('call failed')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    for secret in (BEARER, AWS_KEY_ID, JWT):
        assert secret not in done.stderr
    assert "WARNING keelgate.tools: tool said: Authorization: [redacted]" in done.stderr
    assert f"ValueError: bad key {REDACTED} for {REDACTED}" in done.stderr


def test_keelgates_processes_set_up_logging_only_through_the_redactor() -> None:
    """No module configures logging itself: every process's log lines pass the redactor."""
    configured = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "operator" / "keelgate").rglob("*.py")
        if "logging.basicConfig(" in path.read_text() and path.name != "redaction.py"
    ]
    assert configured == []


def _waiting(**changes: object) -> Waiting:
    fields: dict[str, object] = {
        "kind": "Approval",
        "namespace": "shop",
        "name": "restock-1-pay",
        "run": "restock",
        "action": "1:0",
        "tool": "pay",
        "side_effect": "WRITE",
        "key": "kg-abc",
        "created": "2026-12-05T08:00:00Z",
        "waited": "3m",
        "not_executed_after": "",
        "said": "",
        "args": {},
        "args_unavailable": "",
        "may": True,
        "why_not": "",
    }
    fields.update(changes)
    return Waiting(**fields)  # type: ignore[arg-type]
