"""`container-entry stacks` on a live job: every rank's current stacks, the job carries on."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from container_entry.common.layout import RunDir
from tests.integration.conftest import REPO, bootstrap_argv, bootstrap_env, make_tree

FAULT = REPO / "tests" / "scripts" / "fault_probe.py"


def this_jobs(stdout: str, tree, rank: int) -> list[str]:
    """The stack lines `stacks` printed for this job's rank (other tests' jobs run beside it:
    each rank's block ends with the file it is also in, this job's own)."""
    prefix = f"[algo-1 rank {rank}] "
    end = f"(also in {RunDir.of(tree.base).stack(rank)})"
    block: list[str] = []
    for line in stdout.splitlines():
        if not line.startswith(prefix):
            continue
        if line[len(prefix) :] == end:
            return block
        block = [] if line[len(prefix) :].startswith("(also in ") else [*block, line]
    return []


def test_stacks_of_a_running_job_without_stopping_it(tmp_path):
    tree = make_tree(tmp_path, script=FAULT)
    # the job runs until the test has its stacks (the file), not a fixed number of steps: a
    # stalled `stacks` start must not find the job ended; 240 x 0.5 s is only a cap
    done = tmp_path / "done"
    hps = {"steps": "240", "step-seconds": "0.5", "until-file": str(done)}
    tree.base.joinpath("input/config/hyperparameters.json").write_text(json.dumps(hps))
    env = bootstrap_env(tree, SAGEMAKER_PROGRAM="fault_probe.py", PET_NPROC_PER_NODE="2")
    job = subprocess.Popen(
        bootstrap_argv(), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    logs = tree.output / "data" / "container-entry" / "logs"
    try:
        deadline = time.monotonic() + 120
        while sum("step 1 rank" in p.read_text() for p in logs.glob("rank-*.log")) < 2:
            assert time.monotonic() < deadline and job.poll() is None, "no step 1 on every rank"
            time.sleep(0.1)
        # asked once: the command waits for every asked rank (a loaded machine may schedule
        # one seconds late), up to the 10 s only a stopped or stuck rank outlasts
        shown = subprocess.run(
            [sys.executable, "-m", "container_entry", "stacks"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        stacks = {rank: this_jobs(shown.stdout, tree, rank) for rank in (0, 1)}
        running = job.poll() is None
    finally:
        done.touch()
    _, err = job.communicate(timeout=120)
    assert running, err[-3000:]  # the stacks were taken while it ran, and it went on
    assert shown.returncode == 0, shown.stderr
    for rank in (0, 1):
        assert any('fault_probe.py", line' in line for line in stacks[rank]), shown.stdout
    assert job.returncode == 0, err[-3000:]  # the job finished normally
    assert (tree.output / "success").exists()


def test_stacks_without_a_running_job_says_so(tmp_path, capsys):
    from container_entry.diagnose.stacks import print_live_stacks

    (tmp_path / "999999999-job").mkdir()  # a control folder whose bootstrap is gone
    assert print_live_stacks(tmp_path) == 1
    assert "no running job" in capsys.readouterr().err
