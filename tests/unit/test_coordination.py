"""The hosts' side channel over real loopback sockets (no processes, no torch)."""

import socket
import threading
import time

import pytest

from container_entry.coordination import Coordinator, Member
from container_entry.errors import NetworkError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_failure_is_relayed_and_the_master_stops_waiting_once_peers_leave():
    port = free_port()
    coordinator = Coordinator(("algo-1", "algo-2"), port)
    one, two = Member("algo-1", "127.0.0.1", port), Member("algo-2", "127.0.0.1", port)
    joining = threading.Thread(target=two.join, args=(10,))
    joining.start()
    one.join(10)
    joining.join()
    two.post_failure({"host": "algo-2", "rank": 3, "returncode": 1})
    assert one.aborted.wait(5) and one.abort["rank"] == 3
    two.close()
    one.close()
    started = time.monotonic()
    coordinator.wait_finished(5.0)
    assert time.monotonic() - started < 2.0  # every host closed its channel: no fixed wait
    coordinator.close()


def test_a_host_that_never_joins_is_named():
    port = free_port()
    coordinator = Coordinator(("algo-1", "algo-2"), port)
    member = Member("algo-1", "127.0.0.1", port)
    with pytest.raises(NetworkError, match="not every host joined the job within 1 s"):
        member.join(1.0)
    assert coordinator.missing() == ["algo-2"]
    member.close()
    coordinator.close()
