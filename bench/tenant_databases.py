"""What a database per tenant costs: the figures docs/stores.md weighs for 1,000 namespaces.

Each tenant that ``keelgate tenant add`` gives a database of its own costs the server that
database (its catalogs on disk, made by ``CREATE DATABASE``), and costs the operator one session
on it while it serves the tenant (``TenantDatabases``: opened on demand, closed after a minute
idle, at most ``MOST_OPEN`` beyond those in use). This adds TENANTS tenants to a fresh server and
measures, side by side in one run: the time of ``tenant add`` with and without a database of its
own (``--shared-database``), the disk of one tenant's database, the operator's first call for a
tenant (its session opened: connect, SCRAM, schema check, owner id) against a call on a session
already open, and the memory of an idle server session after Keelgate's statements (proportional
set size, from /proc). It then scales them to 1,000 namespaces. The server runs with fsync on.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import psycopg

from keelgate.stores import open_stores
from keelgate.stores.tenancy import TenantStore
from keelgate.stores.tenant_databases import MOST_OPEN, TenantDatabases
from keelgate.testing.pgserver import start_postgres


def pss_kib(pid: int) -> int | None:
    """A process's proportional set size (KiB), or None where /proc does not say."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=20)
    args = parser.parse_args()
    server = start_postgres(password="bench-admin-pw", fsync=True)
    try:
        home = server.create_database()
        own_adds, shared_adds = [], []
        with TenantStore(home) as admin:
            operator = admin.add("keelgate-system", kind="operator").url
            for n in range(args.tenants):
                started = time.perf_counter()
                admin.add(f"own-{n}")
                own_adds.append(time.perf_counter() - started)
                started = time.perf_counter()
                admin.add(f"shared-{n}", shared=True)
                shared_adds.append(time.perf_counter() - started)
            database = admin.database_of("own-0")
        with psycopg.connect(server.url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_database_size(%s)", (database,)).fetchone()
            assert row is not None
            disk = int(row[0])
        stores = open_stores(operator)
        router = stores.checkpoints
        assert isinstance(router, TenantDatabases)
        first, again = [], []
        try:
            for n in range(min(args.tenants, MOST_OPEN)):
                tenant = f"own-{n}"
                started = time.perf_counter()
                router.load(tenant, "nothing")
                first.append(time.perf_counter() - started)
                started = time.perf_counter()
                router.load(tenant, "nothing")
                again.append(time.perf_counter() - started)
            role = operator.split("://", 1)[1].split(":", 1)[0]
            with psycopg.connect(server.url, autocommit=True) as conn:
                pids = [
                    int(row[0])
                    for row in conn.execute(
                        "SELECT pid FROM pg_stat_activity WHERE usename = %s", (role,)
                    ).fetchall()
                ]
            sizes = [size for size in (pss_kib(pid) for pid in pids) if size is not None]
            sessions = len(pids)
        finally:
            stores.close()
    finally:
        server.stop()
    ms = 1000.0
    print(f"tenants added: {args.tenants} with a database of their own, as many without")
    print(
        f"tenant add: {statistics.median(own_adds) * ms:.0f} ms with its own database, "
        f"{statistics.median(shared_adds) * ms:.0f} ms without "
        f"({statistics.median(own_adds) / statistics.median(shared_adds):.1f}x)"
    )
    print(f"one tenant's database on disk: {disk / 2**20:.1f} MiB")
    print(
        f"the operator's first call for a tenant: {statistics.median(first) * ms:.1f} ms; "
        f"on its open session: {statistics.median(again) * ms:.2f} ms "
        f"({statistics.median(first) / statistics.median(again):.0f}x)"
    )
    per_session = statistics.median(sizes) / 1024 if sizes else float("nan")
    print(
        f"the operator's sessions: {sessions} (home pool and one per tenant served), "
        f"{per_session:.1f} MiB each (PSS, idle after Keelgate's statements)"
    )
    print("scaled to 1,000 namespaces, each with a database of its own:")
    print(f"  disk for their databases: {1000 * disk / 2**30:.1f} GiB")
    print(f"  tenant add for all of them: {1000 * statistics.median(own_adds):.0f} s")
    print(
        f"  the operator's sessions on tenant databases: at most {MOST_OPEN} beyond those in "
        f"use ({MOST_OPEN * per_session:.0f} MiB of server memory), against 1,000 "
        f"({1000 * per_session / 1024:.1f} GiB) if each tenant kept one open"
    )


if __name__ == "__main__":
    main()
