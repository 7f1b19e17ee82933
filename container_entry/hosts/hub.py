"""The master's sockets, served from one thread (a selector loop), so its cost stays flat in
the number of hosts: the listening socket, a wake-up pair other threads poke, and one
connection per peer with its queue of bytes to send, flushed as the socket takes them, so a
host that stops reading can never block the loop."""

from __future__ import annotations

import contextlib
import selectors
import socket
from collections.abc import Callable, Mapping
from typing import Any

from container_entry.common.errors import NetworkError
from container_entry.hosts.liveness import detail, tune
from container_entry.hosts.peer import Peer
from container_entry.hosts.wire import encode

MAX_PENDING = 1 << 20  # bytes queued for a peer that stopped reading; beats are dropped then
ACCEPT, WAKE = "accept", "wake"  # what a ready key that is no peer's stands for


class Hub:
    """The sockets, for the loop thread alone (but `wake`). An error writing to a peer or
    reading from it goes to `gone` with its detail."""

    def __init__(
        self, port: int, backlog: int, liveness_timeout: float, gone: Callable[[Peer, str], None]
    ) -> None:
        self.liveness_timeout = liveness_timeout
        self.gone = gone
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # a previous run's connections in TIME_WAIT must not make the port look busy
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.server.bind(("0.0.0.0", port))
        except OSError as error:
            self.server.close()
            raise NetworkError(
                f"coordination port {port} on the master host is in use ({error.strerror}): "
                "set CONTAINER_ENTRY_MASTER_PORT to a free port (this uses it + 1)"
            ) from None
        self.server.listen(backlog)
        self.server.setblocking(False)
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.server, selectors.EVENT_READ, ACCEPT)
        self.selector.register(self._wake_read, selectors.EVENT_READ, WAKE)

    def select(self, timeout: float) -> list[tuple[Any, int]]:
        """(a Peer, ACCEPT or WAKE; its events) for what is ready within `timeout`."""
        return [(key.data, mask) for key, mask in self.selector.select(timeout)]

    def peers(self) -> list[Peer]:
        return [k.data for k in list(self.selector.get_map().values()) if isinstance(k.data, Peer)]

    def accept(self, now: float) -> list[Peer]:
        """Every connection waiting to be accepted, each a new peer."""
        peers: list[Peer] = []
        while True:
            try:
                connection, address = self.server.accept()
            except OSError:  # BlockingIOError: none left
                return peers
            with contextlib.suppress(OSError):
                tune(connection, self.liveness_timeout)
            connection.setblocking(False)
            peer = Peer(connection, address, now)
            self.selector.register(connection, selectors.EVENT_READ, peer)
            peers.append(peer)

    def receive(self, peer: Peer) -> bytes | None:
        """What arrived from a peer; None when nothing did, or it ended (then `gone`)."""
        try:
            chunk = peer.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as error:
            self.gone(peer, detail(error, self.liveness_timeout))
            return None
        if not chunk:
            self.gone(peer, "closed")
            return None
        return chunk

    def send(self, peer: Peer, message: Mapping[str, Any]) -> None:
        self.queue(peer, encode(message))

    def queue(self, peer: Peer, data: bytes) -> None:
        if not peer.open or len(peer.outbox) > MAX_PENDING:
            return
        peer.outbox += data
        self.flush(peer)

    def flush(self, peer: Peer) -> None:
        """Send what the socket takes; watch for room for the rest."""
        try:
            sent = peer.sock.send(peer.outbox)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as error:
            self.gone(peer, detail(error, self.liveness_timeout))
            return
        del peer.outbox[:sent]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if peer.outbox else 0)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.modify(peer.sock, events, peer)

    def drop(self, peer: Peer) -> None:
        if not peer.open:
            return
        peer.open = False
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(peer.sock)
        with contextlib.suppress(OSError):
            peer.sock.close()

    def wake(self) -> None:
        """From any thread: have the loop look at what was handed to it."""
        with contextlib.suppress(OSError):
            self._wake_write.send(b"\0")

    def woken(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_read.recv(4096)

    def shut(self) -> None:
        """The loop's end: every peer dropped, the listening socket closed."""
        for peer in self.peers():
            self.drop(peer)
        self.selector.close()
        with contextlib.suppress(OSError):
            self.server.close()

    def close_wake(self) -> None:
        """After the loop ended: the wake-up pair too."""
        for sock in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                sock.close()
