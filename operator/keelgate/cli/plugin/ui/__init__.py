"""``kubectl keelgate ui``: the decision inbox, a web view for the people who decide.

Why it exists: the person who approves a payment or settles an unknown outcome is often not a
kubectl user. This command serves, on 127.0.0.1, an inbox of every waiting decision the user can
see, the runs, and each run's timeline and verified audit trail, acting as the kubeconfig
context's user (``server``). It prints the address (with a sign-in token) and opens
nothing by itself; Ctrl-C stops it.

It must never listen on anything but 127.0.0.1 and never act as anyone but that user.
"""

from __future__ import annotations

import os
import signal
from typing import Annotated

import typer

from keelgate.cli.plugin.commands import (
    ContextOption,
    KubeconfigOption,
    NamespaceOption,
    _flags,
    app,
)
from keelgate.cli.plugin.target import resolve
from keelgate.errors import InputError

#: The port when none is given (0 picks a free one).
DEFAULT_PORT = 8765


@app.command("ui")
def ui_command(
    ctx: typer.Context,
    port: Annotated[
        int, typer.Option("--port", help="Port on 127.0.0.1 (0: any free port).")
    ] = DEFAULT_PORT,
    store: Annotated[
        str,
        typer.Option(
            "--store",
            envvar="KEELGATE_STORE",
            help="The operator's store, for arguments and audit trails (default: each "
            "namespace's Secret keelgate-store, read as you).",
            show_default=False,
        ),
    ] = "",
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    namespace: NamespaceOption = None,
) -> int:
    """Serve the decision inbox on 127.0.0.1: waiting approvals and unknown outcomes with
    buttons, the runs, each run's timeline and audit trail; live, as your kubeconfig user."""
    if not 0 <= port <= 65535:
        raise InputError("--port", f"{port} is not a port (0 to 65535)")
    from keelgate.cli.plugin.ui.server import InboxServer
    from keelgate.cli.plugin.ui.views import Views

    flags = _flags(ctx, kubeconfig, context, namespace)
    views = Views(resolve(flags.kubeconfig, flags.context, flags.namespace), store=store)
    user = views.user()  # asks the API server now: a bad context fails here, in one line
    try:
        server = InboxServer(port, views)
    except OSError as error:
        raise InputError("--port", f"127.0.0.1:{port} cannot be used: {error.strerror}") from None
    server.watches.start()
    print(f"Keelgate inbox for {user} ({views.target.where}): {server.url}", flush=True)
    print("Open it in a browser on this machine; Ctrl-C stops it.", flush=True)
    # Ctrl-C stops it even when started from a script's background job, where the shell hands
    # it SIGINT ignored (Python then keeps it ignored); SIGTERM stops it the same way.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
    try:
        server.serve_forever(poll_interval=0.25)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    print("stopped", flush=True)
    return 0
