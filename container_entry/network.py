"""Wait, bounded, until the host names this host needs resolve: on SageMaker DNS may lag the
start. Names resolve in parallel (a bounded number of threads), and the deadline holds inside a
pass: a resolver that hangs cannot hold the bootstrap past its timeout."""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from container_entry.errors import NetworkError
from container_entry.logs import log

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
    ready: deque[str] = deque(pending)  # names to look up now
    later: list[tuple[float, str]] = []  # (when, name): failed, to retry
    failures = dict.fromkeys(pending, 0)  # failed lookups per name
    cond = threading.Condition()
    over = False

    def work() -> None:
        while True:
            with cond:
                while not ready and not over:
                    cond.wait()
                if over:
                    return
                name = ready.popleft()
            try:
                ok = resolves(name)
            except Exception:  # an injected resolver's bug is a name that did not resolve
                ok = False
            with cond:
                if ok:
                    pending.pop(name, None)
                else:
                    later.append((time.monotonic() + backoff(failures[name], interval), name))
                    failures[name] += 1
                cond.notify_all()

    for index in range(max(1, min(parallel, len(pending)))):
        threading.Thread(target=work, daemon=True, name=f"resolve-{index}").start()
    announced = time.monotonic() + min(interval, 1.0)
    try:
        with cond:
            while pending:
                now = time.monotonic()
                if now >= deadline:
                    break
                due = [entry for entry in later if entry[0] <= now]
                for entry in due:
                    later.remove(entry)
                    ready.append(entry[1])
                if due:
                    cond.notify_all()
                if announced is not None and now >= announced:
                    log(f"waiting for host names to resolve: {_names(list(pending))}")
                    announced = None
                wake = min([deadline, *(when for when, _ in later)])
                if announced is not None:
                    wake = min(wake, announced)
                cond.wait(max(0.0, wake - now))
            unresolved = list(pending)
    finally:
        with cond:
            over = True
            cond.notify_all()
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
