"""The operator's signature over a stopped run's audit chain head (``--audit-sign-key``).

Why it exists: whoever can write the store can rewrite a run's whole chain consistently, and
``keelgate audit --verify`` would find nothing wrong. When a run stops, the operator signs a
Statement naming the chain's head (its last event's seq and hash, which covers every event
before it) with a key the store's writers need not hold, and puts the envelope on the chain as
an ``audit.head_signed`` event. ``keelgate audit RUN --verify --key PUB`` then checks each signed
head against the chain: a rewrite of any event up to a signed head is found. The signing itself
is injected (``ControllerSettings.sign_head``): this module never sees the key, and must never
sign a head it did not read from the store, nor put anything on the chain but the head's seq,
hash and the envelope.
"""

from __future__ import annotations

import json

from keelgate.core.attestation import HEAD_EVENT, head_statement
from keelgate.core.audit import AuditDraft, AuditEvent, utc_now
from keelgate.kube.controller.context import ControllerContext
from keelgate.kube.controller.ports import Key

#: Who signed, on the chain.
SIGNER = "keelgate-operator"


def sign_head(context: ControllerContext, key: Key) -> bool:
    """Sign ``key``'s chain head unless it is signed already; whether an event was added."""
    sign = context.settings.sign_head
    if sign is None:
        return False
    _, namespace, name = key
    after = context.memory.signed_up_to(key)
    head: AuditEvent | None = None
    for event in context.stores.audit.iter_events(namespace, name, after=after):
        head = event
    if head is None:
        return False  # nothing new since the last signed head (or no chain at all)
    if head.type == HEAD_EVENT:
        context.memory.signed(key, head.seq)
        return False
    document = head_statement(namespace, name, head.seq, head.hash, signed_at=utc_now())
    payload = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    envelope = dict(sign(payload))
    draft = AuditDraft(
        HEAD_EVENT,
        {"seq": head.seq, "hash": head.hash, "envelope": envelope},
        actor=SIGNER,
        key=f"head-signed-{head.seq}",
    )
    context.stores.audit.append(namespace, name, [draft])
    context.memory.signed(key, head.seq + 1)
    return True
