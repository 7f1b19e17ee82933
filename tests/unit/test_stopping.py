"""Stop signals in the bootstrap's own process: the handler only records the signal and writes
to the wakeup pipe (no lock, so a signal inside any wait can never deadlock), raises before the
workers start, and is harmless once they finished."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest

from container_entry.errors import StopRequested
from container_entry.stopping import STOP_SIGNALS, Stop


@pytest.fixture
def stop():
    previous = {sig: signal.getsignal(sig) for sig in (*STOP_SIGNALS, signal.SIGCHLD)}
    handler = Stop()
    handler.install()
    yield handler
    for sig, old in previous.items():
        signal.signal(sig, old)


def test_a_stop_before_the_workers_start_ends_whatever_the_bootstrap_is_doing(stop):
    with pytest.raises(StopRequested, match="stopped by SIGTERM before the workers started"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # a host wait, a join, a pip install
    assert stop.signal == "SIGTERM" and stop.at is not None


def test_a_stop_ends_the_monitor_s_wait_at_once(stop):
    stop.raising = False
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
    started = time.monotonic()
    stop.wait(10)
    assert time.monotonic() - started < 2 and stop.signal == "SIGINT"


def test_signals_arriving_inside_every_wait_never_deadlock(stop):
    """The old handler set the Event the main loop was waiting on: a signal inside that wait
    deadlocked. Hundreds of signals at random moments of the waits: the loop always goes on."""
    stop.raising = False
    done = threading.Event()

    def fire() -> None:
        while not done.is_set():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.001)

    sender = threading.Thread(target=fire)
    sender.start()
    try:
        waits = 0
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            stop.wait(0.005)
            waits += 1
    finally:
        done.set()
        sender.join()
    assert waits > 50 and stop.signal == "SIGTERM"


def test_a_child_exit_ends_the_wait(stop):
    stop.raising = False
    with stop.wakes_on_child_exit():
        child = subprocess.Popen(["sleep", "0.2"])
        started = time.monotonic()
        stop.wait(10)
        child.wait()
    assert time.monotonic() - started < 2 and stop.signal is None


def test_a_stop_after_the_workers_finished_only_says_so(stop, capfd):
    stop.after_workers()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)
    assert "received SIGTERM after the workers finished: finishing up" in capfd.readouterr().err
