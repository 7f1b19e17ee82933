"""One connection at the master, from its accept to its close."""

from __future__ import annotations

import enum
import socket
from typing import Any

from container_entry.hosts.keys import new_nonce
from container_entry.hosts.messages import ToMaster
from container_entry.hosts.wire import LINE_LIMIT, Lines


class PeerState(enum.Enum):
    NEW = "new"  # challenged; nothing it says counts but a join
    CHECKING = "checking"  # proven; its address is being checked, what it says is held
    JOINED = "joined"  # a host of the job
    CLOSING = "closing"  # refused: read (and ignored) until it closes


class Peer:
    """A connection at the master: a stranger until it joined with a good proof from an
    address of the host it names. Its state changes on the loop thread only."""

    def __init__(self, sock: socket.socket, address: tuple[Any, ...], now: float) -> None:
        self.sock = sock
        self.ip = str(address[0])
        self.address = f"{address[0]}:{address[1]}"
        self.state = PeerState.NEW
        self.open = True
        self.lines = Lines(LINE_LIMIT)
        self.outbox = bytearray()  # bytes the socket did not take yet
        self.since = now  # accepted (or refused, while it lingers)
        self.heard = now  # the last time anything arrived
        # the handshake
        self.nonce = new_nonce()  # the master's challenge to it
        self.member_nonce = ""  # its challenge to the master
        self.held: list[ToMaster] = []  # what it said while its address was checked
        self.lookup_due: float | None = None  # when to look its name up again
        self.lookups = 0
        # the host, once it joined
        self.host: str | None = None
        self.machine: str | None = None  # its kernel's boot id, as it said at the join
        self.workers = 0
        self.said_done = False
        self.posted = False  # it posted a failure: its leaving is no news
        self.settled = False  # it posted every failure of its own that may be the job's first
        self.idle: float | None = None  # its ranks' silence at its last beat; None: no job yet
        # the master's clock minus the host's, plus the beat's way here: the smallest seen
        self.skew: float | None = None

    @property
    def name(self) -> str:
        return f"{self.host} ({self.address})" if self.host else self.address
