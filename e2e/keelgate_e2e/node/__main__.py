"""Command line of the node agent: `python -m keelgate_e2e.node --kubeconfig ... --name ...`.

Why it exists: `make up` and the pytest fixtures start the agent as its own process (so it can
outlive `make up` and be stopped like the other components). It must never run without a
kubeconfig for a `system:node:<name>` user, and stops all pod processes on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from keelgate_e2e.kube import Kube
from keelgate_e2e.node.agent import Agent
from keelgate_e2e.procs import MARKER


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run the agent until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m keelgate_e2e.node", description=__doc__)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument(
        "--name", required=True, help="Node name (the kubeconfig user must be system:node:<name>)"
    )
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True, help="kubelet (log) port")
    parser.add_argument("--tls-cert", type=Path, required=True)
    parser.add_argument("--tls-key", type=Path, required=True)
    parser.add_argument("--client-ca", type=Path, required=True)
    parser.add_argument(
        "--allowed-client",
        action="append",
        default=[],
        help="common name allowed to read logs (repeatable)",
    )
    parser.add_argument("--node-ip", default="127.0.0.1")
    parser.add_argument(
        "--backoff-base",
        type=float,
        default=10.0,
        help="first crash-loop back-off in seconds (kubelet: 10)",
    )
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
    )
    marker = {MARKER: os.environ[MARKER]} if MARKER in os.environ else {}
    agent = Agent(
        Kube.from_kubeconfig(args.kubeconfig),
        args.name,
        args.state_dir,
        port=args.port,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        client_ca=args.client_ca,
        allowed_clients=frozenset(args.allowed_client or ["kube-apiserver-kubelet-client"]),
        node_ip=args.node_ip,
        backoff_base=args.backoff_base,
        marker_env=marker,
    )

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("keelgate_e2e.node").info("signal %d: stopping", signum)
        agent.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
