"""Signals at the edges: a rank killed by any signal the kernel has (the real-time ones
included, which `signal.Signals` does not name), and a stop (SIGINT, SIGTERM, SIGHUP) at
every moment of the bootstrap's start, from its first line on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.integration.conftest import bootstrap_argv, bootstrap_env, make_tree
from tests.ports import job_port

SELF_KILL = """
import os, sys
print("about to die", flush=True)
os.kill(os.getpid(), int(sys.argv[sys.argv.index("--signal") + 1]))
"""

# every real-time signal's edge and one inside, and classic ones with and without a core dump
SIGNALS = {
    "SIGRTMIN": signal.SIGRTMIN,
    "SIGRTMIN+2": signal.SIGRTMIN + 2,
    "SIGRTMAX-1": signal.SIGRTMAX - 1,
    "SIGRTMAX": signal.SIGRTMAX,
    "SIGUSR1": signal.SIGUSR1,
    "SIGSEGV": signal.SIGSEGV,
    "SIGKILL": signal.SIGKILL,
}


def start_killed_rank(root, number: int) -> tuple:
    script = root / "self_kill.py"
    script.write_text(SELF_KILL)
    tree = make_tree(root, script=script, hyperparameters={"signal": str(number)})
    env = bootstrap_env(
        tree,
        SAGEMAKER_PROGRAM="self_kill.py",
        PET_NPROC_PER_NODE="1",
        CONTAINER_ENTRY_MASTER_PORT=str(job_port()),
    )
    process = subprocess.Popen(
        bootstrap_argv(), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/"
    )
    return tree, process


def test_a_rank_killed_by_any_signal_is_named_recorded_and_exits_128_plus_n(tmp_path):
    """All at once (each its own job and ports): a real-time signal (`SIGRTMIN+2` is 36 on
    Linux) once crashed the wrapper (`36 is not a valid Signals`), lost the rank's record and
    exited 1."""
    jobs = {}
    for name, number in SIGNALS.items():
        root = tmp_path / name.replace("+", "plus").replace("-", "minus")
        root.mkdir()
        jobs[name] = (number, *start_killed_rank(root, int(number)))
    for name, (number, tree, process) in jobs.items():
        _, err = process.communicate(timeout=120)
        err = err.decode(errors="replace")
        assert process.returncode == 128 + number, (name, process.returncode, err[-3000:])
        assert "Traceback" not in err, (name, err[-3000:])
        rank0 = json.loads((tree.output / "data/container-entry/rank-0.json").read_text())
        assert rank0["returncode"] == -number and rank0["signal"] == name, (name, rank0)
        first = (tree.output / "failure").read_text().splitlines()[0]
        assert f"rank 0 (local 0) on algo-1: signal {name}" in first, (name, first)


def catches(pid: int, sig: int) -> bool:
    from container_entry.common.workers import catches as caught

    return caught(pid, sig)


def session_members(sid: int) -> list[str]:
    """The live processes of session `sid` (nothing the bootstrap started may outlive it)."""
    from pathlib import Path

    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            found.append(stat.parent.name)
    return found


DELAYS_MS = (0, 1, 2, 3, 5, 10, 20, 50, 100, 200, 500)


def blocked_stop_signals() -> None:
    """As an entry point that starts the bootstrap with `env --block-signal=INT,TERM,HUP`."""
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))


@pytest.mark.parametrize("start", ["first-line", "blocked-at-exec"])
@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_stop_at_any_moment_of_the_start_is_a_stopped_job_never_a_traceback(
    tmp_path, name, start
):
    """A stop at each of these moments is 128+N, a failure file that says it was stopped, no
    traceback (SIGINT in the first ~50 ms was a KeyboardInterrupt traceback and exit 1) and
    nothing left running. `first-line`: counted from the bootstrap's first line of code (it
    catches SIGTERM then: the handler that notes a stop before anything else is imported;
    before it is Python's own start-up, where SIGINT is Python's KeyboardInterrupt).
    `blocked-at-exec`: the signals blocked when the bootstrap is exec'd, counted from then: a
    stop during Python's own start-up waits, and is noted at that first line."""
    sig = getattr(signal, name)
    port = job_port()
    for delay in DELAYS_MS:
        tree = make_tree(tmp_path / str(delay))
        env = bootstrap_env(
            tree,
            SAGEMAKER_PROGRAM="ddp_probe.py",
            PET_NPROC_PER_NODE="1",
            CONTAINER_ENTRY_MASTER_PORT=str(port),
            # a rank whose Python swallows a SIGINT in its own start-up is killed after it
            CONTAINER_ENTRY_STOP_GRACE_PERIOD="5",
        )
        process = subprocess.Popen(
            bootstrap_argv(),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
            start_new_session=True,
            preexec_fn=blocked_stop_signals if start == "blocked-at-exec" else None,
        )
        deadline = time.monotonic() + 10
        while start == "first-line" and not catches(process.pid, signal.SIGTERM):
            assert time.monotonic() < deadline
            time.sleep(0.0002)
        time.sleep(delay / 1000)
        process.send_signal(sig)
        try:
            _, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            _, err = process.communicate()
            pytest.fail(f"{name} after {delay} ms: still running 60 s later:\n{err[-3000:]}")
        assert process.returncode == 128 + sig, (delay, process.returncode, err[-3000:])
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, (delay, err[-3000:])
        first = (tree.output / "failure").read_text().splitlines()[0]
        assert f"stopped by {name}" in first, (delay, first)
        assert session_members(process.pid) == [], delay


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_stop_while_a_rank_wrapper_starts_is_noted_never_a_traceback(tmp_path, name):
    """The per-rank wrapper alone (as torchrun starts it), its process group stopped as the
    bootstrap does, from the wrapper's first line on: it noted a stop only once its imports
    and its command were done (before, SIGINT was a KeyboardInterrupt traceback and SIGTERM
    killed it: a failed worker for torchrun during a stop). It exits 0 as a stopped rank and
    its record names the stop."""
    sig = getattr(signal, name)
    script = tmp_path / "sleeper.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(30)\n")
    for delay in (0, 1, 2, 5, 10, 20, 50):
        control, run_dir = tmp_path / f"control-{delay}", tmp_path / f"run-{delay}"
        control.mkdir()
        command = {"argv": [str(script)], "run_dir": str(run_dir), "console_stderr": None}
        (control / "command.json").write_text(json.dumps(command))
        env = {**os.environ, "_CONTAINER_ENTRY_CONTROL": str(control), "RANK": "0"}
        process = subprocess.Popen(
            [sys.executable, "-m", "container_entry.worker"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
            start_new_session=True,  # its process group, which the bootstrap signals
        )
        deadline = time.monotonic() + 10
        while not catches(process.pid, signal.SIGTERM):
            assert time.monotonic() < deadline
            time.sleep(0.0002)
        time.sleep(delay / 1000)
        os.killpg(process.pid, sig)
        try:
            _, err = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # the script's own Python may swallow a SIGINT that
            # lands in its start-up (`Exception ignored in: ... KeyboardInterrupt`): the
            # bootstrap's grace period ends such a rank; here, end the script
            child = json.loads((control / "rank-0.pid").read_text())["child"]
            os.kill(child, signal.SIGKILL)
            _, err = process.communicate(timeout=30)
        assert process.returncode == 0, (delay, process.returncode, err[-3000:])
        own = [line for line in err.splitlines() if not line.startswith("[localhost rank 0] ")]
        assert not [line for line in own if "Traceback" in line], (delay, err[-3000:])
        rank0 = json.loads((run_dir / "rank-0.json").read_text())
        assert rank0["stop"]["name"] == name, (delay, rank0)
