"""The decision inbox refuses a decision form that carries no CSRF field at all.

A real ``InboxServer`` on a loopback port, driven over plain HTTP as a browser without
JavaScript drives it (``urllib`` with a cookie jar, following the sign-in address and its
redirects, reading the page's own decision form). Its reads and decisions go to
``FakeCluster`` (the plugin's tests' API server as the plugin sees it), so a decision that gets
through is a patch that can be counted. The browser tests (e2e/tests/test_e2e_inbox.py) cover
the same server on the control plane.
"""

from __future__ import annotations

import http.cookiejar
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urljoin

import pytest

from keelgate.cli.plugin.target import Target
from keelgate.cli.plugin.ui.server import InboxServer
from keelgate.cli.plugin.ui.views import Views, Waiting
from keelgate.errors import InputError
from test_kubectl_plugin import FakeCluster, decision, run_body

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: me, context: {cluster: c, user: u, namespace: shop}}]
current-context: me
"""


class _ShopViews(Views):
    """The inbox's reads of a cluster holding one approval in shop/restock; decisions go to
    ``cluster``."""

    def __init__(self, config: Path, cluster: FakeCluster) -> None:
        super().__init__(Target(str(config), "me", "shop"))
        self.cluster = cluster

    def user(self) -> str:
        return "alice"

    def all_namespaces(self) -> bool:
        return False

    def inbox(self) -> list[Waiting]:
        return [
            Waiting(
                kind="Approval",
                namespace="shop",
                name="restock-1-place-order",
                run="restock",
                action="1:0",
                tool="place_order",
                side_effect="WRITE",
                key="kg-1",
                created="2026-12-05T08:00:00Z",
                waited="1m",
                not_executed_after="",
                said="",
                args={"sku": "A1"},
                args_unavailable="",
                may=True,
                why_not="",
            )
        ]

    def runs(self) -> list[Any]:
        return []

    def run_page(self, namespace: str, name: str) -> Any:
        raise InputError("RUN", f"no AgentRun named {name!r}")

    def client(self, namespace: str) -> Any:
        return self.cluster


class _DecisionForm(HTMLParser):
    """The first decision form of a page: where it posts and its hidden fields."""

    def __init__(self) -> None:
        super().__init__()
        self.action = ""
        self.fields: dict[str, str] = {}
        self._inside = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        given = {k: v or "" for k, v in attrs}
        if tag == "form" and "decide" in given.get("class", "") and not self.action:
            self.action, self._inside = given.get("action", ""), True
        elif tag == "input" and self._inside and given.get("type") == "hidden":
            self.fields[given["name"]] = given.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._inside = False


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[InboxServer, FakeCluster]]:
    config = tmp_path / "kubeconfig"
    config.write_text(KUBECONFIG)
    cluster = FakeCluster(target=Target(str(config), "me", "shop"))
    cluster.runs["restock"] = run_body("restock")
    cluster.objects["Approval"].append(decision("Approval", "restock", "1:0"))
    server = InboxServer(0, _ShopViews(config, cluster))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server, cluster
    finally:
        server.shutdown()
        server.close()
        thread.join(5)


def test_a_decision_form_without_a_csrf_field_decides_nothing(
    served: tuple[InboxServer, FakeCluster],
) -> None:
    """Signed in (the session cookie held), a browser posts the page's own decision form with
    its CSRF field left out altogether: 403, and nothing is patched. The same form with the
    field as the page gave it is carried out (one patch, the approval in alice's name), so the
    refusal is the missing field's doing."""
    server, cluster = served
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with browser.open(server.url, timeout=10) as signed_in:  # follows the sign-in redirect
        page, at = signed_in.read().decode(), signed_in.geturl()
    assert len(jar) == 1  # the session cookie
    form = _DecisionForm()
    form.feed(page)
    assert form.action and "csrf" in form.fields, page[:400]
    target = urljoin(at, form.action)
    choice = {"choice": "approve", "note": "ok"}
    without = {k: v for k, v in form.fields.items() if k != "csrf"}
    with pytest.raises(urllib.error.HTTPError) as refused:
        browser.open(target, data=urlencode({**without, **choice}).encode(), timeout=10)
    assert refused.value.code == 403
    assert cluster.patches == []
    with browser.open(target, data=urlencode({**form.fields, **choice}).encode(), timeout=10):
        pass
    assert [(kind, spec["approved"], spec["by"]) for kind, _, spec in cluster.patches] == [
        ("Approval", True, "alice")
    ]
