"""The guarantees an entry point run once per host keeps (docs/launch-modes.md, "Such a run
keeps every guarantee that does not need our workers"), in real processes: the lines of its
launcher's workers reach the console tagged with the host (`[algo-1] `, no rank of ours) and
masked, in the rank log too; workers that go silent are a hang (exit 124); on two hosts a
worker's crash on algo-2 is the job's first failure on algo-1 too (the relay), and algo-2's
bootstrap killed is noticed by algo-1 (liveness). Also the Python launcher functions that
tests/integration/test_self_launch.py has no form of: torch.multiprocessing.start_processes
and accelerate.notebook_launcher each form their world once per host.

The jobs are test_self_launch's (its forms, its start_job, two hosts on this machine each in a
mount namespace of its own); once_probe.py is the tutorial's shape with workers that print the
job's secrets or hang.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time

import pytest

from container_entry.common.masking import MASK
from container_entry.common.workers import descendants
from tests.integration.conftest import (
    bootstrap_argv,
    bootstrap_env,
    make_tree,
    run,
    wait_for,
    with_hosts_file,
)
from tests.integration.test_faults import alive, worker_pids
from tests.integration.test_liveness import EXITED_WITHIN, GRACE, kill_everything
from tests.integration.test_secret_forms import assert_no_form_anywhere, published
from tests.integration.test_self_launch import SCRIPTS, SPANS, start_job
from tests.ports import job_port

PROBE = "once_probe.py"
# the forms of this file's own, each one world per host, and the function each launches with
LAUNCHER_FUNCTIONS = {
    "start_processes.py": "torch.multiprocessing.start_processes",
    "notebook.py": "accelerate.notebook_launcher",
}
HANG_TIMEOUT = 10  # as tests/integration/test_hang.py: a fixed one counts from the launch
# the ASCII core (test_secret_forms.CORE) shows a form of a secret left visible anywhere
ENV_SECRET = "env-token-value core-11"
HP_SECRET = "hp-token-value core-12"


@pytest.fixture(autouse=True)
def forms_of_this_file(monkeypatch):
    """start_job knows this file's forms too: each makes one world per host."""
    for entry in (PROBE, *LAUNCHER_FUNCTIONS):
        monkeypatch.setitem(SPANS, entry, False)


def test_the_users_workers_lines_reach_the_console_tagged_with_the_host_and_masked(
    tmp_path, hosts_file
):
    """Each of the two mp.spawn workers prints a token from the environment (HF_TOKEN) and one
    from a hyperparameter (hf_token) on its stdout and its stderr, through pipes the wrapper
    relays: every line on the console is tagged `[algo-1] ` (the host: the workers are no
    ranks of ours), the rank log (logs/rank-0.log, the entry point's slot) keeps them untagged,
    and both tokens are `****` there and anywhere under output/, never in clear."""
    tree = make_tree(tmp_path, hyperparameters={"hf_token": json.dumps(HP_SECRET)}, script=None)
    shutil.copytree(SCRIPTS, tree.base / "code", dirs_exist_ok=True)
    env = bootstrap_env(
        tree,
        SAGEMAKER_PROGRAM=PROBE,
        PET_NPROC_PER_NODE="2",
        NPROC="2",
        USER_PORT=str(job_port()),
        HF_TOKEN=ENV_SECRET,
        SHOW_SECRETS="1",
    )
    result = run(with_hosts_file(bootstrap_argv(), hosts_file), env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the entry point launches its own workers" in result.stderr
    log = (tree.output / "data/container-entry/logs/rank-0.log").read_text().splitlines()
    for rank in (0, 1):
        said = f"worker {rank} says {MASK} and {MASK}"
        assert f"[algo-1] {said}" in result.stdout.splitlines(), result.stdout[-3000:]
        assert f"[algo-1] {said}" in result.stderr.splitlines(), result.stderr[-3000:]
        assert log.count(said) == 2, log  # its stdout line and its stderr line
    # the workers' lines are the only ones on stdout: each one tagged with the host alone
    lines = [line for line in result.stdout.splitlines() if line]
    assert lines and all(line.startswith("[algo-1] ") for line in lines), lines
    assert sorted(line for line in lines if "started rank" in line) == [
        "[algo-1] started rank 0 of 2",
        "[algo-1] started rank 1 of 2",
    ]
    seen = published(tree, result.stdout, result.stderr)
    assert_no_form_anywhere(seen, [ENV_SECRET, HP_SECRET])


def test_workers_of_the_users_launcher_that_go_silent_are_a_hang(tmp_path, hosts_file):
    """mp.spawn's worker 1 sleeps forever without a word after the first barrier, worker 0
    waits for it in an all_reduce (gloo's own timeout: 30 min), the entry point waits in
    mp.spawn's join: with HANG_TIMEOUT=10 the watchdog declares the hang (no output and no
    progress report for 10 s: the probe reports progress through its start-up, so the
    silence is the workers'), the job exits 124 and the failure file says hung, with where
    the entry point was; no worker of the user's launcher outlives the job."""
    started = time.monotonic()
    (host,) = start_job(
        tmp_path, PROBE, 1, 2, hosts_file, HANG="1", CONTAINER_ENTRY_HANG_TIMEOUT=str(HANG_TIMEOUT)
    )
    code, err = host.finish(timeout=120)
    elapsed = time.monotonic() - started
    assert code == 124, err[-3000:]
    line = host.first_line()
    assert line.startswith("hung: "), line
    assert line.endswith(f"no output from any rank for {HANG_TIMEOUT} s"), line
    text = (host.tree.output / "failure").read_text()
    assert f"was at {PROBE}:" in text, text  # the entry point's stack, from its slot
    assert elapsed < HANG_TIMEOUT + 60, elapsed  # never gloo's 30 min
    pids = worker_pids(host.tree)
    assert len(pids) == 2, pids  # both of mp.spawn's workers had started
    assert not any(alive(pid) for pid in pids), pids


def test_a_crash_in_a_users_worker_on_algo_2_is_the_first_failure_on_both_hosts(
    tmp_path, hosts_file
):
    """torchrun.sh makes one world across the hosts; its worker rank 1 (on algo-2) raises at
    step 2. algo-1's own worker then fails too (its peer's connection breaks): the relay makes
    algo-2's crash the job's one first failure, the same first line on both hosts, naming
    algo-2, the user's worker and its exception. One worker per host: the check is of hosts."""
    job = start_job(tmp_path, "torchrun.sh", 2, 1, hosts_file, CRASH="1", STEPS="40")
    results = [host.finish(timeout=180) for host in job]
    assert all(code != 0 for code, _ in results), [err[-3000:] for _, err in results]
    lines = {host.first_line() for host in job}
    assert len(lines) == 1, lines
    line = lines.pop()
    assert line.startswith("torchrun.sh on algo-2 (once per host): exit code 1: "), line
    assert "worker rank 1 (local 0)" in line, line
    assert "ValueError: planted failure on rank 1" in line, line
    assert line.endswith("[first failure]"), line


def test_algo_2_s_bootstrap_killed_ends_algo_1_naming_it(tmp_path, hosts_file):
    """Liveness: torchrun.sh trains across the hosts (one worker per host) when algo-2's
    bootstrap is SIGKILLed. Its entry point and the workers live on (nothing told them), so
    algo-1's training would go on: its side channel sees algo-2's connection close, and algo-1
    stops within the bound docs/liveness.md states, naming algo-2."""
    settings = {"STEPS": "100000", "CONTAINER_ENTRY_FAILURE_GRACE_PERIOD": str(GRACE)}
    job = start_job(tmp_path, "torchrun.sh", 2, 1, hosts_file, **settings)
    master, member = job
    leftovers: list[int] = []
    try:
        assert wait_for(lambda: all(h.started() for h in job), 120), "the job did not start"
        time.sleep(1.0)  # a few steps together
        leftovers = descendants(member.process.pid)  # they outlive their bootstrap
        os.kill(member.process.pid, signal.SIGKILL)
        killed = time.monotonic()
        code, err = master.finish(timeout=EXITED_WITHIN + 10)
        took = time.monotonic() - killed
        print(f"algo-2's bootstrap killed: algo-1 exited after {took:.1f} s")
        assert code != 0, err[-3000:]
        line = master.first_line()
        assert line.startswith("host algo-2 left the job without a word"), line
        assert took <= EXITED_WITHIN, (took, err[-3000:])
    finally:
        running = [host for host in job if host.process.returncode is None]
        kill_everything([], leftovers + [host.process.pid for host in running])
        for host in running:
            host.process.communicate(timeout=30)


@pytest.mark.parametrize("entry", sorted(LAUNCHER_FUNCTIONS))
def test_a_launcher_function_forms_its_world_once_per_host(tmp_path, hosts_file, entry):
    """Two forms of the detection table run for real, one host, 2 workers (PET_NPROC_PER_NODE=2):
    taken for a launcher at the line that calls it, run once, its world exactly the 2 workers
    it asked for (no copy per worker of ours), exit 0."""
    (host,) = start_job(tmp_path, entry, 1, 2, hosts_file)
    code, err = host.finish(timeout=120)
    assert code == 0, err[-3000:]
    assert "the entry point launches its own workers" in err, err[-3000:]
    assert f"{entry} line" in err and f"runs {LAUNCHER_FUNCTIONS[entry]}" in err, err[-3000:]
    ranks = sorted(host.ranks(), key=lambda facts: facts["rank"])
    assert [(f["rank"], f["world"], f["sum"]) for f in ranks] == [(0, 2, 2), (1, 2, 2)], ranks
    assert (host.tree.output / "success").exists()


# Launchers not installed here (no MPI, no DeepSpeed, no Horovod): a stand-in of each on PATH
# records its command line where the host's SM_OUTPUT_DATA_DIR says, as the DLC gives it.
STAND_IN = '#!/bin/sh\nprintf "%s\\n" "$(basename "$0") $*" >> "$SM_OUTPUT_DATA_DIR/calls.txt"\n'
ENTRY = '#!/bin/bash\nset -e\ncd "$(dirname "$0")"\n{launcher} --num_gpus 2 worker.py --epochs 1\n'


@pytest.mark.parametrize("launcher", ["deepspeed", "mpirun", "horovodrun"])
def test_a_launcher_not_installed_here_runs_once_on_each_host(
    tmp_path, hosts_file, monkeypatch, launcher
):
    """deepspeed, mpirun and horovodrun in a shell entry point, 2 hosts x 2 workers of ours
    (a 2-GPU instance): each host runs the entry point once, so its launcher is called once
    per host (never once per worker of ours), and the plan names the line that launches."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / launcher).write_text(STAND_IN)
    (tools / launcher).chmod(0o755)
    entry = f"{launcher}.sh"
    monkeypatch.setitem(SPANS, entry, False)
    files = {entry: ENTRY.format(launcher=launcher)}
    path = f"{tools}:{os.path.dirname(sys.executable)}:/usr/bin:/bin"
    job = start_job(tmp_path, entry, 2, 2, hosts_file, files=files, PATH=path)
    for host in job:
        code, err = host.finish()
        assert code == 0, err[-3000:]
        assert f"{entry} line 4 runs {launcher}" in err, err[-3000:]
        calls = (host.tree.output / "data" / "calls.txt").read_text().splitlines()
        assert calls == [f"{launcher} --num_gpus 2 worker.py --epochs 1"], calls
