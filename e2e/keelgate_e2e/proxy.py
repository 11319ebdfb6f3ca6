"""A loopback TCP proxy the e2e tests put between one cluster's step pods and PostgreSQL, to cut
them off from the store and let them through again: a network partition made real.

Why it exists: a partition is neither a crash nor a refusal. While the proxy is paused it keeps
every connection open (the server's keepalives are answered by this host's kernel, so no session
ends) and forwards nothing either way: a statement a pod sends meanwhile waits, unanswered, as
it would behind a cut link; resumed, the held bytes go on in order, as a healed link delivers
them. It must never listen on anything but 127.0.0.1, never drop or reorder a byte, and never
outlive `stop`.
"""

from __future__ import annotations

import socket
import threading
from contextlib import suppress

from keelgate_e2e.procs import LOOPBACK


class PausableProxy:
    """127.0.0.1:`port` forwarding to 127.0.0.1:`target`; `pause` holds every byte until
    `resume`."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._open = threading.Event()
        self._open.set()
        self._stopping = threading.Event()
        self._listener = socket.create_server((LOOPBACK, 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.connections = 0

    def start(self) -> PausableProxy:
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()
        return self

    def pause(self) -> None:
        """Forward nothing from now on (connections stay open)."""
        self._open.clear()

    def resume(self) -> None:
        """Forward again, the held bytes first."""
        self._open.set()

    def stop(self) -> None:
        self._stopping.set()
        self._open.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with suppress(OSError):
                    sock.close()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # stopped
            try:
                server = socket.create_connection((LOOPBACK, self.target), timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
                self.connections += 1
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                self._open.wait()  # paused: held here, in order, until resumed
                if self._stopping.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
