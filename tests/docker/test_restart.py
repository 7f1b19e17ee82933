"""Restart across hosts: a worker on algo-2 is killed mid-training, torchrun's c10d rendezvous
restarts the group on both containers and the example resumes from each host's checkpoint."""

from __future__ import annotations

import json
import time

from scripts.local_cluster import Cluster
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
        # the bootstrap is PID 1 in the container: its workers' pid files (container_entry.launch)
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
        for path in (result.tree / "output" / "data").glob("resume-rank-*.json"):
            record = json.loads(path.read_text())
            resumed[record["rank"]] = record
    assert sorted(resumed) == [0, 1, 2, 3], resumed
    for rank, record in resumed.items():
        # torchrun counts the restart on the host whose worker failed; algo-1's agent only
        # re-joins the new rendezvous round (a membership change, not a restart of its own)
        assert record["restart_count"] == (1 if rank >= 2 else 0)
        assert record["resumed_from_step"] >= 10  # continued, not restarted from zero
        assert record["global_step"] == 40
