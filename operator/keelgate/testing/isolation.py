"""An attack on another tenant's rows, to prove PostgreSQL keeps tenants apart: run it with one
tenant's store URL and see that it reads nothing and changes nothing of another's.

Why it exists: tenants sharing a PostgreSQL store are kept apart by the database (row-level
security, ``keelgate tenant add``), and the one way to know that holds in a deployment is to
try. ``attack(url, victim=..., own=...)`` makes every read, insert, upsert, update and delete of
the victim's checkpoints (their plans and approvals), idempotency keys, recorded specs and audit
events, tries to settle the victim's unknown outcome and decide its approval through Keelgate's
own loop, to move its own rows into the victim's, to rewrite its own audit history, to change
the rules themselves, and to take or see what the server shares (the victim's run lock, any
advisory lock, owner ids, other sessions, the lock table, temporary tables: what
``keelgate tenant add`` closes where its URL may); it returns what happened to each. ``probe``
is the same as a Python tool (``keelgate.testing.isolation:probe``) for an AgentRun, so it runs
where a tenant's code runs: in its step pod, with the store URL the pod holds. Keelgate's tests
run both.

It must never succeed quietly: a statement that saw or changed a row is reported as a breach,
never hidden. It needs the ``postgres`` extra; it writes nothing anywhere unless the store lets
it, which is what it reports.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: What PostgreSQL may answer to an attack: it refused it (a privilege or a row-level security
#: policy), or the statement touched no row. Anything else is a breach.
REFUSED, NOTHING = "refused", "nothing"
MOVED = f"{REFUSED} or {NOTHING}"  # an attack on the attacker's own rows, which it may not have

# (name, statement, what PostgreSQL must answer). ``{victim}``, ``{own}`` and ``{key}`` are
# filled in as SQL literals, ``{superuser}`` as a name. "refused" where the role holds no such
# right at all, or a policy refuses the row it would write; "nothing" where it holds the right for
# its own rows and the policies leave it no row of the victim's. Moving its own rows is refused
# when it has some (a policy), and touches nothing when it has none.
ATTACKS: tuple[tuple[str, str, str], ...] = (
    # reads
    (
        "read checkpoints",
        "SELECT tenant FROM keelgate_checkpoints WHERE tenant = {victim}",
        NOTHING,
    ),
    (
        "read plans and approvals",
        "SELECT state FROM keelgate_checkpoints WHERE tenant <> {own} AND state LIKE '%plan%'",
        NOTHING,
    ),
    ("read keys", "SELECT tenant FROM keelgate_keys WHERE tenant = {victim}", NOTHING),
    ("read specs", "SELECT tenant FROM keelgate_specs WHERE tenant = {victim}", NOTHING),
    ("read audit events", "SELECT tenant FROM keelgate_audit WHERE tenant <> {own}", NOTHING),
    ("read other roles", "SELECT tenant FROM keelgate_tenants WHERE tenant <> {own}", NOTHING),
    # inserts as the victim
    (
        "insert a checkpoint",
        "INSERT INTO keelgate_checkpoints VALUES ({victim}, 'planted', 1, '{{}}')",
        REFUSED,
    ),
    (
        "insert a settled key",
        "INSERT INTO keelgate_keys (tenant, key, run, action, tool, state) "
        "VALUES ({victim}, 'kg-planted', 'planted', '1:0', 'place_order', 'completed')",
        REFUSED,
    ),
    (
        "insert an audit event",
        "INSERT INTO keelgate_audit VALUES ({victim}, 'planted', 1, 'forged', 'mallory', "
        "'2026-01-01T00:00:00Z', '{{}}', NULL, '', 'x')",
        REFUSED,
    ),
    (
        "insert a spec",
        "INSERT INTO keelgate_specs VALUES ({victim}, 'planted', 'mallory', 99, '{{}}')",
        REFUSED,
    ),
    # upserts over the victim's rows
    (
        "upsert over a checkpoint",
        "INSERT INTO keelgate_checkpoints SELECT {victim}, run, 999999, '{{}}' FROM "
        "(VALUES ('restock'), ('victim'), ('waiting')) AS r (run) ON CONFLICT (tenant, run) "
        "DO UPDATE SET seq = excluded.seq, state = excluded.state",
        REFUSED,
    ),
    (
        "claim the victim's key",
        "INSERT INTO keelgate_keys (tenant, key, run, action, tool, state, owner) "
        "VALUES ({victim}, {key}, 'victim', '1:0', 'place_order', 'in_flight', 1) "
        "ON CONFLICT DO NOTHING",
        REFUSED,
    ),
    # updates and deletes of the victim's rows
    (
        "rewrite plans and approvals",
        "UPDATE keelgate_checkpoints SET state = replace(state, 'place_order', 'refund') "
        "WHERE tenant = {victim}",
        NOTHING,
    ),
    (
        "settle the victim's keys",
        "UPDATE keelgate_keys SET state = 'abandoned', owner = NULL, settled_by = 'mallory' "
        "WHERE tenant = {victim}",
        NOTHING,
    ),
    ("rewrite specs", "UPDATE keelgate_specs SET spec = '{{}}' WHERE tenant = {victim}", REFUSED),
    (
        "rewrite audit events",
        "UPDATE keelgate_audit SET actor = 'mallory' WHERE tenant = {victim}",
        REFUSED,
    ),
    ("delete checkpoints", "DELETE FROM keelgate_checkpoints WHERE tenant = {victim}", REFUSED),
    ("delete keys", "DELETE FROM keelgate_keys WHERE tenant = {victim}", NOTHING),
    ("delete specs", "DELETE FROM keelgate_specs WHERE tenant = {victim}", REFUSED),
    ("delete audit events", "DELETE FROM keelgate_audit WHERE tenant = {victim}", REFUSED),
    ("truncate audit events", "TRUNCATE keelgate_audit", REFUSED),
    # its own rows moved into the victim's
    (
        "move own checkpoints",
        "UPDATE keelgate_checkpoints SET tenant = {victim} WHERE tenant = {own}",
        MOVED,
    ),
    ("move own keys", "UPDATE keelgate_keys SET tenant = {victim} WHERE tenant = {own}", MOVED),
    # its own history
    (
        "rewrite own audit events",
        "UPDATE keelgate_audit SET data = '{{}}' WHERE tenant = {own}",
        REFUSED,
    ),
    ("delete own audit events", "DELETE FROM keelgate_audit WHERE tenant = {own}", REFUSED),
    # the rules and who it is
    (
        "switch row-level security off",
        "ALTER TABLE keelgate_keys DISABLE ROW LEVEL SECURITY",
        REFUSED,
    ),
    ("drop a policy", "DROP POLICY keelgate_keys_read ON keelgate_keys", REFUSED),
    ("add a policy", "CREATE POLICY everything ON keelgate_keys USING (true)", REFUSED),
    (
        "become the victim in the lookup",
        "UPDATE keelgate_tenants SET tenant = {victim}",
        REFUSED,
    ),
    (
        "register as the operator",
        "INSERT INTO keelgate_tenants VALUES (current_user || '-x', {victim}, 'operator', 'now')",
        REFUSED,
    ),
    ("become a superuser", "SET SESSION AUTHORIZATION {superuser}", REFUSED),
    ("become a superuser's role", "SET ROLE {superuser}", REFUSED),
    # what the server shares: locks, owner ids, sessions (a delay, or a view of the others)
    ("hold the victim's run lock", "SELECT keelgate_lock_run({victim}, 'restock')", REFUSED),
    ("take an advisory lock", "SELECT pg_try_advisory_lock(1)", REFUSED),
    ("take an advisory lock (int, int)", "SELECT pg_try_advisory_lock(1, 2)", REFUSED),
    ("take a shared advisory lock", "SELECT pg_try_advisory_lock_shared(1)", REFUSED),
    ("draw owner ids", "SELECT nextval('keelgate_owner_seq')", REFUSED),
    ("see other sessions", "SELECT usename, application_name FROM pg_stat_activity", REFUSED),
    ("see the lock table", "SELECT objid FROM pg_locks", REFUSED),
    ("create a temporary table", "CREATE TEMP TABLE keelgate_probe (a int)", REFUSED),
)

#: What Keelgate's own loop must refuse with the attacker's stores (the error class's name).
LOOP_ATTACKS: tuple[tuple[str, str], ...] = (
    ("settle the victim's unknown outcome", "SettleError"),
    ("reconcile the victim's run", "RunNotFound"),
    ("approve the victim's action", "RunNotFound"),
    ("save over the victim's checkpoint", "StoreError"),
    ("append to the victim's chain", "StoreError"),
)


@dataclass(frozen=True)
class Report:
    """What each attack met: ``outcomes`` by name (``refused``, ``nothing``, or what it saw or
    changed); ``role`` the database role the URL logged in as."""

    role: str
    outcomes: Mapping[str, str]

    @property
    def breaches(self) -> dict[str, str]:
        """The attacks that saw or changed a row: empty when the tenants are apart."""
        return {k: v for k, v in self.outcomes.items() if v not in (REFUSED, NOTHING)}

    @property
    def unexpected(self) -> dict[str, str]:
        """The attacks PostgreSQL (or the loop) did not answer as ``ATTACKS`` and
        ``LOOP_ATTACKS`` say it must: a breach, or a refusal where nothing was expected (a
        right the role should have), or the other way round."""
        wanted = {name: outcome for name, _, outcome in ATTACKS}
        wanted.update({name: REFUSED for name, _ in LOOP_ATTACKS})
        return {
            name: self.outcomes.get(name, "NOT TRIED")
            for name, outcome in wanted.items()
            if self.outcomes.get(name) not in outcome.split(" or ")
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "outcomes": dict(self.outcomes),
            "breaches": self.breaches,
            "unexpected": self.unexpected,
        }


def attack(url: str, *, victim: str, own: str, key: str = "", run: str = "victim") -> Report:
    """Run every attack with ``url`` (the attacker's store URL) on tenant ``victim``; ``own``
    is the attacker's tenant, ``key`` an idempotency key of the victim's and ``run`` one of its
    runs that waits for a person (an unknown outcome, or an approval)."""
    import psycopg
    from psycopg import errors, sql

    outcomes: dict[str, str] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT current_user").fetchone()
        role = str(row[0]) if row else ""
        row = conn.execute("SELECT rolname FROM pg_roles WHERE rolsuper ORDER BY oid").fetchone()
        values: dict[str, sql.Composable] = {
            "victim": sql.Literal(victim),
            "own": sql.Literal(own),
            "key": sql.Literal(key or "kg-none"),
            "superuser": sql.Identifier(str(row[0]) if row else "postgres"),
        }
        for name, template, _ in ATTACKS:
            statement = sql.SQL(template).format(**values)
            try:
                cursor = conn.execute(statement)
            except errors.InsufficientPrivilege:
                outcomes[name] = REFUSED
                continue
            except psycopg.Error as error:  # not what a tenant's role should meet: say so
                outcomes[name] = f"ERROR {error.sqlstate}: {str(error).splitlines()[0]}"
                continue
            if cursor.description is not None:
                rows = cursor.fetchall()
                outcomes[name] = NOTHING if not rows else f"SAW {len(rows)} row(s)"
            else:
                touched = cursor.rowcount
                outcomes[name] = NOTHING if touched == 0 else f"CHANGED {touched} row(s)"
    outcomes.update(_through_keelgate(url, victim=victim, key=key, run=run))
    return Report(role, outcomes)


def _through_keelgate(url: str, *, victim: str, key: str, run: str) -> dict[str, str]:
    """The loop's own ways in: each must fail as LOOP_ATTACKS says."""
    from keelgate.core.audit import AuditDraft
    from keelgate.core.loop import Loop
    from keelgate.stores import open_stores

    stores = open_stores(url, pooled=False)
    loop = Loop(stores=stores)
    tries: dict[str, Callable[[], object]] = {
        "settle the victim's unknown outcome": lambda: stores.idempotency.settle(
            victim, key or "kg-none", executed=False, by="mallory", source="human"
        ),
        "reconcile the victim's run": lambda: loop.reconcile(
            victim, run, "1:0", executed=False, by="mallory"
        ),
        "approve the victim's action": lambda: loop.approve(
            victim, run, "1:0", approved=True, by="mallory"
        ),
        "save over the victim's checkpoint": lambda: stores.checkpoints.save(
            victim, run, 999999, {"planted": True}
        ),
        "append to the victim's chain": lambda: stores.audit.append(
            victim, run, [AuditDraft("forged", {"by": "mallory"})]
        ),
    }
    expected = dict(LOOP_ATTACKS)
    outcomes: dict[str, str] = {}
    try:
        for name, attempt in tries.items():
            try:
                attempt()
            except Exception as error:  # the class of what it raised is the result
                refused = type(error).__name__ == expected[name]
                outcomes[name] = REFUSED if refused else f"FAILED OTHERWISE: {type(error).__name__}"
            else:
                outcomes[name] = "DONE"
    finally:
        stores.close()
    return outcomes


def probe(args: Mapping[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
    """``attack`` as a Python tool: the store URL is the step pod's own (``KEELGATE_STORE``),
    ``args`` name the victim (``victim``, and optionally ``key`` and ``run``) and the
    attacker's own tenant (``own``). Returns the report as JSON."""
    url = os.environ.get("KEELGATE_STORE", "")
    report = attack(
        url,
        victim=str(args["victim"]),
        own=str(args["own"]),
        key=str(args.get("key", "")),
        run=str(args.get("run", "victim")),
    )
    return {"isolation": report.to_json()}
