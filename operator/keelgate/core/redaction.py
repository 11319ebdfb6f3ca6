"""The one redactor: what Keelgate shows or logs never carries a secret it can recognise.

Why it exists: a secret reaches Keelgate's output by many roads (a tool's arguments shown in the
decision inbox, a goal recorded in the audit chain, a driver's or a provider's error quoted in a
log line or an error line), and each road had its own short list of patterns, each missing what
the others caught. This module is the one list, on the lowest floor, so the inbox, the audit
chain and every log and error line use the same rules, and one table test holds them
(``tests/test_redaction.py``).

What it recognises, in any text: PEM private key blocks; ``Authorization``/``Cookie`` header
values and ``Basic``/``Bearer`` credentials in any case; a URL's password (``user:***@host``);
``NAME=VALUE`` and ``"NAME": VALUE`` where the name says secret; AWS access key ids and secret
keys; Google API keys; GitHub classic and fine-grained tokens; GitLab and npm tokens; Slack
tokens and webhooks; JWTs; provider keys (``sk-``, ``pk_``, ``rk_``, and their masked echoes);
card numbers (a card's first digits, 13 to 19 digits, Luhn-valid); a CVV or PIN written after
its word. In structured values (``redact_value``), every value under a key whose name says
secret (its words: password, token, secret, api key, auth, cookie, session, private key, PIN,
CVV ...; see ``secret_name``), whatever its type.

It is a table of patterns, not a library: the maintained scanners (detect-secrets and the like)
find secrets in source files line by line, have no card-number, Google-key or PIN rules, and
carry global settings; the shapes below are few, and each has a row in the test table, with the
look-alikes (order ids, SKUs, UUIDs, dates, hashes, short numbers, "bearer" in prose) that must
stay. It must never change a value that no rule names, never raise on any input, and never be
used on what must stay byte for byte (a stored audit event's data, which its hash covers).
"""

from __future__ import annotations

import itertools
import logging
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

REDACTED = "[redacted]"
#: A URL's password is shown as every store URL Keelgate prints shows it: ``user:***@host``.
URL_PASSWORD = "***"

# Secret-named keys. A name is split into words (camelCase, snake_case, kebab-case, dotted) so
# that "author", "passenger" or "tokenizer" are not read as auth, pass or token.
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_SECRET_WORDS = frozenset(
    {
        "apikey",
        "auth",
        "authorization",
        "bearer",
        "cookie",
        "cookies",
        "credential",
        "credentials",
        "creds",
        "csc",
        "cvc",
        "cvc2",
        "cvv",
        "cvv2",
        "jwt",
        "otp",
        "pass",
        "passcode",
        "passphrase",
        "passwd",
        "password",
        "pin",
        "pincode",
        "privatekey",
        "pwd",
        "secret",
        "secrets",
        "session",
        "sessionid",
        "token",
        "totp",
    }
)
_SECRET_PAIRS = frozenset(
    {
        ("access", "key"),
        ("account", "key"),
        ("api", "key"),
        ("card", "number"),
        ("connection", "string"),
        ("encryption", "key"),
        ("private", "key"),
        ("security", "code"),
        ("signing", "key"),
    }
)
# A word that says the value is about a secret, not the secret: a count, a limit, a reference.
_ABOUT_WORDS = frozenset(
    {
        "budget",
        "count",
        "endpoint",
        "env",
        "expires",
        "expiration",
        "expiry",
        "file",
        "kind",
        "length",
        "limit",
        "max",
        "min",
        "name",
        "path",
        "ref",
        "remaining",
        "total",
        "ttl",
        "type",
        "uri",
        "url",
        "usage",
        "used",
        "var",
        "variable",
    }
)


def secret_name(name: str) -> bool:
    """Whether a key or header named ``name`` holds a secret: one of its words is a secret word
    (or two adjacent words are, as in api_key), and none says it is only about one."""
    words = [w.lower() for w in _WORDS.findall(name)]
    if not words or any(w in _ABOUT_WORDS for w in words):
        return False
    return any(w in _SECRET_WORDS for w in words) or any(
        pair in _SECRET_PAIRS for pair in itertools.pairwise(words)
    )


def _luhn(digits: str) -> bool:
    total = 0
    for i, char in enumerate(reversed(digits)):
        d = int(char)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _classes(text: str) -> int:
    return sum(any(test(c) for c in text) for test in (str.islower, str.isupper, str.isdigit))


# The rules, in order: the wide ones (a whole PEM block, a whole header value) before the ones
# that would match a piece of them. A rule's replacement keeps what says what was there (a
# header's name, a key's name, a URL's user and host) and drops the secret.
Rule = tuple[str, Callable[[str], str]]


def _rule(name: str, pattern: str, replace: Callable[[re.Match[str]], str], flags: int = 0) -> Rule:
    compiled = re.compile(pattern, flags)
    return name, lambda text: compiled.sub(replace, text)


def _whole(_: re.Match[str]) -> str:
    return REDACTED


def _keep(group: int) -> Callable[[re.Match[str]], str]:
    return lambda m: m.group(group) + REDACTED


def _header(m: re.Match[str]) -> str:
    return f"{m.group(1)}{m.group(2)}{m.group(3)}{REDACTED}"


def _scheme(m: re.Match[str]) -> str:
    # "Bearer" and "Basic" followed by a credential, not by a word: a credential has a digit,
    # an inner capital or a token character, as base64 and opaque tokens do and prose does not;
    # or it is a long run of lowercase letters that does not read as English.
    credential = m.group(3)
    plain_word = credential.isalpha() and credential[1:].islower()
    if plain_word and len(credential) >= _LONG_WORD:
        plain_word = _reads_as_english(credential.lower())
    return m.group(0) if plain_word else f"{m.group(1)}{m.group(2)}{REDACTED}"


#: From this many letters on, a lowercase run after "bearer" or "basic" is prose only if it
#: reads as English; shorter English words are too varied to tell from a token by their letters
#: alone ("equipment", "bookkeeping" read less English than many random runs of 9 letters).
_LONG_WORD = 12
# How often each letter occurs in English text, in per cent (the well-known table).
# fmt: off
_ENGLISH = {
    "e": 12.7, "t": 9.1, "a": 8.2, "o": 7.5, "i": 7.0, "n": 6.7, "s": 6.3, "h": 6.1, "r": 6.0,
    "d": 4.3, "l": 4.0, "c": 2.8, "u": 2.8, "m": 2.4, "w": 2.4, "f": 2.2, "g": 2.0, "y": 2.0,
    "p": 1.9, "b": 1.5, "v": 1.0, "k": 0.8, "j": 0.15, "x": 0.15, "q": 0.1, "z": 0.07,
}
# fmt: on
# Each letter's log-likelihood ratio, English against uniformly random letters (bits).
_LETTER_BITS = {c: math.log2(p / sum(_ENGLISH.values()) * 26) for c, p in _ENGLISH.items()}
_CONSONANTS = re.compile(r"[^aeiouy]{5,}")
_VOWELS = re.compile(r"[aeiouy]{4,}")


def _reads_as_english(word: str) -> bool:
    """Whether a run of lowercase letters reads as an English word rather than a random
    token: its letters are, on average, at least as English as random (a log-likelihood ratio
    of 0.1 bit a letter or more), with no five consonants or four vowels in a row.
    ``tests/test_redaction.py`` measures both sides: random tokens of 12 letters pass about 2%
    of the time, of 16 under 1%, of 24 rarely; long English words ("responsibilities",
    "compatibility") do."""
    if not word or _CONSONANTS.search(word) or _VOWELS.search(word):
        return False
    return sum(_LETTER_BITS[c] for c in word) >= 0.1 * len(word)


_VALUE = r"""(?!\[redacted\])('[^']*'|"[^"]*"|\{[^{}]*\}|\[[^\[\]]*\]|[^\s,;&"'{}\[\]()]+)"""
# NAME=VALUE anywhere (a query string, a libpq setting, a log's key=value pairs).
_EQUALS = re.compile(rf"""(?<![\w.-])([A-Za-z_][\w.-]*)(["']?\s*=\s*)({_VALUE})""")
# NAME: VALUE only where a name stands as a key: quoted ("password": ...), or first on a line
# or after a bracket or comma (YAML, a header line). Not in an error line's "FIELD: message",
# where the field path (spec.model.apiKeyEnv) names where the mistake is, not a secret.
_COLON = re.compile(
    rf"""(?:^|(?<=[\[{{(,;])\s*|(?<=['"]))([A-Za-z_][\w-]*)(["']?\s*:\s*)({_VALUE})""",
    re.MULTILINE,
)


def _assignments(text: str) -> str:
    for pattern in (_EQUALS, _COLON):
        text = _assigned(pattern, text)
    return text


def _assigned(pattern: re.Pattern[str], text: str) -> str:
    # By hand, not re.sub: a name that says nothing secret gives up only itself, so that a
    # secret-named pair inside its value ("query": "user=bob&password=...") is still found.
    out: list[str] = []
    at = 0
    while (m := pattern.search(text, at)) is not None:
        if secret_name(m.group(1)):
            value = m.group(3)
            quote = value[0] if value[:1] in ("'", '"') else ""
            out.append(f"{text[at : m.start(3)]}{quote}{REDACTED}{quote}")
            at = m.end()
        else:
            out.append(text[at : m.end(1)])
            at = max(m.end(1), at + 1)
    out.append(text[at:])
    return "".join(out)


def _userinfo(m: re.Match[str]) -> str:
    if m.group(1).lower().endswith("mailto"):  # mailto:bob@example.com names an address
        return m.group(0)
    return f"{m.group(1)}:{URL_PASSWORD}@"


def _aws_secret(m: re.Match[str]) -> str:
    # 40 characters of base64 with a '/' or '+', all three letter and digit classes, and not
    # a path (few slashes, none at either end).
    text = m.group(0)
    slashes = text.count("/")
    looks = ("/" in text or "+" in text) and _classes(text) == 3 and slashes < 4
    return REDACTED if looks and not text.startswith("/") and not text.endswith("/") else text


def _provider_key(m: re.Match[str]) -> str:
    # A masked echo ("sk-ab***yz") always; else a long run of two character classes at least,
    # as a random key has and a product code ("sk-blue-widget-2026") has not.
    run = m.group(2)
    return REDACTED if run is None or _classes(run) >= 2 else m.group(0)


_CARD_START = re.compile(r"4|5[0-9]|2[2-7]|3[0-9]|6")


def _card(m: re.Match[str]) -> str:
    digits = re.sub(r"\D", "", m.group(0))
    if 13 <= len(digits) <= 19 and _CARD_START.match(digits) and _luhn(digits):
        return REDACTED
    return m.group(0)


RULES: tuple[Rule, ...] = (
    _rule(
        "PEM private key",
        r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----.*?"
        r"(?:-----END[A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----|\Z)",
        _whole,
        re.DOTALL,
    ),
    _rule(
        "Authorization or Cookie header",
        r"(?i)(?<![\w.-])((?:proxy-)?authorization|(?:set-)?cookie)"
        r"""(["']?\s*[:=]\s*)(["']?)(?!\[redacted\])([^\s"'][^\r\n"']*)""",
        _header,
    ),
    _rule(
        "Basic or Bearer credential",
        r"(?i)\b(bearer|basic)(\s+)([A-Za-z0-9._~+/-]{8,}=*)(?![\w.~+/=-])",
        _scheme,
    ),
    ("secret-named assignment", _assignments),
    _rule(
        "URL password",
        # "user:PW@" in any URL-like text (even with the "//" mistyped, and up to the last '@'
        # before the host's '/' should the password hold a raw '@'); the lookahead keeps
        # "postgresql://USER@HOST" intact.
        r"([^\s/@:]*):(?!//)(?!\*\*\*@)[^\s@]*(?:@[^\s@/]*)*@",
        _userinfo,
    ),
    _rule("PIN or CVV after its word", r"(?i)\b((?:cvv2?|cvc2?|csc|pin)\s+)(\d{3,8})\b", _keep(1)),
    _rule(
        "AWS access key id",
        r"(?<![A-Za-z0-9])(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|APKA|AROA|ASCA)"
        r"[A-Z0-9]{16}(?![A-Za-z0-9])",
        _whole,
    ),
    _rule(
        "AWS secret access key",
        r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])",
        _aws_secret,
    ),
    _rule("Google API key", r"(?<![\w-])AIza[0-9A-Za-z_-]{35}(?![\w-])", _whole),
    _rule(
        "GitHub token",
        r"(?<![\w-])(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})",
        _whole,
    ),
    _rule("GitLab or npm token", r"(?<![\w-])(?:glpat-[\w-]{20,}|npm_[A-Za-z0-9]{36})", _whole),
    _rule(
        "Slack token or webhook",
        r"(?<![\w-])(?:xox[abposre]-[A-Za-z0-9-]{10,}|xapp-\d-[A-Za-z0-9-]{10,})"
        r"|(?<=hooks\.slack\.com/)(?:services|workflows|triggers)/[A-Za-z0-9/_-]+",
        _whole,
    ),
    _rule(
        "JWT",
        r"(?<![\w-])eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*",
        _whole,
    ),
    _rule(
        "provider key",
        r"(?<![\w-])(?:sk|pk|rk)[-_]((?:[A-Za-z0-9]+[-_]){0,3}([A-Za-z0-9]{16,})[\w-]*)"
        r"|(?<![\w-])(?:sk|pk|rk)[-_][\w-]*\*{3,}[\w*-]*",
        _provider_key,
    ),
    _rule(
        "card number",
        r"(?<![\w+.-])(?:\d{13,19}|\d{4}([ -])\d{4}\1\d{4}\1\d{1,7}|\d{4}([ -])\d{6}\2\d{4,5})"
        r"(?![\w-])",
        _card,
    ),
)


def redact_text(text: str) -> str:
    """``text`` with every secret a rule recognises replaced (``[redacted]``, or ``***`` for a
    URL's password); everything else as it was. Applying it twice changes nothing more."""
    for _, rule in RULES:
        text = rule(text)
    return text


def redact_value(value: Any, *, name: str = "") -> Any:
    """A JSON-like ``value`` (as a tool's arguments are) fit to show: under a secret-named key
    every value is ``[redacted]`` whatever its type (None stays None: it hides nothing); every
    string is ``redact_text``-ed; a number shaped like a card number is redacted too."""
    if name and value is not None and secret_name(name):
        return REDACTED
    if isinstance(value, Mapping):
        return {str(k): redact_value(v, name=str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return REDACTED if redact_text(str(value)) == REDACTED else value
    return value


def redacted_line(error: BaseException) -> str:
    """An error's first line, redacted (its class's name when it says nothing), for a log."""
    text = redact_text(str(error)).strip()
    return text.splitlines()[0] if text else type(error).__name__


class RedactingFormatter(logging.Formatter):
    """A log line, traceback included, passed through ``redact_text`` once it is formatted."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


def log_to_stderr(level: int, fmt: str, *, force: bool = False) -> None:
    """``logging.basicConfig`` for Keelgate's processes, every line redacted: the CLI, the step
    runner, the operator and the Temporal worker log through this (as basicConfig, it changes
    nothing where logging was set up already, unless ``force``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(RedactingFormatter(fmt))
    logging.basicConfig(level=level, handlers=[handler], force=force)
