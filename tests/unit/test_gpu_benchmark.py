"""scripts/gpu/benchmark.py's parts that run without a GPU: the precision applied the same way
in both variants (CPU autocast with bf16 stands in for CUDA's), the dtype recorded by a forward
hook, an out-of-memory run kept as a result, the report built from recorded runs, and the files
a bare GPU host needs to run it by path."""

import argparse
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from scripts.gpu import benchmark as gpu_benchmark
from scripts.gpu import benchmark_report as gpu_benchmark_report
from scripts.gpu import benchmark_worker as gpu_benchmark_worker
from tests.conftest import REPO

# what ../shared/gpu/prepare.sh copies to a GPU host: the benchmark runs by path from them alone
BY_PATH = ("gpu/benchmark.py", "gpu/benchmark_worker.py", "gpu/benchmark_report.py", "doc_block.py")


def tiny():
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))


def test_precision_runs_and_records_bf16_also_in_another_thread():
    """DataParallel calls each replica's forward in a thread of its own: an autocast the
    caller entered would not apply there, ours (a hook on the module) does."""
    model = tiny()
    precision = gpu_benchmark_worker.Precision("cpu", torch.bfloat16)
    precision.install(model, model[2])
    thread = threading.Thread(target=lambda: model(torch.randn(2, 8)))
    thread.start()
    thread.join()
    assert precision.ran == {"bfloat16"}
    model(torch.randn(2, 8))  # and again in this thread: the autocast was left cleanly
    assert not torch.is_autocast_enabled("cpu")


def test_precision_fp32_records_what_ran():
    model = tiny()
    precision = gpu_benchmark_worker.Precision("cpu", None)
    precision.install(model, model[2])
    model(torch.randn(2, 8))
    assert precision.ran == {"float32"}


def test_out_of_memory_is_recognised():
    assert gpu_benchmark_worker.is_oom(
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
    )
    assert gpu_benchmark_worker.is_oom(RuntimeError("CUDA error: out of memory"))
    assert not gpu_benchmark_worker.is_oom(ValueError("bad"))


def record(rank, rate, oom=None, used=(1, 2, 3)):
    return {
        "rank": rank,
        "world_size": 1,
        "n_gpu": 2,
        "parallel_mode": "ParallelMode.NOT_DISTRIBUTED",
        "model_wrapper": "DataParallel",
        "global_batch": 16,
        "samples_per_second": rate,
        "memory": {
            "0": dict(zip(("allocated", "reserved", "device_used"), used, strict=True)),
            "1": {"allocated": 1, "reserved": 1, "device_used": 1},
        },
        "precision_requested": "bf16",
        "dtype_ran": ["bfloat16"],
        "oom": oom,
        "env": {"OMP_NUM_THREADS": "4"},
    }


def test_an_oom_run_is_a_result_and_a_crash_is_not():
    oom = gpu_benchmark_report.collect(
        "dataparallel", "python", 3, [record(0, None, oom="OutOfMemoryError: x")]
    )
    assert oom["oom"] and oom["samples_per_second"] is None
    with pytest.raises(SystemExit, match="dataparallel failed"):
        gpu_benchmark_report.collect("dataparallel", "python", 1, [record(0, 5.0)])
    with pytest.raises(SystemExit):
        gpu_benchmark_report.collect("ddp", "container-entry", 0, [])


def test_report_shows_oom_dtype_and_memory_kinds():
    gib = 1 << 30
    dp = gpu_benchmark_report.collect(
        "dataparallel",
        "python",
        3,
        [record(0, None, "OutOfMemoryError: CUDA out of memory", (20 * gib, 22 * gib, 23 * gib))],
    )
    ddp_record = record(0, 40.0, used=(5 * gib, 6 * gib, 7 * gib))
    ddp_record["model_wrapper"] = "DistributedDataParallel"
    ddp = gpu_benchmark_report.collect("ddp", "container-entry", 0, [ddp_record])
    args = argparse.Namespace(
        device="cuda", size="small", seq_len=512, batch_size=8, steps=60, warmup=10, rounds=1
    )
    text = gpu_benchmark_report.report([dp, ddp], args, 2, {"date": "today", "gpus": "2 x A10G"})
    assert (
        "| incumbent default: one process, HF Trainer | DataParallel | bfloat16 | out of memory |"
        in text
    )
    assert (
        "| ours (DDP): one process per GPU | DistributedDataParallel | bfloat16 | 40.0 | "
        "5.00 / 0.00 | 6.00 / 0.00 | 7.00 / 0.00 |" in text
    )
    assert "DataParallel ran out of memory: `OutOfMemoryError: CUDA out of memory`." in text
    assert "image `container-entry:gpu-bench`" in text
    assert "Environments differed" not in text


def test_the_gpu_image_tag_is_not_the_one_make_bench_builds():
    makefile = (REPO / "Makefile").read_text()
    assert "IMAGE=container-entry:bench" in makefile
    assert gpu_benchmark_report.IMAGE != "container-entry:bench"


def snapshot_case(name: str) -> tuple[list[dict], argparse.Namespace, int, dict]:
    """Recorded runs for a report: `oom` (DataParallel out of memory on 2 GPUs, ours in the
    image), `torchrun` (2 rounds each, one DDP run out of memory, different environments, 1
    device, DDP outside our image, no GPU memory)."""
    gib = 1 << 30
    args = argparse.Namespace(
        device="cuda", size="small", seq_len=512, batch_size=8, steps=60, warmup=10, rounds=1
    )
    if name == "oom":
        dp_record = record(0, None, "OutOfMemoryError: CUDA out of memory", (20 * gib,) * 3)
        ddp_record = record(0, 40.0, used=(5 * gib, 6 * gib, 7 * gib))
        ddp_record["model_wrapper"] = "DistributedDataParallel"
        runs = [
            gpu_benchmark_report.collect("dataparallel", "python", 3, [dp_record]),
            gpu_benchmark_report.collect("ddp", "container-entry", 0, [ddp_record]),
        ]
        return runs, args, 2, {"date": "2026-12-04 17:49 UTC", "gpus": "2 x A10G"}
    args = argparse.Namespace(
        device="cpu", size="tiny", seq_len=64, batch_size=4, steps=20, warmup=5, rounds=2
    )
    runs = []
    for round_, (dp_rate, ddp_rate) in enumerate(((10.0, 12.5), (11.0, None))):
        dp_record = record(0, dp_rate)
        dp_record.update(memory={}, dtype_ran=["float32"], precision_requested="fp32")
        ranks = [record(r, ddp_rate, None if ddp_rate else "OutOfMemoryError: x") for r in (0, 1)]
        for rank in ranks:
            rank.update(memory={}, dtype_ran=["float32"], precision_requested="fp32")
            rank.update(model_wrapper="DistributedDataParallel", env={"OMP_NUM_THREADS": "1"})
        runs.append(
            gpu_benchmark_report.collect("dataparallel", "python (one process)", 0, [dp_record])
        )
        runs.append(
            gpu_benchmark_report.collect("ddp", "/usr/bin/python3", 3 if round_ else 0, ranks)
        )
    return runs, args, 1, {"date": "2026-12-05 08:00 UTC", "gpus": "none"}


@pytest.mark.parametrize("name", ["oom", "torchrun"])
def test_report_renders_as_the_snapshot(name, monkeypatch):
    """The block written into docs/benchmarks.md, byte for byte; regenerate after a deliberate
    change with UPDATE_SNAPSHOTS=1 and review the diff."""
    monkeypatch.setattr("sys.argv", ["gpu_benchmark.py", "--size", "small", "--rounds", "1"])
    if name == "torchrun":
        monkeypatch.setenv("CONTAINER_ENTRY_IMAGE", "container-entry:gpu-bench-2")
    else:
        monkeypatch.delenv("CONTAINER_ENTRY_IMAGE", raising=False)
    text = gpu_benchmark_report.report(*snapshot_case(name)) + "\n"
    path = Path(__file__).parent / "snapshots" / f"gpu-benchmark-{name}.md"
    if os.environ.get("UPDATE_SNAPSHOTS"):
        path.write_text(text)
    assert text == path.read_text(), f"report changed: UPDATE_SNAPSHOTS=1 and review {path}"


def test_it_runs_by_path_from_a_folder_of_its_files_only(tmp_path):
    """`python3 .dev/scripts/gpu/benchmark.py` on a bare GPU host, and each DDP worker (this
    file run by path under torchrun): its siblings, not whatever `scripts` package is around."""
    for name in BY_PATH:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        shutil.copy(REPO / "scripts" / name, tmp_path / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(tmp_path / "gpu" / "benchmark.py"), "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "--size {medium,small,tiny}" in done.stdout
    found = {f"gpu/{p.name}" for p in (REPO / "scripts" / "gpu").glob("benchmark*.py")}
    assert found <= set(BY_PATH)


def test_a_worker_starts_this_file_by_path(tmp_path):
    args = gpu_benchmark.parse(["--device", "cpu", "--steps", "5"])
    command, env = gpu_benchmark.variant_command("dataparallel", args, 2, tmp_path)
    assert command[:2] == [sys.executable, str(REPO / "scripts" / "gpu" / "benchmark.py")]
    assert command[2:5] == ["--worker", "--label", "dataparallel"]
    assert "--seq-len 64 " in " ".join(command) and env["CUDA_VISIBLE_DEVICES"] == ""
