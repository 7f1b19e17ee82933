"""launch.py's pieces that decide what the workers get and what is left on disk, each on real
files and pipes; the whole supervise loop runs on real torchrun in tests/integration."""

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

from container_entry.hang import PROGRESS_ENV
from container_entry.launch import (
    TorchrunOutput,
    Workers,
    child_environment,
    control_dir,
    prepare_run_dir,
    tidy_run_dir,
)
from container_entry.plan import build_plan
from container_entry.preflight import EXPECTED_GPUS_ENV
from container_entry.worker import CONTROL_ENV
from tests.unit.conftest import make_env


def test_the_workers_get_the_plan_s_additions_but_never_over_a_user_value(tmp_path):
    environ = {"SAGEMAKER_PROGRAM": "train.py", "OMP_NUM_THREADS": "3", "MY_VAR": "x y"}
    plan = build_plan(make_env(environ=environ))
    assert "OMP_NUM_THREADS" not in plan.env  # the plan already leaves the user's value out
    env = child_environment(plan, {**environ, "PYTHONPATH": "/mine"}, tmp_path)
    assert env["OMP_NUM_THREADS"] == "3" and env["MY_VAR"] == "x y"
    assert env["PYTHONPATH"] == "/mine"  # set after the plan was made: still the user's
    assert env[PROGRESS_ENV] == plan.env[PROGRESS_ENV].value
    assert env[CONTROL_ENV] == str(tmp_path)
    assert env[EXPECTED_GPUS_ENV] == "0"


def test_a_control_folder_is_private_and_fresh_per_launch():
    path = control_dir("unit-test")
    try:
        (path / "stale").write_text("x")
        again = control_dir("unit-test")
        assert again == path and not (path / "stale").exists()
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
        assert path.name == f"{os.getpid()}-unit-test"
    finally:
        path.rmdir()


def test_only_the_previous_run_s_own_records_are_removed(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "stacks").mkdir()
    ours = ["rank-0.json", "logs/rank-3.log", "stacks/rank-1.txt"]
    theirs = ["rank-notes.txt", "logs/my.log", "metrics.json", "stacks/readme"]
    for name in ours + theirs:
        (tmp_path / name).write_text("x")
    prepare_run_dir(tmp_path)
    assert not any((tmp_path / name).exists() for name in ours)
    assert all((tmp_path / name).exists() for name in theirs)


def test_empty_stack_files_and_an_empty_stacks_folder_are_not_left(tmp_path):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "rank-0.txt").write_text("")
    tidy_run_dir(tmp_path)
    assert not stacks.exists()
    stacks.mkdir()
    (stacks / "rank-0.txt").write_text("")
    (stacks / "rank-1.txt").write_text('File "t.py", line 1 in <module>\n')
    tidy_run_dir(tmp_path)
    assert [p.name for p in stacks.iterdir()] == ["rank-1.txt"]


def test_workers_are_read_from_their_pid_files_and_signalled_by_group(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)  # fmt: skip
    try:
        record = {"rank": 2, "wrapper": child.pid, "child": child.pid, "host": "algo-1"}
        (tmp_path / "rank-2.pid").write_text(json.dumps(record))
        (tmp_path / "rank-9.pid").write_text("{half a record")  # being written: skipped
        workers = Workers(tmp_path)
        assert workers.refresh() == {2: record}
        workers.signal(signal.SIGTERM, ranks=[5])  # not that rank: nothing happens
        assert child.poll() is None
        workers.signal(signal.SIGTERM)
        assert child.wait(timeout=10) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()


def test_torchrun_s_own_lines_are_kept_and_shown_until_a_teardown_quiets_them(capfd):
    script = (
        "import sys, time\n"
        "sys.stderr.write('[algo-1 rank 0] a rank line\\ntorchrun says 1\\n'); sys.stderr.flush()\n"
        "time.sleep(0.5)\n"
        "sys.stderr.write('Traceback: SignalException\\n[algo-1 rank 0] last\\nno newline')\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    output = TorchrunOutput(b"[algo-1 rank ")

    def quiet_later():
        time.sleep(0.3)
        output.quiet = True

    threading.Thread(target=quiet_later).start()
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
    from container_entry.failure import Observed, verdict

    run = Observed(torch_version="2.9.0")
    run.returncode = 1
    run.torchrun_tail = [
        "usage: ignored",
        "[W1203 10:00:00.000 socket.cpp:200] [c10d] The client socket has timed out",
        "[E1203 10:00:01.000 TCPStore.cpp:100] [c10d] connect() to algo-1:29500 failed",
    ]
    result = verdict(run, "algo-2", Path("/nonexistent"))
    assert result.exit_code == 1
    assert "[E1203 10:00:01.000 TCPStore.cpp:100] [c10d] connect() to algo-1" in result.reason
    assert "usage" not in result.reason


def test_torchrun_rejecting_our_command_line_is_an_internal_error_naming_the_torch():
    from container_entry.failure import INTERNAL_EXIT_CODE, Observed, verdict

    run = Observed(torch_version="2.9.0+cu128")
    run.returncode = 2
    run.torchrun_tail = USAGE.splitlines()
    result = verdict(run, "algo-2", Path("/nonexistent"))
    assert result.exit_code == INTERNAL_EXIT_CODE
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
        from container_entry.launch import catches

        assert catches(python.pid, signal.SIGUSR2) and not catches(shell.pid, signal.SIGUSR2)
        assert Workers(tmp_path).request_stacks() == {0: True, 1: False}
        time.sleep(0.5)
        assert python.poll() is None and shell.poll() is None  # both still running
        assert "File" in (tmp_path / "s").read_text()
        assert not catches(999_999_999, signal.SIGUSR2)  # no such process
    finally:
        for child in (python, shell):
            child.kill()
            child.wait()
