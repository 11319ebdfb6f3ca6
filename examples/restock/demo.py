"""`make demo`: Keelgate's promise, shown on the restock example with a real process death.

The agent reads the inventory and places an order (a WRITE). We kill its process right after the
order reached the shop but before Keelgate recorded it. A naive agent would order again on
restart; Keelgate stops instead, because it does not know. A person checks the shop, settles the
unknown outcome, and the run finishes with exactly one order. Every step is a `keelgate` command
you can type yourself.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.rule import Rule

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STATE = ROOT / ".keelgate" / "demo"
STORE = f"sqlite:///{STATE.relative_to(ROOT)}/keelgate.db"
MANIFEST = HERE.relative_to(ROOT) / "agentrun.yaml"

console = Console(highlight=False)


def keelgate(*args: str, failpoints: str = "") -> int:
    """Run one `keelgate` command as a user would, showing it first."""
    shown = " ".join(shlex.quote(a) for a in args)
    prefix = f"KEELGATE_FAILPOINTS={failpoints} " if failpoints else ""
    console.print(f"[bold cyan]$ {prefix}keelgate {shown}[/]")
    env = {
        **os.environ,
        "SHOP_DIR": str(STATE / "shop"),
        "PYTHONPATH": str(HERE),
        "KEELGATE_STORE": STORE,
    }
    env.pop("KEELGATE_FAILPOINTS", None)
    if failpoints:
        env["KEELGATE_FAILPOINTS"] = failpoints
    code = subprocess.run([sys.executable, "-m", "keelgate", *args], cwd=ROOT, env=env).returncode
    console.print(f"[dim](exit code {code})[/]\n")
    return code


def orders() -> list[dict[str, object]]:
    sys.path.insert(0, str(HERE))
    os.environ["SHOP_DIR"] = str(STATE / "shop")
    import shop

    return shop.orders()


def step(title: str, text: str) -> None:
    console.print(Rule(f"[bold]{title}"))
    console.print(text + "\n")


def main() -> int:
    shutil.rmtree(STATE, ignore_errors=True)
    STATE.mkdir(parents=True)
    console.print(
        "[bold]Keelgate demo[/]: a restocking agent whose WRITE (place_order) must never run "
        "twice, whatever dies and whenever. The model is scripted, so no API key is needed.\n"
    )
    console.print(f"[bold cyan]$ export KEELGATE_STORE={STORE}[/]   [dim]# a fresh store[/]\n")

    step(
        "1. The agent runs, and its process is killed mid-way",
        "KEELGATE_FAILPOINTS arms a crash window: after_gateway_call@2 kills the process "
        "(os._exit(137), nothing flushed) right after the 2nd tool call returned: the shop "
        "has accepted the order, but Keelgate has not recorded that it did.",
    )
    code = keelgate("run", "-f", str(MANIFEST), failpoints="after_gateway_call@2")
    if code != 137:
        console.print(f"[red]expected the process to die with 137, got {code}[/]")
        return 1
    console.print(f"The shop's order book now holds [bold]{len(orders())}[/] order(s).\n")

    step(
        "2. Run it again",
        "A naive agent would ask the model again, or retry the call, and order twice. "
        "Keelgate finds the order's idempotency key in flight with its owner dead: the outcome "
        "is unknown, so it stops and asks a person. Not knowing is a reason to stop.",
    )
    code = keelgate("run", "-f", str(MANIFEST))
    if code != 3:
        console.print(f"[red]expected a resumable stop (3), got {code}[/]")
        return 1

    step(
        "3. A person checks the shop and settles it",
        "The order book shows the order with Keelgate's idempotency key, so it did happen.",
    )
    for order in orders():
        console.print(
            f"  order: sku={order['sku']} qty={order['qty']} key={order['idempotencyKey']}"
        )
    console.print()
    if keelgate("reconcile", "restock", "2:0", "--executed", "--by", "demo-operator") != 0:
        return 1

    step(
        "4. Resume",
        "The order is recorded as done; the run continues from its checkpoint, "
        "without asking the model to plan that step again.",
    )
    if keelgate("resume", "restock") != 0:
        return 1
    count = len(orders())
    colour = "green" if count == 1 else "red"
    console.print(f"Orders placed in all: [bold {colour}]{count}[/] (one crash, one order).\n")

    step("5. The audit trail", "Hash-chained: editing or removing any event breaks the chain.")
    if keelgate("audit", "restock", "--verify") != 0:
        return 1
    return 0 if count == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
