"""A worker killed mid-training: torchrun restarts the group (container_entry_max_restarts)
and the example script resumes from the newest checkpoint in /opt/ml/checkpoints."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from tests.integration.conftest import REPO, bootstrap_argv, bootstrap_env, control_dir, make_tree


def test_killed_worker_restarts_and_resumes_from_the_checkpoint(tmp_path):
    tree = make_tree(
        tmp_path,
        script=None,
        hyperparameters={
            "max-steps": "40",
            "save-steps": "10",
            "step-sleep": "0.3",
            "container_entry_max_restarts": "1",
        },
    )
    for name in ("hf_trainer_resume.py", "hf_trainer_tiny.py"):
        shutil.copy(REPO / "examples" / name, tree.base / "code" / name)
    env = bootstrap_env(tree, SAGEMAKER_PROGRAM="hf_trainer_resume.py", PET_NPROC_PER_NODE="2")
    process = subprocess.Popen(
        bootstrap_argv(), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    checkpoint = tree.base / "checkpoints" / "checkpoint-10" / "trainer_state.json"
    pids = control_dir(process.pid) / "rank-1.pid"
    deadline = time.monotonic() + 240
    while not (checkpoint.exists() and pids.exists()) and time.monotonic() < deadline:
        if process.poll() is not None:  # the job ended before the kill: say how
            break
        time.sleep(0.2)
    if not (checkpoint.exists() and pids.exists()):
        process.kill()
        output, _ = process.communicate(timeout=60)
        pytest.fail(
            f"no checkpoint-10 or rank 1 pid file (job exit {process.returncode}):\n{output}"
        )
    record = json.loads(pids.read_text())
    os.kill(record["child"], signal.SIGKILL)  # the rank dies mid-training
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output[-4000:]
    assert "attempt 1: resuming from" in output
    for rank in (0, 1):
        resume = json.loads((tree.output / "data" / f"resume-rank-{rank}.json").read_text())
        assert resume["restart_count"] == 1
        assert resume["resumed_from_step"] >= 10  # continued, not restarted from zero
        assert resume["global_step"] == 40
    assert (tree.output / "success").exists()
