"""Host names: wait, bounded, until those this host needs resolve (on SageMaker DNS may lag the
start), and look them up for the master's address check (admission.py): one pool of lookups on
daemon threads for both (`Lookups`), so a resolver that hangs never holds the bootstrap or the
side channel's loop past its own deadline."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from container_entry.common.errors import NetworkError
from container_entry.common.logs import log

PARALLEL = 32  # resolver threads at most, whatever the number of names
LOOKUPS = 8  # the master's address check: name lookups at once
FIRST_RETRY = 0.05  # seconds before the first retry; doubled for each next one (backoff)
_LISTED = 8  # names an error or a log line lists before "and N more"


def name_resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
    except OSError:
        return False
    return True


def addresses(host: str) -> frozenset[str]:
    """Every address `host` resolves to (all families); OSError when it does not resolve."""
    return frozenset(str(info[4][0]) for info in socket.getaddrinfo(host, None))


def backoff(attempt: int, cap: float, first: float = FIRST_RETRY) -> float:
    """Seconds before retry number `attempt` (0 for the first): `first`, doubled each time, at
    most `cap`. A name or port that appears a moment after the first try (hosts start within
    a second of each other) is found at once, not a whole retry interval later; a peer that
    takes longer is asked at the `cap` rate."""
    return min(cap, first * 2 ** min(attempt, 30))


def _names(hosts: Sequence[str]) -> str:
    shown = ", ".join(hosts[:_LISTED])
    more = len(hosts) - _LISTED
    return f"{shown} and {more} more" if more > 0 else shown


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


def wait_for_hosts(
    hosts: Sequence[str],
    timeout: float,
    *,
    resolves: Callable[[str], bool] = name_resolves,
    interval: float = 1.0,
    parallel: int = PARALLEL,
) -> None:
    """Return once every name in `hosts` resolved; NetworkError naming the rest at `timeout`.

    Each name is tried by one of at most `parallel` daemon threads, again after each failure
    (`backoff`: from 50 ms up to `interval` seconds); a name never has two lookups at once.
    The deadline is the caller's, not a pass's: a lookup still running when it passes is
    abandoned (its thread is a daemon).
    """
    deadline = time.monotonic() + timeout
    pending = dict.fromkeys(hosts)  # ordered: errors name hosts in the caller's order
    if not pending:
        return
    cond = threading.Condition()
    failures = dict.fromkeys(pending, 0)  # failed lookups per name
    later: list[tuple[float, str]] = []  # (when, name): to look up again then
    over = False

    def deliver(host: str, found: frozenset[str], _error: str | None) -> None:
        with cond:
            if over:  # abandoned at the deadline: nobody waits for this name now
                return
            if found:
                pending.pop(host, None)
            else:
                later.append((time.monotonic() + backoff(failures[host], interval), host))
                failures[host] += 1
            cond.notify_all()

    lookups = Lookups(lambda host: {host} if resolves(host) else (), deliver, parallel)
    for host in list(pending):  # a lookup may end (and pop its name) before the next starts
        lookups.submit(host)
    announced: float | None = time.monotonic() + min(interval, 1.0)
    with cond:
        while pending and (now := time.monotonic()) < deadline:
            for entry in [entry for entry in later if entry[0] <= now]:  # retries now due
                later.remove(entry)
                lookups.submit(entry[1])
            if announced is not None and now >= announced:
                log(f"waiting for host names to resolve: {_names(list(pending))}")
                announced = None
            wake = min(
                [deadline, *(when for when, _ in later), *([announced] if announced else [])]
            )
            cond.wait(max(0.0, wake - now))
        unresolved, over = list(pending), True
    if unresolved:
        raise NetworkError(
            f"host {unresolved[0]!r} did not resolve within {timeout:g} s "
            f"(unresolved: {_names(unresolved)})"
        )


def check_port_free(port: int, what: str) -> None:
    """Fail early, naming the port, where a listener already holds it on this host."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # SO_REUSEADDR as torch's TCPStore: only a live listener counts as "in use"
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as error:
            raise NetworkError(
                f"{what} port {port} is in use on this host ({error.strerror}): "
                "set CONTAINER_ENTRY_MASTER_PORT to a free port"
            ) from None
