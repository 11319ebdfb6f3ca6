"""What row-level security costs a loop: the same iteration as the tables' owner and as a
tenant's own role, side by side on one PostgreSQL server.

Tenants sharing a store each log in as a role of their own (``keelgate tenant add``), and every
statement of theirs then passes the policies of schema migration 3: a lookup of the session's
role in ``keelgate_tenants`` per statement. The owner (the administrator, or a store used
through one shared URL as before) bypasses them. This drives the loop of ``loop_vs_commits.py``
(one WRITE per iteration: plan checkpoint, claim, completion with its checkpoint, observe and
verify checkpoints) in rounds that alternate between the two URLs on the same database, so load
from other work on the machine affects both alike, and reports the median time per iteration of
each and their ratio. The server is started here with fsync on, as Keelgate runs on one, and
stopped at the end.
"""

from __future__ import annotations

import argparse
import logging
import statistics
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


def main(argv: Sequence[str] | None = None) -> int:
    logging.getLogger("keelgate").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=100, help="iterations per round")
    parser.add_argument("--rounds", type=int, default=9, help="rounds per URL, alternating")
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
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
