"""Failure and stop in the two-container cluster: the rows of the failure issue that need
real hosts (each with its own PID 1 bootstrap, network and /opt/ml)."""

from __future__ import annotations

import json
import time
from datetime import datetime

from local_cluster import Cluster  # scripts/, put on sys.path by conftest

from tests.docker.conftest import REPO

FAULT = REPO / "tests" / "scripts" / "fault_probe.py"


def cluster(image, root, hyperparameters, **environment):
    return Cluster(
        image=image,
        root=root,
        hosts=("algo-1", "algo-2"),
        hyperparameters={"sagemaker_program": '"fault_probe.py"', **hyperparameters},
        environment={"PET_NPROC_PER_NODE": "2", **environment},
        code={"fault_probe.py": FAULT.read_bytes()},
    )


def finished(result) -> float:
    """docker's FinishedAt (nanosecond RFC 3339) as epoch seconds."""
    stamp = result.finished_at.rstrip("Z")
    whole, _, fraction = stamp.partition(".")
    moment = datetime.fromisoformat(whole + "+00:00").timestamp()
    return moment + float("0." + (fraction or "0"))


def test_rank_failing_on_host_two_ends_both_hosts_within_15_s(image, tmp_path):
    hps = {
        "fault": '"raise"',
        "fault-rank": "3",
        "fault-step": "3",
        "steps": "1000",
        "step-seconds": "0.2",
    }
    results = cluster(image, tmp_path, hps).run(timeout=300)
    logs = "\n".join(f"--- {r.host}\n{r.logs[-2500:]}" for r in results)
    assert [r.exit_code for r in results] == [1, 1], logs
    record = json.loads((results[1].tree / "output/data/container-entry/rank-3.json").read_text())
    for result in results:
        first = (result.tree / "output" / "failure").read_text().splitlines()[0]
        assert first.startswith(
            "rank 3 (local 1) on algo-2: exit code 1: ValueError: planted failure at step 3"
        ), first
    latency = max(finished(r) for r in results) - record["ended_at"]
    assert latency < 15, latency
    print(f"docker: failure on algo-2 -> both containers exited: {latency:.1f} s")


def test_docker_stop_signals_every_rank_and_keeps_the_checkpoint(image, tmp_path):
    job = cluster(
        image, tmp_path, {"steps": "100000", "step-seconds": "0.2", "checkpoint-on-term": "true"}
    )
    try:
        job.start()
        logs = [job.tree(h) / "output/data/container-entry/logs" for h in job.hosts]
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            started = sum("started rank" in p.read_text() for d in logs for p in d.glob("*.log"))
            if started == 4:
                break
            time.sleep(0.5)
        assert started == 4
        time.sleep(2)
        sent = time.time()
        job.stop(timeout=30)
        results = job.wait(timeout=60)
    finally:
        job.cleanup()
    assert [r.exit_code for r in results] == [143, 143], [r.logs[-2000:] for r in results]
    latencies = []
    for result in results:
        data = result.tree / "output" / "data"
        latencies += [float(p.read_text()) - sent for p in data.glob("term-rank-*.txt")]
        checkpoints = sorted(p.name for p in (result.tree / "checkpoints").iterdir())
        assert len(checkpoints) == 2, checkpoints
        assert (result.tree / "output/failure").read_text().startswith("job stopped by SIGTERM")
    assert len(latencies) == 4 and max(latencies) < 1.0, latencies
    print(f"docker stop -> every rank signalled: {max(latencies) * 1000:.0f} ms")
