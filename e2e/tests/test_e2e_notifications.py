"""Being told (issue 41, item 4), on the control plane: the operator installed by the chart with
a sink, a real receiver on loopback reading each request with the CloudEvents SDK.

It must never depend on objects outside its own namespace (events of other namespaces are left
aside), and leaves the session's operator as it found it (the chart installed again without
the sink).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from keelgate.kube.naming import action_object_name

from keelgate_e2e import keelgate as kg
from keelgate_e2e import runs
from keelgate_e2e.events import Receiver, data
from keelgate_e2e.keelgate import OperatorPod
from keelgate_e2e.kube import Kube
from keelgate_e2e.runs import agentrun, apply, order, wait_phase
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl, wait_for

#: The Approval of run asks' order (its name carries a digest of run, action and tool).
ASKS = action_object_name("asks", "1:0", "place_order")
UNSURE = action_object_name("unsure", "1:0", "place_order")
pytestmark = pytest.mark.e2e

HEADERS_SECRET = "keelgate-notify-e2e"
TOKEN = "Bearer e2e-sink-token-5521"


@pytest.fixture
def told(operator: OperatorPod, admin: Kube) -> Iterator[Receiver]:
    """The session's operator, installed again with one sink (the receiver, a header from a
    Secret); afterwards installed as it was."""
    receiver = Receiver().start()
    secrets = f"/api/v1/namespaces/{kg.SYSTEM}/secrets"
    admin.create(
        secrets,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": HEADERS_SECRET},
            "stringData": {"Authorization": TOKEN},
        },
    )
    try:
        operator.install(
            "notifications.sinks[0].name=e2e",
            f"notifications.sinks[0].url={receiver.url}",
            f"notifications.sinks[0].headersSecret={HEADERS_SECRET}",
            "notifications.sinks[0].retryForSeconds=120",
        )
        yield receiver
    finally:
        operator.install()
        admin.delete(f"{secrets}/{HEADERS_SECRET}")
        receiver.stop()


def test_a_run_waiting_for_approval_and_an_unknown_outcome_are_told_to_a_receiver(
    told: Receiver,
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
) -> None:
    """With the chart's `notifications.sinks` set: a run stops for approval and another on an
    unknown outcome (its step pod killed right after the order). The receiver (whose first
    answer is a 503) is told each decision asked for and each stop, then alice's approval and
    her settlement (by alice, human), then each run's success: CloudEvents the SDK reads, each
    once, under the run's source, with the Secret's header, and no order's argument nor the
    store's password in any of them. How far delivery has come is kept in the release's
    ConfigMap."""
    apply(
        kubectl,
        agentrun("asks", shop, [[order("NOTE-A1", 4)]], approval=True),
        agentrun(
            "unsure",
            shop,
            [[order("NOTE-U1", 5)]],
            annotations={"keelgate.dev/failpoints": "after_gateway_call@1"},
        ),
    )
    for name in ("asks", "unsure"):
        wait_phase(admin, tenant, name, "Stopped", timeout=120)

    def kinds() -> set[tuple[str, str]]:
        return {(e.get_type(), e.get_subject() or "") for e, _, _ in told.of(tenant)}

    asked = {
        ("dev.keelgate.approval.requested", f"approvals/{ASKS}"),
        ("dev.keelgate.reconciliation.requested", f"reconciliations/{UNSURE}"),
        ("dev.keelgate.run.stopped", "agentruns/asks"),
        ("dev.keelgate.run.stopped", "agentruns/unsure"),
    }
    wait_for(lambda: asked <= kinds(), timeout=60, what=f"the asks told (got {kinds()})")
    for approval in runs.approvals(admin, tenant):
        runs.decide(alice, approval["metadata"]["name"])
    runs.settle_truly(alice, admin, tenant, shop)
    for name in ("asks", "unsure"):
        wait_phase(admin, tenant, name, "Succeeded", timeout=120)
    done = asked | {
        ("dev.keelgate.approval.approved", f"approvals/{ASKS}"),
        ("dev.keelgate.reconciliation.settled", f"reconciliations/{UNSURE}"),
        ("dev.keelgate.run.succeeded", "agentruns/asks"),
        ("dev.keelgate.run.succeeded", "agentruns/unsure"),
    }
    wait_for(lambda: done <= kinds(), timeout=60, what=f"the decisions told (got {kinds()})")

    got = told.of(tenant)
    assert not told.unreadable, told.unreadable
    assert len(got) == len(done), [(e.get_type(), e.get_subject()) for e, _, _ in got]
    assert len({e.get_id() for e, _, _ in got}) == len(done)
    by = {e.get_type(): data(e) for e, _, _ in got}
    approved, settled = (
        by["dev.keelgate.approval.approved"],
        by["dev.keelgate.reconciliation.settled"],
    )
    assert (approved["verdict"], approved["by"]) == ("approved", "alice")
    assert (settled["verdict"], settled["by"], settled["source"]) == ("executed", "alice", "human")
    for event, headers, raw in got:
        run = data(event)["run"]
        assert event.get_source() == f"/{kg.SYSTEM}/keelgate/namespaces/{tenant}/agentruns/{run}"
        assert headers["authorization"] == TOKEN
        wire = raw.decode() + repr(headers)
        for secret in ("NOTE-A1", "NOTE-U1", kg.STORE_PASSWORD):
            assert secret not in wire, (event.get_type(), secret)
    assert told.requests >= len(got) + 1  # the first, refused, was tried again
    state = admin.get(f"/api/v1/namespaces/{kg.SYSTEM}/configmaps/keelgate-notify-state")
    assert state["data"]["through"]
    assert 'keelgate_notifications_sent_total{sink="e2e"' in operator.metrics()
