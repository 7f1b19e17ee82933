"""Who holds a GPU's memory after a CUDA OOM (container_entry.diagnose.gpu_memory): a fake
`nvidia-smi` on PATH stands in for the driver of an 8-GPU host (no GPU here); the processes it
reports are real ones started by the test, announced as ranks the way the worker wrappers announce
them."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from container_entry.common.records import WorkerPids
from container_entry.common.workers import children
from container_entry.diagnose import gpu_memory

UUIDS = [f"GPU-{i:08d}-aaaa" for i in range(8)]


def fake_smi(folder, apps: list[tuple[int, int, int]]):
    """`nvidia-smi` answering the two queries: 8 GPUs, and compute apps (pid, gpu, MiB)."""
    folder.mkdir(exist_ok=True)
    gpus = "\n".join(f"{i}, {uuid}" for i, uuid in enumerate(UUIDS))
    rows = "\n".join(f"{pid}, {UUIDS[gpu]}, {mib}" for pid, gpu, mib in apps)
    script = folder / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --query-gpu=*) printf "%s\\n" "{gpus}";;\n'
        f'  --query-compute-apps=*) printf "%s\\n" "{rows}";; esac\n'
    )
    script.chmod(0o755)
    return folder


@pytest.fixture
def ranks():
    """Eight sleeping processes standing in for ranks 0-7 of this host (wrapper = script)."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(8)
    ]
    yield {
        r: WorkerPids(rank=r, wrapper=p.pid, child=p.pid, host="algo-1")
        for r, p in enumerate(procs)
    }
    for p in procs:
        p.kill()
        p.wait()


def test_every_rank_s_context_on_gpu_0_is_named_with_its_size(tmp_path, monkeypatch, ranks):
    apps = [(ranks[0].child, 0, 72909)] + [(ranks[r].child, 0, 520) for r in range(1, 8)]
    apps += [(ranks[r].child, r, 70000) for r in range(1, 8)]  # each on its own GPU too
    apps.append((999_999, 0, 1024))  # not a rank of this host
    monkeypatch.setenv("PATH", f"{fake_smi(tmp_path / 'bin', apps)}:/usr/bin:/bin")
    found = gpu_memory.holders(0, ranks)
    line = gpu_memory.report(0, "algo-1", 0, found)
    assert line.startswith(
        "CUDA out of memory on GPU 0 (algo-1): rank 0 holds 71.2 GiB; ranks 1-7 hold 3.6 GiB "
        "more on it (about 520 MiB each: a CUDA context each made on GPU 0, usually a library "
        "touching CUDA before torch.cuda.set_device, or torch.load without map_location)"
    ), line
    assert line.endswith("processes that are no rank of algo-1 (pid 999999) hold 1.0 GiB")


def test_the_failed_rank_gone_and_a_child_of_a_rank_counted_as_that_rank(tmp_path, monkeypatch):
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; "
         "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"]
    )  # fmt: skip
    try:
        # two Pythons to start before the child shows: up to seconds each under load, so a
        # generous cap (60 s), left as soon as the child is there
        deadline = time.monotonic() + 60.0
        while not (kids := children(parent.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert kids, "the rank's child never started"
        ranks = {3: WorkerPids(rank=3, wrapper=parent.pid, child=parent.pid)}
        monkeypatch.setenv("PATH", f"{fake_smi(tmp_path / 'bin', [(kids[0], 0, 600)])}:/usr/bin")
        line = gpu_memory.report(0, "algo-2", 0, gpu_memory.holders(0, ranks))
        assert line == (
            "CUDA out of memory on GPU 0 (algo-2): rank 0 had exited; rank 3 holds 0.6 GiB more "
            "on it (about 600 MiB each: a CUDA context each made on GPU 0, usually a library "
            "touching CUDA before torch.cuda.set_device, or torch.load without map_location)"
        )
    finally:
        for proc in children(parent.pid):
            subprocess.run(["kill", str(proc)], check=False)
        parent.kill()
        parent.wait()


@pytest.mark.parametrize(
    ("visible", "expected"), [(None, 0), ("", 0), ("2,5", 2), ("GPU-abc,GPU-def", 0)]
)
def test_the_device_a_rank_ran_out_of_through_cuda_visible_devices(visible, expected):
    message = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB"
    assert gpu_memory.oom_device(message, visible) == expected
    assert gpu_memory.oom_device("CUDA error: out of memory", visible) is None
