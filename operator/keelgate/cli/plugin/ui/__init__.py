"""``kubectl keelgate ui``: the decision inbox, a web view for the people who decide.

Why it exists: the person who approves a payment or settles an unknown outcome is often not a
kubectl user. This command serves, on 127.0.0.1, an inbox of every waiting decision the user can
see, the runs, and each run's timeline and verified audit trail, acting as the kubeconfig
context's user (``server``). It prints a sign-in address (it works once; once it is used the
next is printed) and opens nothing by itself; Ctrl-C stops it. Sessions end after
``--session-idle`` without a page read or decision and ``--session-lifetime`` after sign-in.

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
    duration,
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
    session_idle: Annotated[
        str,
        typer.Option(
            "--session-idle",
            help="A session ends after this long without a page read or a decision (30s, 5m, 2h).",
        ),
    ] = "1h",
    session_lifetime: Annotated[
        str,
        typer.Option(
            "--session-lifetime",
            help="A session ends this long after its sign-in, whatever happens (30s, 5m, 2h).",
        ),
    ] = "12h",
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    namespace: NamespaceOption = None,
) -> int:
    """Serve the decision inbox on 127.0.0.1: waiting approvals and unknown outcomes with
    buttons, the runs, each run's timeline and audit trail; live, as your kubeconfig user."""
    if not 0 <= port <= 65535:
        raise InputError("--port", f"{port} is not a port (0 to 65535)")
    idle = duration("--session-idle", session_idle)
    lifetime = duration("--session-lifetime", session_lifetime)
    from keelgate.cli.plugin.ui.server import InboxServer
    from keelgate.cli.plugin.ui.views import Views

    flags = _flags(ctx, kubeconfig, context, namespace)
    views = Views(resolve(flags.kubeconfig, flags.context, flags.namespace), store=store)
    user = views.user()  # asks the API server now: a bad context fails here, in one line
    try:
        server = InboxServer(port, views, idle=idle, lifetime=lifetime, signed_in=_next_address)
    except OSError as error:
        raise InputError("--port", f"127.0.0.1:{port} cannot be used: {error.strerror}") from None
    server.watches.start()
    print(f"Keelgate inbox for {user} ({views.target.where}): {server.url}", flush=True)
    print("Open it in a browser on this machine (it works once); Ctrl-C stops it.", flush=True)
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


def _next_address(url: str) -> None:
    """A sign-in address was used: the next one, for another browser or a session that ended."""
    print(f"Signed in. The next sign-in address (it works once): {url}", flush=True)
