"""The straggler watch between 2 real containers (docs/stragglers.md): once both train, algo-2's
container is starved of CPU (`docker update --cpus 0.2`) while algo-1's keeps its CPUs; every
step spends its work on the CPU, so algo-2 enters each collective last and algo-1, the master,
names that host."""

from __future__ import annotations

import subprocess
import time

from scripts.local.cluster import Cluster
from tests.docker.conftest import REPO

PROBE = REPO / "tests" / "scripts" / "straggler_probe.py"
INTERVAL = 5


def _said(container, text: str) -> bool:
    return text in container.logs().decode(errors="replace")


def test_a_cpu_starved_host_is_named_by_the_master(image, tmp_path):
    hps = {"steps": "100000", "work": "0.02", "busy": "1"}
    job = Cluster(
        image=image,
        root=tmp_path,
        hosts=("algo-1", "algo-2"),
        hyperparameters={"sagemaker_program": f'"{PROBE.name}"', **hps},
        environment={
            "PET_NPROC_PER_NODE": "1",
            "CONTAINER_ENTRY_PREFLIGHT": "false",
            "CONTAINER_ENTRY_STRAGGLER_INTERVAL": str(INTERVAL),
        },
        code={PROBE.name: PROBE.read_bytes()},
    )
    try:
        job.start()
        master, starved = (dict(job.containers)[h] for h in ("algo-1", "algo-2"))
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not _said(starved, "probe: training"):
            time.sleep(0.5)
        assert _said(starved, "probe: training"), starved.logs()[-3000:]
        subprocess.run(["docker", "update", "--cpus", "0.2", starved.id], check=True)
        starved_at = time.monotonic()
        while time.monotonic() - starved_at < 6 * INTERVAL and not _said(master, "straggler: "):
            time.sleep(0.5)
        took = time.monotonic() - starved_at
        logs = master.logs().decode(errors="replace")
        subprocess.run(["docker", "update", "--cpus", "2", starved.id], check=True)
        job.stop(timeout=60)
        job.wait(timeout=120)
    finally:
        job.cleanup()
    lines = [line for line in logs.splitlines() if "straggler: " in line]
    assert lines, logs[-3000:]
    assert "algo-2" in lines[0] and "algo-1" not in lines[0], lines
    print(f"named within {took:.0f} s of the starving: {lines[0]}")
