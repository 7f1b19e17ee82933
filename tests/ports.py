"""Ports for the jobs the tests start on this machine (one home for them).

Tests run concurrently (pytest-xdist, `make test`): two jobs on one port would meet in one
store, or one would fail to bind. Each xdist worker takes ports from its own range, below the
kernel's ephemeral range (32768 up, where connections take their local ports), and skips a
port that something holds. A job uses its port (torchrun's store) and the next one (the side
channel), so ports are handed out in steps of `STEP`.
"""

from __future__ import annotations

import os
import socket

FIRST = 20000
LAST = 32000  # below the ephemeral range
STEP = 4  # a job's store port, its side channel, and room
WORKERS = 8  # ranges the span is cut into (more xdist workers share them round robin)

_SPAN = (LAST - FIRST) // WORKERS
_offset = 0


def _worker() -> int:
    """0 for gw0 (or no xdist), 1 for gw1, ..."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name[2:]) % WORKERS if name[2:].isdigit() else 0


def _free(port: int) -> bool:
    for address in ("127.0.0.1", "0.0.0.0"):
        with socket.socket() as probe:
            try:
                probe.bind((address, port))
            except OSError:
                return False
    return True


def job_port() -> int:
    """A port whose next STEP - 1 neighbours are free too, never handed out twice in a row by
    this worker (a finished job's sockets may linger in TIME_WAIT)."""
    global _offset
    start = FIRST + _worker() * _SPAN
    for _ in range(_SPAN // STEP):
        port = start + _offset
        _offset = (_offset + STEP) % (_SPAN - STEP)
        if all(_free(port + i) for i in range(STEP)):
            return port
    raise RuntimeError(f"no free ports in {start}-{start + _SPAN}")


_this_test: int | None = None


def new_test() -> None:
    """A test begins (tests/conftest.py): its jobs that name no port get a new one."""
    global _this_test
    _this_test = None


def this_test_port() -> int:
    """The port of this test's jobs that name none (every host of a job takes the same)."""
    global _this_test
    if _this_test is None:
        _this_test = job_port()
    return _this_test
