"""The master's address check: a join counts only from an address its claimed host name
resolves to. Names are looked up off the loop thread (a slow resolver never holds it), at most
`LOOKUPS` at once."""

from __future__ import annotations

import contextlib
import ipaddress
import threading
from collections import deque
from collections.abc import Callable, Iterable

LOOKUPS = 8  # name lookups at once


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


# a lookup's result: the host, the addresses found (none: it did not resolve), and why not
Found = Callable[[str, frozenset[str], str | None], None]


class Lookups:
    """Host-name lookups on daemon threads, at most `parallel` at once, that end when nothing
    is left to look up; each result goes to `deliver` (on the lookup's thread)."""

    def __init__(
        self, resolve: Callable[[str], Iterable[str]], deliver: Found, parallel: int = LOOKUPS
    ) -> None:
        self.resolve, self.deliver, self.parallel = resolve, deliver, parallel
        self.queue: deque[str] = deque()
        self.lock = threading.Lock()
        self.running = 0

    def submit(self, host: str) -> None:
        with self.lock:
            self.queue.append(host)
            if self.running >= self.parallel:
                return
            self.running += 1
        threading.Thread(target=self._work, daemon=True, name="side-channel-lookup").start()

    def _work(self) -> None:
        while True:
            with self.lock:
                if not self.queue:
                    self.running -= 1
                    return
                host = self.queue.popleft()
            try:
                found, error = frozenset(self.resolve(host)), None
            except Exception as failure:  # a name that does not resolve (yet)
                found, error = frozenset(), str(failure) or type(failure).__name__
            with contextlib.suppress(Exception):
                self.deliver(host, found, error)
