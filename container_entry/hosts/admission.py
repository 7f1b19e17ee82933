"""Who becomes a host of the job at the master. The master listens on every interface, so
anything in the job's subnets can connect: every new connection is challenged at once
(`handshake.hello`), and admitted only with a proven join, for a host of the job not yet
joined, from an address that host's name resolves to. Until then nothing it says is acted on
(a proven join's messages are held until its address is checked), and one that has not joined
within `AUTH_TIMEOUT` is dropped. A refused connection is closed and logged (one line naming
its address and why, rate-limited) without touching any other."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import time
from collections.abc import Callable, Iterable

from container_entry.hosts.handshake import hello, proven, welcome
from container_entry.hosts.hub import Hub
from container_entry.hosts.messages import REASON_CAP, Join, ToMaster
from container_entry.hosts.network import Lookups, backoff
from container_entry.hosts.peer import Peer, PeerState
from container_entry.hosts.quota import Quota
from container_entry.hosts.roster import Roster
from container_entry.hosts.wire import MessageKind, encode

AUTH_TIMEOUT = 5.0  # seconds a new connection has to send a proven join
ADDRESS_WAIT = 30.0  # seconds a proven join may wait for its host name to resolve (retried)
MAX_UNJOINED = 128  # connections still to join at once; the oldest goes first
HELD = 32  # messages a proven host may send while its address is checked
LINGER = 2.0  # seconds a refused join is read (and ignored) until it closes


class Admission:
    """The master's gate, on its loop thread. `admitted` is told of each host let in (after
    its welcome); `refused` keeps the latest 100 refusals, (peer address, why)."""

    def __init__(
        self,
        roster: Roster,
        key: bytes,
        hub: Hub,
        quota: Quota,
        admitted: Callable[[Peer], None],
        *,
        resolve: Callable[[str], Iterable[str]] | None,
        auth_timeout: float,
        address_wait: float,
    ) -> None:
        self.roster, self.key, self.hub, self.quota = roster, key, hub, quota
        self.admitted = admitted
        self.auth_timeout = auth_timeout
        self.address_wait = address_wait
        self.refused: list[tuple[str, str]] = []
        self._unjoined: dict[Peer, None] = {}  # connections yet to join, oldest first
        self._lingering: dict[Peer, None] = {}  # refused joins, read until they close
        self._looking_up: set[str] = set()
        self._found: list[tuple[str, frozenset[str], str | None]] = []  # lookups' results
        self._lookups = Lookups(resolve, self._deliver) if resolve else None

    def greet(self, peer: Peer) -> None:
        """A new connection: its challenge; the oldest stranger goes when too many wait."""
        self._unjoined[peer] = None
        self.hub.send(peer, hello(peer.nonce))
        waiting = [p for p in self._unjoined if p.state is PeerState.NEW]
        if len(waiting) > MAX_UNJOINED:
            self.refuse(waiting[0], "too many connections waiting to join")

    def receive(self, peer: Peer, message: ToMaster) -> None:
        """A message from a connection not yet a host: a new one's join (nothing else gets
        here), a proven one's messages held; a refused one's ignored."""
        if peer.state is PeerState.NEW and message["type"] == MessageKind.JOIN:
            self._join(peer, message)
        elif peer.state is PeerState.CHECKING:
            if message["type"] == MessageKind.BEAT:
                peer.held = [m for m in peer.held if m["type"] != MessageKind.BEAT]
            if message["type"] != MessageKind.JOIN and len(peer.held) < HELD:
                peer.held.append(message)

    def _join(self, peer: Peer, join: Join) -> None:
        host = join["host"]
        if host not in self.roster.hosts:
            self.refuse(
                peer, "not a host of this job: unknown host name", f" {host[:60]!r}", linger=True
            )
            return
        if not proven(self.key, peer.nonce, join):
            self.refuse(peer, "not a host of this job: bad proof", f", claims {host}", linger=True)
            return
        if self.roster.has_joined(host):
            self.refuse(peer, f"{host} already joined", linger=True)
            return
        peer.host = host
        peer.member_nonce = join["nonce"]
        peer.machine = join["machine"]
        peer.workers = join["workers"]
        peer.state = PeerState.CHECKING
        if self._lookups is None:
            self._admit(peer)
        else:
            self._look_up(host)

    def _admit(self, peer: Peer) -> None:
        host = peer.host
        assert host is not None
        if self.roster.has_joined(host):
            self.refuse(peer, f"{host} already joined", linger=True)
            return
        peer.state = PeerState.JOINED
        self._unjoined.pop(peer, None)
        self.hub.send(peer, welcome(self.key, peer.nonce, peer.member_nonce, host))
        self.admitted(peer)

    def refuse(self, peer: Peer, why: str, detail: str = "", *, linger: bool = False) -> None:
        """Close a connection that is not (yet) a host of the job, telling it and the log why;
        nothing else changes. A well-formed join refused (a host with another key, from an
        unexpected address) lingers up to `LINGER` s, reading and discarding, so the refusal
        reaches it: a close with its beats unread would reset the connection, and the reset
        would take the refusal with it."""
        self.quota.log(f"refused {peer.address} ({why}{detail})")
        self.refused = [*self.refused[-99:], (peer.address, why + detail)]
        if peer.open and not peer.outbox:  # never half a line after another
            with contextlib.suppress(OSError):
                peer.sock.send(encode({"type": MessageKind.REFUSED, "reason": why[:REASON_CAP]}))
                if linger and len(self._lingering) < MAX_UNJOINED:
                    peer.sock.shutdown(socket.SHUT_WR)
                    self._unjoined.pop(peer, None)
                    self._lingering[peer] = None
                    peer.state = PeerState.CLOSING
                    peer.since = time.monotonic()
                    return
        self.forget(peer)
        self.hub.drop(peer)

    def forget(self, peer: Peer) -> None:
        """A connection closed: no longer waiting to join or lingering."""
        self._unjoined.pop(peer, None)
        self._lingering.pop(peer, None)

    def expire(self, peer: Peer, now: float) -> None:
        """On the tick, for a new or refused connection: a stranger that did not join in
        time is refused; a refused one that lingered long enough is closed."""
        if peer.state is PeerState.CLOSING and now - peer.since > LINGER:
            self.forget(peer)
            self.hub.drop(peer)
        elif peer.state is PeerState.NEW and now - peer.since > self.auth_timeout:
            self.refuse(peer, f"did not join within {self.auth_timeout:g} s")

    # -- the address check ------------------------------------------------------------------
    def recheck(self, peer: Peer, now: float) -> None:
        """On the tick, for a proven join whose address is still unchecked: look its name up
        again when due; give up on a lookup that never ends."""
        host = peer.host or ""
        if peer.lookup_due is not None and now >= peer.lookup_due:
            peer.lookup_due = None
            self._look_up(host)
        elif host in self._looking_up and now - peer.since > self.address_wait + 5.0:
            self.refuse(
                peer,
                "not a host of this job: address unknown",
                f", claims {host}, whose lookup did not end within {self.address_wait:g} s",
                linger=True,
            )

    def _look_up(self, host: str) -> None:
        if self._lookups is not None and host not in self._looking_up:
            self._looking_up.add(host)
            self._lookups.submit(host)

    def _deliver(self, host: str, found: frozenset[str], error: str | None) -> None:
        """From a lookup thread: hand the result to the loop."""
        self._found.append((host, found, error))
        self.hub.wake()

    def woken(self) -> None:
        """On the loop thread, once woken: the lookups' results."""
        while self._found:
            self._looked_up(*self._found.pop(0))

    def _looked_up(self, host: str, found: frozenset[str], error: str | None) -> None:
        self._looking_up.discard(host)
        now = time.monotonic()
        for peer in [p for p in self._unjoined if p.state is PeerState.CHECKING and p.host == host]:
            if not peer.open:
                continue
            if address_matches(peer.ip, found):
                self._admit(peer)
            elif found:
                self.refuse(
                    peer,
                    "not a host of this job: address mismatch",
                    f", claims {host}, which resolves to {', '.join(sorted(found)[:4])}",
                    linger=True,
                )
            elif now - peer.since >= self.address_wait:
                self.refuse(
                    peer,
                    "not a host of this job: address unknown",
                    f", claims {host}, which did not resolve within {self.address_wait:g} s "
                    f"({error})",
                    linger=True,
                )
            else:  # DNS may lag at the start: ask again soon
                peer.lookup_due = now + backoff(peer.lookups, 1.0)
                peer.lookups += 1


def address_matches(address: str, resolved: Iterable[str]) -> bool:
    """Whether a peer's address is one its claimed host name resolves to. Loopback counts for
    loopback: a name that resolves to this machine (127.0.1.1, ::1) may connect from any
    loopback address, since only this machine can send from one."""
    try:
        peer = _ip(address)
    except ValueError:
        return False
    names = set()
    for item in resolved:
        with contextlib.suppress(ValueError):
            names.add(_ip(item))
    return peer in names or (peer.is_loopback and any(ip.is_loopback for ip in names))


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    ip = ipaddress.ip_address(text.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip
