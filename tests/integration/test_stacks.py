"""`container-entry stacks` on a live job: every rank's current stacks, the job carries on."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from tests.integration.conftest import REPO, bootstrap_argv, bootstrap_env, make_tree

FAULT = REPO / "tests" / "scripts" / "fault_probe.py"


def test_stacks_of_a_running_job_without_stopping_it(tmp_path):
    tree = make_tree(tmp_path, script=FAULT)
    hps = {"steps": "12", "step-seconds": "0.5"}
    tree.base.joinpath("input/config/hyperparameters.json").write_text(json.dumps(hps))
    env = bootstrap_env(tree, SAGEMAKER_PROGRAM="fault_probe.py", PET_NPROC_PER_NODE="2")
    job = subprocess.Popen(
        bootstrap_argv(), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    logs = tree.output / "data" / "container-entry" / "logs"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if sum("step 1 rank" in p.read_text() for p in logs.glob("rank-*.log")) == 2:
            break
        time.sleep(0.1)
    shown = subprocess.run(
        [sys.executable, "-m", "container_entry", "stacks"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    _, err = job.communicate(timeout=120)
    assert shown.returncode == 0, shown.stderr
    for rank in (0, 1):
        lines = [
            line for line in shown.stdout.splitlines() if line.startswith(f"[algo-1 rank {rank}] ")
        ]
        assert any('fault_probe.py", line' in line for line in lines), shown.stdout
        assert lines[-1].endswith(f"stacks/rank-{rank}.txt)")
    assert job.returncode == 0, err[-3000:]  # the job finished normally
    assert (tree.output / "success").exists()


def test_stacks_without_a_running_job_says_so(tmp_path, capsys):
    from container_entry.diagnose.stacks import print_live_stacks

    (tmp_path / "999999999-job").mkdir()  # a control folder whose bootstrap is gone
    assert print_live_stacks(tmp_path) == 1
    assert "no running job" in capsys.readouterr().err
