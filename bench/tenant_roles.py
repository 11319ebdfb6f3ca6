"""What row-level security costs a loop: the same iteration as the tables' owner and as a
tenant's own role, side by side on one PostgreSQL server.

Tenants sharing a store each log in as a role of their own (``keelgate tenant add``), and every
statement of theirs then passes the policies of schema migration 3: a lookup of the session's
role in ``keelgate_tenants`` per statement. The owner (the administrator, or a store used
through one shared URL as before) bypasses them. This drives the loop of ``loop_vs_commits.py``
(one WRITE per iteration: plan checkpoint, claim, completion with its checkpoint, observe and
verify checkpoints) in rounds that alternate between the two URLs on the same database, so load
from other work on the machine affects both alike, and reports the median time per iteration of
each and their ratio; then, without a commit's flush in the way, the time of one statement the
policies are added to (a key read, its owner judged in the same SELECT), the same way. The server
is started here with fsync on, as Keelgate runs on one, and stopped at the end.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Sequence

from commitbench.loop import TENANT, StampedModel, drive, per_iteration
from keelgate.stores import open_stores
from keelgate.stores.tenancy import TenantStore
from keelgate.testing.pgserver import start_postgres


def one_round(url: str, run: str, iterations: int) -> float:
    """Seconds per iteration of ``iterations`` more iterations of ``run``, on a new store."""
    store = open_stores(url)
    try:
        model = StampedModel()
        drive(store.checkpoints, run, iterations, model)
        return per_iteration(model.stamps)
    finally:
        store.close()


def one_key(url: str) -> str:
    """An idempotency key the loop wrote for the tenant."""
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT key FROM keelgate_keys WHERE tenant = %s LIMIT 1", (TENANT,)
        ).fetchone()
    assert row is not None
    return str(row[0])


def key_reads(url: str, key: str, count: int) -> float:
    """Seconds per read of one key as the loop reads it (its owner judged in the same SELECT),
    on a new store: the statement a policy lookup is added to, without a commit's flush."""
    store = open_stores(url, pooled=False)
    try:
        started = time.perf_counter()
        for _ in range(count):
            store.idempotency.get(TENANT, key)
        return (time.perf_counter() - started) / count
    finally:
        store.close()


def main(argv: Sequence[str] | None = None) -> int:
    logging.getLogger("keelgate").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=100, help="iterations per round")
    parser.add_argument("--rounds", type=int, default=9, help="rounds per URL, alternating")
    parser.add_argument("--reads", type=int, default=2000, help="key reads per round")
    args = parser.parse_args(argv)
    server = start_postgres(fsync=True, password="bench-admin-pw")
    try:
        owner = server.create_database()
        with TenantStore(owner) as admin:
            tenant = admin.add(TENANT, role="keelgate-bench").url
        urls = {"owner (no row-level security)": owner, "tenant's role": tenant}
        times: dict[str, list[float]] = {name: [] for name in urls}
        for name, url in urls.items():  # warm-up: each run's first iterations, untimed
            one_round(url, name.split()[0], 5)
        for index in range(args.rounds):
            order = list(urls.items()) if index % 2 == 0 else list(reversed(urls.items()))
            for name, url in order:
                times[name].append(one_round(url, name.split()[0], args.iterations))
        print(f"{args.rounds} rounds x {args.iterations} iterations, one WRITE each")
        for name, seconds in times.items():
            spread = f"{min(seconds) * 1e3:.2f}-{max(seconds) * 1e3:.2f}"
            median = statistics.median(seconds) * 1e3
            print(f"  {name:32s} {median:7.2f} ms/iteration (rounds: {spread} ms)")
        owner_s, tenant_s = (statistics.median(times[name]) for name in urls)
        print(f"  tenant / owner: {tenant_s / owner_s:.3f}")
        key = one_key(owner)
        reads: dict[str, list[float]] = {name: [] for name in urls}
        for index in range(args.rounds):
            order = list(urls.items()) if index % 2 == 0 else list(reversed(urls.items()))
            for name, url in order:
                reads[name].append(key_reads(url, key, args.reads))
        print(f"{args.rounds} rounds x {args.reads} reads of a key, one session, no commit")
        for name, seconds in reads.items():
            median = statistics.median(seconds) * 1e6
            print(f"  {name:32s} {median:7.1f} us/read")
        owner_r, tenant_r = (statistics.median(reads[name]) for name in urls)
        print(f"  tenant / owner: {tenant_r / owner_r:.3f}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
