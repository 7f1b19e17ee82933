"""The launch's pieces that ending_of what the workers get and what is left on disk (layout,
torchrun_process, torchrun_output, workers), each on real files and pipes; the whole supervise
loop runs on real torchrun in tests/integration."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from container_entry.common import logs
from container_entry.common.exits import ExitCode
from container_entry.common.layout import CONTROL_ENV, ControlDir, RunDir
from container_entry.common.masking import MASK, Masker
from container_entry.common.workers import Workers, catches
from container_entry.diagnose.hang import PROGRESS_ENV
from container_entry.plan.plan import build_plan
from container_entry.rank.preflight import EXPECTED_GPUS_ENV
from container_entry.supervise.ending import Ending, EndingKind, Observed, verdict
from container_entry.supervise.torchrun_output import TorchrunOutput
from container_entry.supervise.torchrun_process import child_environment
from tests.unit.conftest import make_env
from tests.unit.test_masking import CORE, TRICKY


def test_the_workers_get_the_plan_s_additions_but_never_over_a_user_value(tmp_path):
    environ = {"SAGEMAKER_PROGRAM": "train.py", "OMP_NUM_THREADS": "3", "MY_VAR": "x y"}
    plan = build_plan(make_env(environ=environ))
    assert "OMP_NUM_THREADS" not in plan.env  # the plan already leaves the user's value out
    env = child_environment(plan, {**environ, "PYTHONPATH": "/mine"}, ControlDir(tmp_path))
    assert env["OMP_NUM_THREADS"] == "3" and env["MY_VAR"] == "x y"
    assert env["PYTHONPATH"] == "/mine"  # set after the plan was made: still the user's
    assert env[PROGRESS_ENV] == plan.env[PROGRESS_ENV].value
    assert env[CONTROL_ENV] == str(tmp_path)
    assert env[EXPECTED_GPUS_ENV] == "0"


def test_a_control_folder_is_private_and_fresh_per_launch():
    path = ControlDir.create("unit-test").path
    try:
        (path / "stale").write_text("x")
        again = ControlDir.create("unit-test").path
        assert again == path and not (path / "stale").exists()
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
        assert path.name == f"{os.getpid()}-unit-test"
    finally:
        path.rmdir()


def test_only_the_previous_run_s_own_records_are_removed(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "stacks").mkdir()
    (tmp_path / "flight-recorder").mkdir()
    ours = ["rank-0.json", "logs/rank-3.log", "stacks/rank-1.txt", "flight-recorder/rank-2.json"]
    theirs = ["rank-notes.txt", "logs/my.log", "metrics.json", "stacks/readme"]
    for name in ours + theirs:
        (tmp_path / name).write_text("x")
    RunDir(tmp_path).prepare()
    assert not any((tmp_path / name).exists() for name in ours)
    assert all((tmp_path / name).exists() for name in theirs)


def test_empty_stack_files_and_an_empty_stacks_folder_are_not_left(tmp_path):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "rank-0.txt").write_text("")
    RunDir(tmp_path).tidy()
    assert not stacks.exists()
    stacks.mkdir()
    (stacks / "rank-0.txt").write_text("")
    (stacks / "rank-1.txt").write_text('File "t.py", line 1 in <module>\n')
    RunDir(tmp_path).tidy()
    assert [p.name for p in stacks.iterdir()] == ["rank-1.txt"]


def test_workers_are_read_from_their_pid_files_and_signalled_by_group(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)  # fmt: skip
    try:
        record = {"rank": 2, "wrapper": child.pid, "child": child.pid, "host": "algo-1"}
        record["local_rank"] = 1
        (tmp_path / "rank-2.pid").write_text(json.dumps(record))
        (tmp_path / "rank-9.pid").write_text("{half a record")  # being written: skipped
        workers = Workers(ControlDir(tmp_path))
        assert {r: vars(p) for r, p in workers.refresh().items()} == {2: record}
        workers.signal(signal.SIGTERM, ranks=[5])  # not that rank: nothing happens
        assert child.poll() is None
        workers.signal(signal.SIGTERM)
        assert child.wait(timeout=10) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()


def test_torchrun_s_own_lines_are_kept_and_shown_until_a_teardown_quiets_them(capfd, tmp_path):
    # the teardown begins once torchrun's first line was read (not after a fixed sleep, which a
    # Python start on a busy machine outlasted), and torchrun goes on only then
    go = tmp_path / "go"
    script = (
        "import os, sys, time\n"
        "sys.stderr.write('[algo-1 rank 0] a rank line\\ntorchrun says 1\\n'); sys.stderr.flush()\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
        "sys.stderr.write('Traceback: SignalException\\n[algo-1 rank 0] last\\nno newline')\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    output = TorchrunOutput(b"[algo-1 rank ")

    def quiet_later() -> None:
        while "torchrun says 1" not in output.tail:
            time.sleep(0.01)
        output.quiet = True
        go.touch()

    threading.Thread(target=quiet_later, daemon=True).start()
    output.pump(process)
    process.wait()
    shown = capfd.readouterr().err
    assert "[algo-1 rank 0] a rank line" in shown and "torchrun says 1" in shown
    assert "SignalException" not in shown  # the teardown's own noise
    assert "[algo-1 rank 0] last" in shown  # rank lines always
    assert list(output.tail) == ["torchrun says 1", "Traceback: SignalException", "no newline"]


def _pumped(capfd, text: str) -> tuple[str, list[str]]:
    script = f"import sys; sys.stderr.write({text!r}); sys.stderr.flush()"
    process = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    output = TorchrunOutput(b"[algo-1 rank ")
    output.pump(process)
    process.wait()
    return capfd.readouterr().err, list(output.tail)


USAGE = (
    "usage: run.py [-h] [--nnodes NNODES] [--nproc-per-node NPROC_PER_NODE]\n"
    "              [--rdzv-backend RDZV_BACKEND] [--numa-binding {node,socket}]\n"
    "              training_script ...\n"
    "run.py: error: unrecognized arguments: --shutdown-timeout\n"
)


def test_torchrun_rejecting_its_command_line_prints_no_usage_text(capfd):
    shown, tail = _pumped(capfd, "[algo-1 rank 0] fine\n" + USAGE)
    assert shown == "[algo-1 rank 0] fine\n"  # the verdict names it in one line instead
    assert tail[-1] == "run.py: error: unrecognized arguments: --shutdown-timeout"


def test_a_usage_block_without_an_error_is_shown_after_all(capfd):
    shown, _ = _pumped(capfd, "usage: something\n   more\nnot a usage line\n")
    assert shown == "usage: something\n   more\nnot a usage line\n"


def test_torch_s_own_cpp_lines_reach_the_torchrun_failure_report():
    run = Observed(torch_version="2.9.0")
    run.returncode = 1
    run.torchrun_tail = [
        "usage: ignored",
        "[W1203 10:00:00.000 socket.cpp:200] [c10d] The client socket has timed out",
        "[E1203 10:00:01.000 TCPStore.cpp:100] [c10d] connect() to algo-1:29500 failed",
    ]
    result = verdict(
        Ending(EndingKind.TORCHRUN_FAILED), run, "algo-2", RunDir(Path("/nonexistent"))
    )
    assert result.exit_code == 1
    assert "[E1203 10:00:01.000 TCPStore.cpp:100] [c10d] connect() to algo-1" in result.reason
    assert "usage" not in result.reason


def test_torchrun_rejecting_our_command_line_is_an_internal_error_naming_the_torch():
    run = Observed(torch_version="2.9.0+cu128")
    run.returncode = 2
    run.torchrun_tail = USAGE.splitlines()
    result = verdict(
        Ending(EndingKind.TORCHRUN_FAILED), run, "algo-2", RunDir(Path("/nonexistent"))
    )
    assert result.exit_code == ExitCode.INTERNAL
    assert result.reason == (
        "internal error: torchrun (torch 2.9.0+cu128) on algo-2 rejected the command line "
        "container-entry built: unrecognized arguments: --shutdown-timeout"
    )


def test_only_ranks_with_a_stack_handler_are_asked_for_stacks(tmp_path):
    """SIGUSR2 ends a process that has no handler for it: a shell entry script, or a Python
    rank still starting, is never sent it, while a Python rank dumps and carries on."""
    ready = tmp_path / "ready"
    python = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import faulthandler, signal, sys, time, pathlib\n"
            f"faulthandler.register(signal.SIGUSR2, file=open({str(tmp_path / 's')!r}, 'a'))\n"
            f"pathlib.Path({str(ready)!r}).touch()\n"
            "time.sleep(60)\n",
        ]
    )
    shell = subprocess.Popen(["sh", "-c", "sleep 60"])
    try:
        for rank, child in ((0, python), (1, shell)):
            record = {"rank": rank, "wrapper": child.pid, "child": child.pid, "host": "algo-1"}
            (tmp_path / f"rank-{rank}.pid").write_text(json.dumps(record))
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert catches(python.pid, signal.SIGUSR2) and not catches(shell.pid, signal.SIGUSR2)
        assert Workers(ControlDir(tmp_path)).request_stacks() == {0: True, 1: False}
        deadline = time.monotonic() + 30  # the dump, when the rank is next scheduled
        while "File" not in (tmp_path / "s").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "File" in (tmp_path / "s").read_text()
        time.sleep(0.2)  # a shell without a handler would have died of it by now
        assert python.poll() is None and shell.poll() is None  # both still running
        assert not catches(999_999_999, signal.SIGUSR2)  # no such process
    finally:
        for child in (python, shell):
            child.kill()
            child.wait()


# -- torchrun's output: masked, and its failure report kept for the report only --------------


def _report(tmp_path: Path, monkeypatch, message: str) -> str:
    """What torchrun prints when a rank fails, made by the installed torch: the rank's `@record`
    error file (its traceback, the message in it) and torchrun's ChildFailedError traceback
    with the `====` report, a second rank killed by a signal beside it."""
    import traceback

    from torch.distributed.elastic.multiprocessing.errors import (
        ChildFailedError,
        ProcessFailure,
    )
    from torch.distributed.elastic.multiprocessing.errors.error_handler import ErrorHandler

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    try:
        raise RuntimeError(f"auth failed with key {message}")
    except RuntimeError as error:
        ErrorHandler().record_exception(error)
    failures = {
        0: ProcessFailure(local_rank=0, pid=123, exitcode=1, error_file=str(error_file)),
        1: ProcessFailure(local_rank=1, pid=124, exitcode=-9, error_file=str(tmp_path / "none")),
    }
    try:
        raise ChildFailedError("container_entry.worker", failures)
    except ChildFailedError as error:
        return "".join(traceback.format_exception(error))


def _pump_in_pieces(capfd, text: str, piece: int = 23):
    """`text` written to a real pipe in pieces of `piece` bytes (a secret cut across reads),
    pumped by TorchrunOutput: (what reached our stderr, the kept tail)."""
    script = (
        "import sys, time\n"
        f"data = {text.encode('utf-8', 'surrogateescape')!r}\n"
        f"for i in range(0, len(data), {piece}):\n"
        f"    sys.stderr.buffer.write(data[i:i + {piece}]); sys.stderr.flush(); time.sleep(0.001)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    output = TorchrunOutput(b"[algo-1 rank ")
    output.pump(process)
    process.wait()
    return capfd.readouterr().err, list(output.tail)


FAILED_LINE = (
    "E1204 20:07:13.839000 3198 torch/distributed/elastic/multiprocessing/api.py:1002] "
    "failed (exitcode: 1) local_rank: 0 (pid: 123) of binary: /usr/bin/python\n"
)
NO_PARENT_FILE = (
    "E1204 20:07:13.840000 3198 torch/distributed/elastic/multiprocessing/errors/"
    "error_handler.py:194] no error file defined for parent, to copy child error file "
    "(/tmp/torchelastic_x/none_y/attempt_0/0/error.json)\n"
)


@pytest.mark.parametrize("secret", TRICKY.values(), ids=TRICKY.keys())
def test_torchrun_s_failure_report_is_masked_kept_and_not_shown(
    capfd, tmp_path, monkeypatch, secret
):
    monkeypatch.setattr(logs, "MASKER", Masker([secret]))
    report = _report(tmp_path, monkeypatch, secret)
    assert CORE.search(report) and "ChildFailedError" in report  # what torch prints: the secret
    text = (
        f"[algo-1 rank 0] RuntimeError: auth failed with key {MASK}\n"
        + FAILED_LINE
        + NO_PARENT_FILE
        + report
        + "torchrun's line after the report\n"
    )
    shown, tail = _pump_in_pieces(capfd, text)
    kept = "\n".join(tail)
    assert not CORE.search(shown) and not CORE.search(kept), (shown, kept)
    assert shown == (
        f"[algo-1 rank 0] RuntimeError: auth failed with key {MASK}\n"
        + FAILED_LINE
        + "torchrun's line after the report\n"
    )
    assert "Root Cause (first observed failure):" in tail  # kept for the failure report
    assert any(line.endswith("ChildFailedError: ") for line in tail)
    assert f"  RuntimeError: auth failed with key {MASK}" in tail


def test_torchrun_s_own_errors_are_shown_whole_and_masked(capfd, monkeypatch):
    """A real torchrun error (here a rendezvous backend that does not exist) is what a user
    needs when no rank ever reported: its whole chained traceback reaches the console."""
    secret = TRICKY["everything"]
    monkeypatch.setattr(logs, "MASKER", Masker([secret]))
    error = (
        "Traceback (most recent call last):\n"
        '  File "/torch/distributed/elastic/rendezvous/api.py", line 370, in create_handler\n'
        "    creator = self._registry[params.backend]\n"
        "              ~~~~~~~~~~~~~~^^^^^^^^^^^^^^^^\n"
        f"KeyError: {secret!r}\n"
        "\n"
        "The above exception was the direct cause of the following exception:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "/torch/distributed/run.py", line 1138, in main\n'
        "    run(args)\n"
        f"ValueError: The rendezvous backend {json.dumps(secret)} is not registered.\n"
    )
    shown, tail = _pump_in_pieces(capfd, error)
    assert shown == Masker([secret]).text(error)
    assert "KeyError: '****'" in shown and 'backend "****" is not' in shown
    assert not CORE.search(shown + "\n".join(tail))


def test_a_traceback_cut_short_is_shown_but_a_report_cut_short_is_not(capfd, tmp_path, monkeypatch):
    report = _report(tmp_path, monkeypatch, "nothing secret here")
    cut = report[: report.index("Root Cause")]
    shown, tail = _pump_in_pieces(capfd, "torchrun says\n" + cut)
    assert shown == "torchrun says\n" and "container_entry.worker FAILED" in tail
    other = 'Traceback (most recent call last):\n  File "run.py", line 1, in <module>\n'
    shown, _ = _pump_in_pieces(capfd, other)
    assert shown == other  # torchrun died inside it: what it said is shown after all


def test_a_report_in_an_unknown_format_ends_at_its_exception_line(capfd):
    text = (
        "Traceback (most recent call last):\n"
        '  File "run.py", line 1, in <module>\n'
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: short form\n"
        "torchrun goes on\n"
    )
    shown, tail = _pump_in_pieces(capfd, text)
    assert shown == "torchrun goes on\n"
    assert tail[-2:] == [text.splitlines()[2], "torchrun goes on"]


def test_a_traceback_held_when_a_teardown_starts_is_not_shown(capfd, tmp_path):
    """torchrun's answer to our own SIGTERM: held until its exception line, by then quiet."""
    go = tmp_path / "go"
    script = (
        "import os, sys, time\n"
        "sys.stderr.write('torchrun says\\nTraceback (most recent call last):\\n  frame\\n')\n"
        "sys.stderr.flush()\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
        "sys.stderr.write('torch...api.SignalException: Process 1 got signal: 15\\n')\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    output = TorchrunOutput(b"[algo-1 rank ")

    def teardown() -> None:
        while "  frame" not in output.tail:
            time.sleep(0.01)
        output.quiet = True
        go.touch()

    threading.Thread(target=teardown, daemon=True).start()
    output.pump(process)
    process.wait()
    assert capfd.readouterr().err == "torchrun says\n"
    assert output.tail[-1] == "torch...api.SignalException: Process 1 got signal: 15"


@pytest.mark.parametrize("finished", [True, False])
def test_a_stop_that_comes_as_torchrun_exits_is_judged_by_its_moment(tmp_path, finished):
    """SDK local mode stops the other containers as soon as one exits: the stop may reach a
    bootstrap after its torchrun exited, before its last look. That stop is still a stop with a
    signal and a moment (once `job stopped by None ...: 0 of 2 local ranks exited within 0.0 s`,
    exit 143, for a job whose every script had ended with 0): a success when every script ended
    before it, a stopped job when one was still running. A real process stands in for torchrun
    (it exits at once); the rank's record is the wrapper's."""
    from container_entry.common.stopping import Stop, StopSignal
    from container_entry.hosts.session import Session
    from container_entry.supervise.supervisor import Supervisor

    plan = build_plan(make_env(environ={"SAGEMAKER_PROGRAM": "train.py"}))
    run_dir = RunDir(tmp_path / "run")
    run_dir.prepare()
    stop = Stop()
    supervisor = Supervisor(plan, {}, run_dir, Session(plan, b""), stop)  # one host: no channel
    signalled = time.time()
    ended = signalled - 1.0 if finished else signalled + 0.5
    record = {"host": "algo-1", "rank": 0, "returncode": 0, "script_ended_at": ended}
    run_dir.record(0).write_text(json.dumps({**record, "ended_at": ended + 0.1}))
    supervisor.observed.launched = {0}
    clean_up = supervisor.clean_up

    def stopped_as_torchrun_exits(*args) -> None:
        clean_up(*args)
        stop.came = StopSignal("SIGTERM", signalled)  # what Stop's handler notes

    supervisor.clean_up = stopped_as_torchrun_exits  # type: ignore[method-assign]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    with subprocess.Popen([sys.executable, "-c", "pass"], **pipes) as process:
        ending = supervisor.monitor(process)
    result = verdict(ending, supervisor.observed, "algo-1", run_dir)
    assert ending.kind is EndingKind.STOPPED
    assert supervisor.observed.stop == StopSignal("SIGTERM", signalled)
    if finished:
        assert result.exit_code == 0, result.reason
    else:
        assert result.exit_code == 143 and "None" not in result.reason, result.reason
        assert result.reason.startswith("job stopped by SIGTERM on algo-1"), result.reason
