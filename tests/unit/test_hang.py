"""The hang watchdog's parts: the idle clock from file times, the progress report, the
master's decision from every host's beats (real loopback sockets), the flight-recorder dump
request (a real named pipe), the setting and the failure file's first line. The whole watchdog
on real torchrun workers, one host and two: tests/integration/test_hang.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from container_entry.common.errors import ConfigError
from container_entry.common.exits import ExitCode
from container_entry.common.layout import RunDir
from container_entry.common.records import RankRecord
from container_entry.common.workers import childless
from container_entry.diagnose.failure import hung_words
from container_entry.diagnose.hang import (
    AUTO_FLOOR,
    PROGRESS_ENV,
    Activity,
    Silence,
    is_hang,
    report_progress,
)
from container_entry.hosts import Coordinator, Member
from container_entry.plan import settings
from tests.unit.test_coordination import FAST, free_port, join_all


def _age(path: Path, seconds: float, now: float | None = None) -> None:
    then = (time.time() if now is None else now) - seconds
    os.utime(path, (then, then))


@pytest.fixture
def clock(monkeypatch) -> float:
    """The idle clock's time stopped at one moment: the silences below are exact, however long
    a busy machine paused the test between two lines (a 1-s tolerance was the margin)."""
    from container_entry.diagnose import hang

    now = time.time()
    monkeypatch.setattr(hang, "time", types.SimpleNamespace(time=lambda: now))
    return now


def test_idle_is_the_silence_since_the_newest_rank_log_or_progress_report(tmp_path, clock):
    (tmp_path / "logs").mkdir()
    logs = [tmp_path / "logs" / f"rank-{n}.log" for n in range(3)]
    progress = tmp_path / "progress"
    activity = Activity(RunDir(tmp_path), str(progress))
    activity.since -= 100  # launched long ago
    assert activity.idle() == pytest.approx(100, abs=1e-3)  # no file yet: since the launch
    for age, path in zip((50, 30, 70), logs, strict=True):
        path.write_text("line\n")
        _age(path, age, clock)
    activity._checked = 0.0
    assert activity.idle() == pytest.approx(30, abs=1e-3)  # the newest line of any rank
    progress.touch()
    _age(progress, 5, clock)
    activity._checked = 0.0
    assert activity.idle() == pytest.approx(5, abs=1e-3)


def test_the_ranks_start_is_life_but_not_output(tmp_path, clock):
    """A fixed timeout does not count torchrun's own start-up as the script's silence: the
    ranks' pid files (written as each wrapper starts its script) count as life; they are no
    output for `auto`, which waits for a printed line."""
    (tmp_path / "logs").mkdir()
    control = tmp_path / "control"
    control.mkdir()
    activity = Activity(RunDir(tmp_path), None, lambda: sorted(control.glob("rank-*.pid")))
    activity.since -= 100  # torchrun took long to start the ranks
    assert activity.idle() == pytest.approx(100, abs=1e-3)
    (control / "rank-0.pid").write_text("{}")
    _age(control / "rank-0.pid", 20, clock)
    activity._checked = 0.0
    assert activity.idle() == pytest.approx(20, abs=1e-3)
    assert activity.idle_since_printing() is None  # started, not printed
    log = tmp_path / "logs" / "rank-0.log"
    log.write_text("line\n")
    _age(log, 30, clock)  # a line older than the start: the start is the newer sign of life
    activity._checked = 0.0
    assert activity.idle() == pytest.approx(20, abs=1e-3)
    assert activity.idle_since_printing() == pytest.approx(20, abs=1e-3)


def test_files_of_a_previous_run_do_not_count_before_the_launch(tmp_path, clock):
    (tmp_path / "logs").mkdir()
    stale = tmp_path / "logs" / "rank-0.log"
    stale.write_text("old\n")
    _age(stale, -3600, clock)  # even one from the future counts as no later than now
    activity = Activity(RunDir(tmp_path), None)
    assert activity.idle() == 0.0


def test_report_progress_touches_the_exported_file_and_is_a_no_op_elsewhere(tmp_path, monkeypatch):
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    report_progress()  # outside container-entry: nothing, no error
    target = tmp_path / "progress"
    monkeypatch.setenv(PROGRESS_ENV, str(target))
    report_progress()
    assert target.exists()
    _age(target, 100)
    report_progress()
    assert time.time() - target.stat().st_mtime < 50  # touched now: not the 100 s of before
    monkeypatch.setenv(PROGRESS_ENV, str(tmp_path / "no-such-dir" / "progress"))
    report_progress()  # unwritable: the script goes on


def _hang_cluster(idles: list[float | None], timeout: float) -> tuple[Coordinator, list[Member]]:
    port = free_port()
    coordinator = Coordinator(["algo-1", "algo-2"], port, hang_timeout=timeout, **FAST)
    members = [Member(h, "127.0.0.1", port, **FAST) for h in ("algo-1", "algo-2")]
    join_all(members)
    for m, idle in zip(members, idles, strict=True):
        m.idle = (lambda value=idle: value) if idle is not None else None
    return coordinator, members


@pytest.mark.parametrize(
    ("idles", "hung"),
    [
        ([9.0, 9.0], True),  # every host silent for longer than the timeout
        ([9.0, 1.0], False),  # one host's ranks still print: not a hang
        ([9.0, None], False),  # a host not running its job yet (preparing, preflight)
        ([0.0, 0.0], False),
    ],
)
def test_the_master_declares_a_hang_only_when_every_host_is_silent(idles, hung):
    coordinator, members = _hang_cluster(idles, timeout=5.0)
    try:
        # a hang is waited for as long as a busy machine needs; no hang is watched for 2 s
        deadline = time.monotonic() + (30.0 if hung else 2.0)
        while time.monotonic() < deadline and not all(m.aborted.is_set() for m in members):
            time.sleep(0.05)
        if hung:
            for m in members:  # the master's own bootstrap hears it too
                assert is_hang(m.abort)
                assert m.abort.what == "hung: no output from any rank on any host for 5 s"
                assert m.abort.returncode == ExitCode.HUNG
        else:  # no hang declared (a thread starved past the 1-s liveness is another story)
            assert not any(m.aborted.is_set() and is_hang(m.abort) for m in members)
    finally:
        for m in members:
            m.close()
        coordinator.close()


def test_a_host_that_finished_is_no_evidence_of_life():
    coordinator, members = _hang_cluster([0.0, 9.0], timeout=5.0)
    try:
        members[0].done()  # algo-1's ranks all exited 0; algo-2's went silent
        deadline = time.monotonic() + 30.0  # as long as a busy machine needs
        while time.monotonic() < deadline and not members[1].aborted.is_set():
            time.sleep(0.05)
        assert is_hang(members[1].abort)
    finally:
        for m in members:
            m.close()
        coordinator.close()


def test_off_by_default_whatever_the_silence():
    port = free_port()
    coordinator = Coordinator(["algo-1"], port, **FAST)
    m = Member("algo-1", "127.0.0.1", port, **FAST)
    join_all([m])
    m.idle = lambda: 1e9
    time.sleep(0.5)
    try:
        assert not m.aborted.is_set()
    finally:
        m.close()
        coordinator.close()


@pytest.mark.parametrize("raw", ["-1", "nan", "inf", "soon"])
def test_a_bad_hang_timeout_is_one_line_naming_it(raw):
    with pytest.raises(ConfigError, match="CONTAINER_ENTRY_HANG_TIMEOUT"):
        settings.resolve({"CONTAINER_ENTRY_HANG_TIMEOUT": raw}, {})


def test_hang_timeout_from_env_or_hyperparameter_and_the_progress_variable_is_not_a_setting():
    assert settings.resolve({}, {}).hang_timeout is None  # auto
    assert settings.resolve({}, {"hang_timeout": "auto"}).hang_timeout is None
    assert settings.resolve({}, {"hang_timeout": "0"}).hang_timeout == 0.0  # off
    assert settings.resolve({}, {"hang_timeout": "1800"}).hang_timeout == 1800.0
    environ = {"CONTAINER_ENTRY_HANG_TIMEOUT": "60", PROGRESS_ENV: "/x/progress"}
    assert settings.resolve(environ, {}).hang_timeout == 60.0


def silent(policy: Silence, seconds: int, every: float = 1.0) -> bool:
    """Feed `seconds` of silence, a sample per `every`, as the master does each second;
    whether it was declared a hang; then output comes (the silence ends)."""
    hung = any(policy.hung(t * every) for t in range(int(seconds / every) + 1))
    policy.hung(0.0)
    return hung


def test_auto_never_calls_a_silence_under_30_minutes_a_hang_nor_a_longer_one_it_came_back_from():
    """A job printing every second, with a 5-minute silent checkpoint, then a 20-minute silent
    evaluation: none is a hang; after that 20-minute silence it takes an hour; a job that went
    silent for good is declared hung at 30 minutes (no silence before it)."""
    policy = Silence(None)
    for _ in range(3):
        assert not silent(policy, 2)  # steady output
    assert not silent(policy, 300, every=10)  # the 5-minute checkpoint
    assert policy.timeout() == AUTO_FLOOR
    assert not silent(policy, 1200, every=10)  # a 20-minute evaluation
    assert policy.timeout() == 3600.0
    assert not any(policy.hung(t) for t in range(0, 3600, 10))
    assert policy.hung(3600.0)
    fresh = Silence(None)
    assert not fresh.hung(AUTO_FLOOR - 1) and fresh.hung(AUTO_FLOOR)


def test_a_set_timeout_is_fixed_whatever_the_job_came_back_from_and_zero_is_off():
    policy = Silence(60.0)
    assert silent(policy, 1200, every=10)  # hung at 60 s, not learnt from
    assert policy.timeout() == 60.0
    assert not policy.hung(59.0) and policy.hung(60.0)
    off = Silence(0.0)
    assert not silent(off, 1200, every=10) and not off.hung(1e9)


def test_only_the_watchdog_s_own_record_is_a_hang():
    assert not is_hang(RankRecord(host="algo-1", rank=0, returncode=124, what="hung: no"))
    assert not is_hang(RankRecord(host=None, rank=None, returncode=1, what="hung: x"))
    assert is_hang(RankRecord(host=None, rank=None, returncode=124, what=hung_words(5)))


def test_importing_the_module_has_no_side_effects(tmp_path):
    code = "import container_entry.diagnose.hang, os; print(sorted(os.listdir('.')))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_torchrun_before_its_workers_is_life_then_the_silence_counts_from_then(tmp_path, clock):
    """Beside a CPU hog torchrun's import of torch took 11 s after the launch (run 52), and its
    rendezvous and the workers' start after it over 10 s (run 56): a fixed 10 s timeout
    declared a hang before any rank had run. While torchrun has started no worker, this host
    is not silent; after that the silence counts from the last moment it was seen so, or from
    a later start mark (a rank's pid file), never from the launch."""
    (tmp_path / "logs").mkdir()
    control = tmp_path / "control"
    control.mkdir()
    starting = [True]
    activity = Activity(
        RunDir(tmp_path), None, lambda: sorted(control.glob("rank-*.pid")), lambda: starting[0]
    )
    activity.since -= 100  # launched long ago, torchrun not yet past its start-up
    assert activity.idle() == pytest.approx(0, abs=1e-3)
    starting[0] = False  # its workers started
    activity._starting_at -= 30  # last seen starting 30 s ago
    activity._checked = 0.0
    assert activity.idle() == pytest.approx(30, abs=1e-3)  # not 100: the launch is long past
    (control / "rank-0.pid").write_text("{}")
    _age(control / "rank-0.pid", 20, clock)  # a rank's start, later than that
    activity._checked = 0.0
    assert activity.idle() == pytest.approx(20, abs=1e-3)
    starting[0] = True  # a restart: torchrun between two groups, no worker
    activity._checked = 0.0
    assert activity.idle() == pytest.approx(0, abs=1e-3)


def test_a_torchrun_is_starting_while_it_runs_without_a_worker(tmp_path):
    """Supervisor.torchrun_starting's test, on real processes: running with no child (its
    import, its rendezvous) is starting; with a child (a worker's wrapper), or gone, it is
    not."""
    go = tmp_path / "go"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, subprocess, sys, time\n"
            "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"
            "child = subprocess.Popen(['sleep', '60'])\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(60)\n",
            str(go),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert childless(parent.pid)
        go.touch()
        child = int(parent.stdout.readline())
        assert not childless(parent.pid)
        os.kill(child, signal.SIGKILL)  # a zombie until reaped: no live child
        deadline = time.monotonic() + 30
        while not childless(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert childless(parent.pid)
    finally:
        parent.kill()
        parent.wait()
    assert not childless(parent.pid)  # gone
