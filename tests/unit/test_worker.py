"""The rank's wrapper (container_entry.worker, container_entry.rank) in pieces: how it notes a
stop, and that the names it hands the script's Python are the ones _site/sitecustomize.py reads.
The wrapper as torchrun runs it: tests/integration (test_relay, test_signals, test_faults)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from container_entry.common.layout import ControlDir
from container_entry.common.programs import SITE_DIR
from container_entry.common.stopping import STOP_SIGNALS, StopSignal
from container_entry.diagnose import flight_recorder
from container_entry.rank import wrapper
from container_entry.rank.signals import RankStop as Stop


@pytest.fixture
def handlers():
    """The stop signals' handlers as they were, back after the test."""
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_stop_noted_while_the_wrapper_loaded_is_the_first_and_later_ones_change_nothing(
    handlers,
):
    stop = Stop.noted({signal.SIGINT: 20.0, signal.SIGTERM: 10.0})
    assert (stop.name, stop.at) == ("SIGTERM", 10.0)
    assert all(signal.getsignal(sig) == stop.note for sig in STOP_SIGNALS)
    stop.note(signal.SIGHUP)
    assert (stop.name, stop.at, stop.signum) == ("SIGTERM", 10.0, signal.SIGTERM)


def test_a_signal_is_noted_once_with_its_time(handlers):
    stop = Stop.noted({})
    assert stop.name is None and not stop.requested(ControlDir(Path("/nonexistent")))
    signal.raise_signal(signal.SIGHUP)
    first = stop.at
    signal.raise_signal(signal.SIGINT)
    assert (stop.name, stop.at, stop.signum) == ("SIGHUP", first, signal.SIGHUP)


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_the_stop_file_is_the_stop_that_came_for_a_wrapper_torchrun_starts_after_it(tmp_path, name):
    """The bootstrap writes the stop, as it came, before it signals any worker: a wrapper that
    torchrun starts after it records that signal and moment, never one assumed."""
    control, stop = ControlDir(tmp_path), Stop()
    assert not stop.requested(control)
    control.stop.write_text(StopSignal(name, 7.5).text())
    assert stop.requested(control) and stop.came == StopSignal(name, 7.5)
    signalled = Stop(StopSignal("SIGHUP", 1.0))  # its own signal, noted first, stays
    assert signalled.requested(control) and signalled.came == StopSignal("SIGHUP", 1.0)
    control.stop.write_text("not a stop")  # nothing of ours writes it: a stop all the same
    unread = Stop()
    assert unread.requested(control) and unread.name == "SIGTERM" and unread.at is not None


def test_the_site_hook_reads_the_variables_the_wrapper_sets():
    site = (Path(SITE_DIR) / "sitecustomize.py").read_text()
    for name in (
        wrapper.STACKS_ENV,
        wrapper.END_GROUPS_ENV,
        wrapper.EXITING_ENV,
        flight_recorder.REQUEST_ENV,
        flight_recorder.FILE_ENV,
    ):
        assert f'os.environ.pop("{name}"' in site


@pytest.mark.parametrize(
    ("text", "at"),
    [
        ("1796478193.4523375", 1796478193.4523375),
        ("12", 12.0),
        ("", None),
        ("nan", None),
        ("inf", None),
        ("-inf", None),
        ("garbage", None),
        ("\xff", None),
        (None, None),  # no teardown began (off, or no process group): no file
    ],
)
def test_when_the_exit_teardown_began_is_read_or_unknown_never_an_error(tmp_path, text, at):
    path = tmp_path / "rank-0.exiting"
    if text is not None:
        path.write_bytes(text.encode("latin-1"))
    assert wrapper._exiting_at(path) == at
