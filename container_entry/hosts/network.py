"""Wait, bounded, until the host names this host needs resolve: on SageMaker DNS may lag the
start. Names resolve in parallel (a bounded number of threads), and the deadline holds inside a
pass: a resolver that hangs cannot hold the bootstrap past its timeout."""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from container_entry.common.errors import NetworkError
from container_entry.common.logs import log

PARALLEL = 32  # resolver threads at most, whatever the number of names
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


class _Lookups:
    """The names `wait_for_hosts` still waits for, shared with its resolver threads under one
    condition: each name is in `ready` (to look up now), in a thread's hands, or in `later`
    (failed, to retry at a time), never in two of them."""

    def __init__(self, hosts: Sequence[str], resolves: Callable[[str], bool], interval: float):
        self.pending = dict.fromkeys(hosts)  # ordered: errors name hosts in the caller's order
        self.ready: deque[str] = deque(self.pending)
        self.later: list[tuple[float, str]] = []  # (when, name)
        self.failures = dict.fromkeys(self.pending, 0)  # failed lookups per name
        self.resolves, self.interval = resolves, interval
        self.cond = threading.Condition()
        self.over = False

    def work(self) -> None:
        """One resolver thread: look up the next ready name until the wait is over."""
        while True:
            with self.cond:
                while not self.ready and not self.over:
                    self.cond.wait()
                if self.over:
                    return
                name = self.ready.popleft()
            try:
                ok = self.resolves(name)
            except Exception:  # an injected resolver's bug is a name that did not resolve
                ok = False
            with self.cond:
                if self.over:  # abandoned at the deadline: nobody waits for this name now
                    return
                if ok:
                    self.pending.pop(name, None)
                else:
                    retry = time.monotonic() + backoff(self.failures[name], self.interval)
                    self.later.append((retry, name))
                    self.failures[name] += 1
                self.cond.notify_all()

    def requeue(self, now: float) -> None:
        """Names whose retry is due go back to `ready` (the condition held)."""
        due = [entry for entry in self.later if entry[0] <= now]
        for entry in due:
            self.later.remove(entry)
            self.ready.append(entry[1])
        if due:
            self.cond.notify_all()

    def wait(self, deadline: float) -> list[str]:
        """Until every name resolved or `deadline`: the names left, in the caller's order."""
        announced: float | None = time.monotonic() + min(self.interval, 1.0)
        with self.cond:
            while self.pending:
                now = time.monotonic()
                if now >= deadline:
                    break
                self.requeue(now)
                if announced is not None and now >= announced:
                    log(f"waiting for host names to resolve: {_names(list(self.pending))}")
                    announced = None
                wake = min([deadline, *(when for when, _ in self.later)])
                if announced is not None:
                    wake = min(wake, announced)
                self.cond.wait(max(0.0, wake - now))
            return list(self.pending)

    def end(self) -> None:
        with self.cond:
            self.over = True
            self.cond.notify_all()


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
    lookups = _Lookups(hosts, resolves, interval)
    if not lookups.pending:
        return
    for index in range(max(1, min(parallel, len(lookups.pending)))):
        threading.Thread(target=lookups.work, daemon=True, name=f"resolve-{index}").start()
    try:
        unresolved = lookups.wait(deadline)
    finally:
        lookups.end()
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
