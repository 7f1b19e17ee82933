"""Stop signals in the bootstrap's own process: the handler only records the signal and writes
to the wakeup pipe (no lock, so a signal inside any wait can never deadlock), raises before the
workers start, and is harmless once they finished."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from container_entry.common import stopping
from container_entry.common.errors import StopRequested
from container_entry.common.stopping import STOP_SIGNALS, Stop


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
    stop.wait(60)
    assert time.monotonic() - started < 30 and stop.signal == "SIGINT"  # not the 60 s


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
    try:  # counted waits, not a window a busy machine can spend elsewhere
        waits = 0
        deadline = time.monotonic() + 60
        while waits < 200 and time.monotonic() < deadline:
            stop.wait(0.005)
            waits += 1
    finally:
        done.set()
        sender.join()
    assert waits == 200 and stop.signal == "SIGTERM"


def test_a_child_exit_ends_the_wait(stop):
    stop.raising = False
    with stop.wakes_on_child_exit():
        child = subprocess.Popen(["sleep", "0.2"])
        started = time.monotonic()
        stop.wait(60)
        child.wait()
    assert time.monotonic() - started < 30 and stop.signal is None  # not the 60 s


def test_a_stop_after_the_workers_finished_only_says_so(stop, capfd):
    stop.after_workers()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)
    assert "received SIGTERM after the workers finished: finishing up" in capfd.readouterr().err


@pytest.fixture
def restored():
    """The stop signals' handlers as they were, whatever a test installs."""
    previous = {sig: signal.getsignal(sig) for sig in (*STOP_SIGNALS, signal.SIGCHLD)}
    yield
    for sig, old in previous.items():
        signal.signal(sig, old)
    stopping._Early.clear()
    stopping._early_previous.clear()


@pytest.mark.parametrize(("name", "code"), [("SIGINT", 130), ("SIGTERM", 143), ("SIGHUP", 129)])
def test_a_stop_before_the_handler_is_noted_and_raised_once_it_is_installed(restored, name, code):
    """The first moments of `container-entry train`: cli calls record_early before any import;
    a signal then (SIGINT was a KeyboardInterrupt traceback) is only noted, and becomes the
    stopped job once Stop takes over: 128+N, never a traceback."""
    stopping.record_early()
    os.kill(os.getpid(), getattr(signal, name))
    time.sleep(0.01)  # an import in progress: nothing raised
    stop = Stop()
    stop.install()
    assert stop.signal == name and stop.at is not None
    with pytest.raises(StopRequested) as raised:
        stop.check()
    assert raised.value.exit_code == code
    assert str(raised.value) == f"stopped by {name} before the workers started"


def test_without_an_early_stop_install_and_check_change_nothing(restored):
    stopping.record_early()
    stop = Stop()
    stop.install()
    stop.check()
    assert stop.signal is None
    assert signal.getsignal(signal.SIGTERM) == stop._handle


def test_a_command_that_does_not_train_gets_the_signals_back_and_a_noted_one_again(restored):
    # the handlers of a Python started in the foreground (one started in the background of a
    # non-interactive shell inherits SIGINT ignored and keeps it so)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    stopping.record_early()
    os.kill(os.getpid(), signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):  # Python's own SIGINT handler, as before
        stopping.release_early()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    stopping.record_early()
    stopping.release_early()  # nothing noted: nothing delivered
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_stop_before_the_workers_start_exits_as_its_signal_would(stop):
    with pytest.raises(StopRequested) as raised:
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(5)
    assert raised.value.exit_code == 129 and stop.signal == "SIGHUP"


# Run in a fresh Python: every step (each line, each call into C) of record_early is checked.
_EVERY_STEP_OF_RECORD_EARLY = r"""
import signal, sys
from container_entry.common import stopping

bad = []

def check(frame, event, arg):
    ours = {sig for sig in stopping.STOP_SIGNALS if signal.getsignal(sig) is stopping._note_early}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    exposed = [s.name for s in stopping.STOP_SIGNALS if s not in ours and s not in blocked]
    if ours and exposed:
        bad.append(f"line {frame.f_lineno} {event}: {exposed} neither caught nor blocked")
    return check

# as started by `env --block-signal=INT,TERM,HUP` or with nothing blocked
how = signal.SIG_BLOCK if sys.argv[1:] == ["blocked"] else signal.SIG_UNBLOCK
signal.pthread_sigmask(how, stopping.STOP_SIGNALS)
sys.setprofile(check)
sys.settrace(check)
stopping.record_early()
sys.settrace(None)
sys.setprofile(None)
assert all(signal.getsignal(s) is stopping._note_early for s in stopping.STOP_SIGNALS)
assert not set(stopping.STOP_SIGNALS) & signal.pthread_sigmask(signal.SIG_BLOCK, [])
print("\n".join(bad) or "ok")
"""


@pytest.mark.parametrize("blocked_at_exec", [False, True])
def test_once_one_stop_signal_is_caught_every_stop_signal_is_caught_or_blocked(blocked_at_exec):
    """The first-line guarantee holds at every step of record_early, not only at its end: from
    outside, the bootstrap's first line is the moment a stop signal is caught (SIGTERM in
    /proc's SigCgt), and a sibling sent then must not find Python's KeyboardInterrupt or the
    default action. Installed one by one without a block, a SIGINT right after SIGTERM's
    handler went in was a KeyboardInterrupt traceback (seen under load in CI)."""
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _EVERY_STEP_OF_RECORD_EARLY,
            "blocked" if blocked_at_exec else "open",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok", result.stdout
