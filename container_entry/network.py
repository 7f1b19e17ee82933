"""Wait, bounded, until every peer host name resolves: on SageMaker DNS may lag the start."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence

from container_entry.errors import NetworkError
from container_entry.logs import log


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
    except OSError:
        return False
    return True


def wait_for_hosts(
    hosts: Sequence[str],
    timeout: float,
    *,
    resolves: Callable[[str], bool] = _resolves,
    interval: float = 1.0,
) -> None:
    deadline = time.monotonic() + timeout
    pending = list(hosts)
    announced = False
    while True:
        pending = [host for host in pending if not resolves(host)]
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise NetworkError(
                f"host {pending[0]!r} did not resolve within {timeout:g} s "
                f"(unresolved: {', '.join(pending)})"
            )
        if not announced:
            log(f"waiting for host names to resolve: {', '.join(pending)}")
            announced = True
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
