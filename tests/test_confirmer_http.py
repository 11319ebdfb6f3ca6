"""The HTTP confirmer: it asks the system of record over real HTTP (a loopback server) and trusts
only a definite, well-formed answer; everything else leaves the decision to a person."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fakes.loopback import Answer, LoopbackServer, Received
from keelgate.adapters.confirmers import HttpConfirmer
from keelgate.core.types import UnknownAction
from keelgate.errors import InputError

UNKNOWN = UnknownAction("3:0", "place_order", "kg-abc/1")


class Ledger(LoopbackServer):
    """Answers GET /confirm/{key} with whatever the test set for that key."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: dict[str, Answer] = {}

    def respond(self, received: Received) -> Answer:
        return self.answers.get(received.path, Answer(404, {"error": "unknown key"}))


@pytest.fixture
def ledger() -> Iterator[Ledger]:
    server = Ledger()
    server.start()
    yield server
    server.stop()


def confirm(url: str, **kwargs: Any) -> bool | None:
    return HttpConfirmer(url, **kwargs).confirm("shop", "restock", UNKNOWN, {"qty": 20})


def test_a_definite_answer_settles_and_the_arguments_are_never_sent(ledger: Ledger) -> None:
    """`executed: true` confirms, `false` abandons; the request names the key (URL-encoded) and
    carries none of the tool's arguments."""
    path = "/confirm/kg-abc%2F1"
    ledger.answers[path] = Answer(200, {"executed": True})
    assert confirm(f"{ledger.url}/confirm/{{idempotencyKey}}") is True
    ledger.answers[path] = Answer(200, {"executed": False})
    assert confirm(f"{ledger.url}/confirm/{{idempotencyKey}}") is False
    assert {r.path for r in ledger.received} == {path}
    assert all(not r.body and "qty" not in r.path for r in ledger.received)


@pytest.mark.parametrize(
    "answer",
    [
        Answer(404, {"error": "unknown key"}),
        Answer(500, {"executed": True}),
        Answer(200, {"executed": "yes"}),
        Answer(200, {"orders": 1}),
        Answer(200, ["executed"]),
        Answer(200, None),
        Answer(reset=True),
        Answer(drop=True),
    ],
    ids=["404", "500", "not-a-bool", "no-field", "a-list", "no-body", "reset", "dropped"],
)
def test_anything_but_a_definite_answer_leaves_it_for_a_person(
    ledger: Ledger, answer: Answer
) -> None:
    """An error status, a malformed or missing `executed`, a reset or a dropped connection: the
    confirmer answers None (unknown), never True or False, and never raises."""
    ledger.answers["/confirm/kg-abc%2F1"] = answer
    assert confirm(f"{ledger.url}/confirm/{{idempotencyKey}}", timeout_seconds=2) is None


def test_a_server_that_is_not_there_leaves_it_for_a_person() -> None:
    """A refused connection is not knowledge."""
    assert confirm("http://127.0.0.1:9/confirm/{idempotencyKey}", timeout_seconds=2) is None


@pytest.mark.parametrize(
    "url", ["ftp://ledger/{idempotencyKey}", "http://ledger/{key}", "http://ledger/{0}"]
)
def test_a_bad_url_is_refused_naming_the_option(url: str) -> None:
    """A URL that is not http(s) or names an unknown field fails at once, naming the option."""
    with pytest.raises(InputError) as refused:
        HttpConfirmer(url)
    assert refused.value.field == "--confirmer-url"
