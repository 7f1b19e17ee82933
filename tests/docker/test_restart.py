"""Restart across hosts: a worker on algo-2 is killed mid-training, torchrun's c10d rendezvous
restarts the group on both containers and the example resumes from each host's checkpoint."""

from __future__ import annotations

import json
import re
import time

from scripts.local.cluster import Cluster
from tests.docker.conftest import REPO


def test_worker_killed_on_host_two_restarts_both_hosts_and_resumes(image, train_data, tmp_path):
    job = Cluster(
        image=image,
        root=tmp_path,
        hosts=("algo-1", "algo-2"),
        hyperparameters={
            "sagemaker_program": '"hf_trainer_resume.py"',
            "max-steps": "40",
            "save-steps": "10",
            "step-sleep": "0.3",
            "container_entry_max_restarts": "1",
        },
        environment={"PET_NPROC_PER_NODE": "2"},
        channels={"train": {"data.jsonl": train_data}},
        code={
            name: (REPO / "examples" / name).read_bytes()
            for name in ("hf_trainer_resume.py", "hf_trainer_tiny.py")
        },
    )
    try:
        job.start()
        algo2 = job.tree("algo-2")
        checkpoint = algo2 / "checkpoints" / "checkpoint-10" / "model.safetensors"
        deadline = time.monotonic() + 300
        while not checkpoint.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert checkpoint.exists(), "algo-2 wrote no checkpoint"
        container = dict(job.containers)["algo-2"]
        # the bootstrap is PID 1 in the container: its workers' pid files
        # (container_entry.common.layout)
        found = container.exec_run(["cat", "/tmp/container-entry/1-job/rank-3.pid"])
        assert found.exit_code == 0, found.output
        pid = json.loads(found.output)["child"]
        assert container.exec_run(["kill", "-9", str(pid)]).exit_code == 0  # rank 3 dies
        results = job.wait(timeout=400)
    finally:
        job.cleanup()
    logs = "\n".join(f"--- {r.host}\n{r.logs[-3000:]}" for r in results)
    assert [r.exit_code for r in results] == [0, 0], logs
    resumed = {}
    assert "attempt 1: resuming from" in results[1].logs, logs
    for result in results:
        assert (result.tree / "output" / "success").exists()
        # preflight on (2 hosts), once per host: the restarted group did not run it again
        assert result.logs.count(f"preflight ok on {result.host}:") == 1, result.logs[-3000:]
        for path in (result.tree / "output" / "data").glob("resume-rank-*.json"):
            record = json.loads(path.read_text())
            resumed[record["rank"]] = record
    assert sorted(resumed) == [0, 1, 2, 3], resumed
    for rank, record in resumed.items():
        # torchrun counts the restart on the host whose worker failed; algo-1's agent either
        # re-joins the new rendezvous round (a membership change, count 0) or, when its own
        # workers failed first (a collective with the dead rank), counts one as well: both
        # were seen here. Either way the preflight ran once per host (its marker, not the count).
        assert record["restart_count"] in ((1,) if rank >= 2 else (0, 1)), record
        assert record["resumed_from_step"] >= 10  # continued, not restarted from zero
        assert record["global_step"] == 40


PERMANENT = b"""import os
print(f"attempt {os.environ.get('TORCHELASTIC_RESTART_COUNT')} on {os.environ['CURRENT_HOST']}")
if os.environ["CURRENT_HOST"] == "algo-2":
    import no_such_module  # noqa: F401  (a dependency missing from the image)
import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
"""


def test_a_failure_a_restart_would_repeat_ends_both_hosts_without_restarting(image, tmp_path):
    """MAX_RESTARTS=2 across two containers: a ModuleNotFoundError on algo-2 fails the job at
    once (no restart would import the module) instead of burning both restarts."""
    job = Cluster(
        image=image,
        root=tmp_path,
        hosts=("algo-1", "algo-2"),
        hyperparameters={"sagemaker_program": '"train.py"', "container_entry_max_restarts": "2"},
        environment={"PET_NPROC_PER_NODE": "2"},
        code={"train.py": PERMANENT},
    )
    started = time.monotonic()
    results = job.run(timeout=300)
    took = time.monotonic() - started
    logs = "\n".join(f"--- {r.host}\n{r.logs[-3000:]}" for r in results)
    assert [r.exit_code for r in results] == [1, 1], logs
    algo1, algo2 = results
    first = (algo2.tree / "output/failure").read_text().splitlines()[0]
    assert re.fullmatch(
        r"rank \d \(local \d\) on algo-2: exit code 1: ModuleNotFoundError: No module named "
        r"'no_such_module' \(not restarted: a ModuleNotFoundError fails the same way on every "
        r"restart\) \[first failure\]",
        first,
    ), first
    assert "algo-2" in (algo1.tree / "output/failure").read_text().splitlines()[0]
    assert "attempt 0 on algo-2" in algo2.logs and "attempt 1" not in algo1.logs + algo2.logs
    print(f"docker: permanent failure with 2 restarts allowed -> both exited in {took:.1f} s")
