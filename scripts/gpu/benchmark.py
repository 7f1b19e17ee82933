"""GPU benchmark: one HF model under DataParallel (the incumbent's default) and our DDP launch.

The DLC's default runs the training script once per host; the HF Trainer then sees every GPU
in one process and wraps the model in `nn.DataParallel`, which keeps the master weights, the
optimizer state and the gathered outputs on GPU 0. Our image launches one DDP process per GPU
instead. This script trains the same model (built from a config, nothing is downloaded) with
the same per-GPU batch both ways, in alternation, and prints per-GPU peak memory (max/min
across GPUs) and samples per second.

Run it on a machine with GPUs, inside our image built on the GPU DLC (so `container-entry
train` is our launch), under its own tag: `make bench` rebuilds `container-entry:bench` from the
CPU stand-in and would replace a GPU build kept under that name.

    make build IMAGE=container-entry:gpu-bench      # BASE_IMAGE defaults to the GPU DLC
    docker run --gpus all --rm --shm-size 8g -v "$PWD":/w -w /w container-entry:gpu-bench \\
        python scripts/gpu/benchmark.py --write-docs docs/benchmarks.md

Fair comparison: both variants run in the same container, with the same environment, the same
per-GPU batch and the same precision. bf16 is applied by the script itself (autocast entered
around the model's forward, inside DataParallel's replica threads too), not by the Trainer's
`bf16=True`: under `nn.DataParallel` the Trainer prepares only the optimizer, so accelerate's
autocast never wraps the model there. A forward hook records the dtype that actually ran. An
out-of-memory error (DataParallel's GPU 0, the seed's point) is a result in the table, not a
crash. Memory per GPU: peak allocated, peak reserved (the caching allocator) and the device's
peak used memory (`cudaMemGetInfo`, which includes the CUDA context and NCCL's buffers).

Multi-GPU host (e.g. 8 GPUs): the same command; every visible GPU is used
(`--gpus '"device=0,1"'` or CUDA_VISIBLE_DEVICES picks fewer). DataParallel runs one process
over all of them; ours runs one process per GPU. On 1 GPU both are a single process on one
device: the run then shows only that ours costs nothing per step (samples/s, peak memory);
the memory imbalance of DataParallel needs 2 or more GPUs. Outside our image the DDP side
falls back to plain `torchrun --nproc-per-node <GPUs>` (and says so).

    --device cpu   smoke test of the plumbing on a machine without GPUs (tiny model, gloo)

This file is the command line and the runs in alternation; gpu_benchmark_worker.py is one
rank's training (this file run with --worker), gpu_benchmark_report.py the table, doc_block.py
writes it into the page. Run by path, the four need only sit in one folder.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING or __package__:  # python -m scripts.gpu.benchmark, or imported
    from scripts import doc_block
    from scripts.gpu import benchmark_report as gpu_benchmark_report
    from scripts.gpu import benchmark_worker as gpu_benchmark_worker
else:  # run by path (the workers always are): the sibling files, whatever `scripts` is here,
    # and doc_block.py from the folder above (searched last: nothing there hides another module)
    sys.path.append(str(Path(__file__).resolve().parents[1]))
    import benchmark_report as gpu_benchmark_report
    import benchmark_worker as gpu_benchmark_worker
    import doc_block

SCRIPT = Path(__file__).resolve()
GPU_BEGIN, GPU_END = "<!-- gpu-results:begin -->", "<!-- gpu-results:end -->"
LABELS = ("dataparallel", "ddp")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's options, and the worker's (hidden); --size and --seq-len default by
    device."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--size", choices=sorted(gpu_benchmark_worker.SIZES), default=None)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=8, help="per GPU")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--fp32", action="store_true", help="no bf16")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per training run")
    parser.add_argument("--write-docs", type=Path, help="replace the GPU block of this page")
    parser.add_argument("--json", type=Path, help="raw results")
    # worker-only
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--label", default="run", help=argparse.SUPPRESS)
    parser.add_argument("--result-dir", default=".", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.size is None:
        args.size = "small" if args.device == "cuda" else "tiny"
    if args.device == "cpu" and not args.worker:
        args.seq_len = min(args.seq_len, 64)
    return args


def gpu_facts() -> dict[str, str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        out = ""
    rows = [r.strip() for r in out.splitlines() if r.strip()]
    return {
        "gpus": f"{len(rows)} x {rows[0]}" if rows else "none",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def variant_command(
    label: str, args: argparse.Namespace, n_devices: int, result_dir: Path
) -> tuple[list[str], dict[str, str]]:
    """How a variant's workers start: this file with --worker, as one process (DataParallel)
    or one per device under `container-entry train`, else torchrun (DDP); and their
    environment."""
    common = [
        "--worker", "--label", label, "--result-dir", str(result_dir),
        "--size", args.size, "--seq-len", str(args.seq_len), "--batch-size",
        str(args.batch_size), "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--device", args.device, *(["--fp32"] if args.fp32 else []),
    ]  # fmt: skip
    env = dict(os.environ)
    if args.device == "cpu":
        env.update(CUDA_VISIBLE_DEVICES="", ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1")
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    if label == "dataparallel":
        command = [sys.executable, str(SCRIPT), *common]
    elif shutil.which("container-entry"):
        command = ["container-entry", "train", str(SCRIPT), *common]
        env["PET_NPROC_PER_NODE"] = str(n_devices)  # on GPUs it is the default anyway
    else:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n_devices),
            str(SCRIPT), *common,
        ]  # fmt: skip
    return command, env


def run_variant(label: str, args: argparse.Namespace, n_devices: int, result_dir: Path) -> dict:
    """One training run of a variant; its result from what its ranks recorded."""
    command, env = variant_command(label, args, n_devices, result_dir)
    for stale in result_dir.glob(f"{label}-rank*.json"):
        stale.unlink()
    print(f"$ {' '.join(command)}", flush=True)
    done = subprocess.run(command, env=env, timeout=args.timeout)
    records = [json.loads(p.read_text()) for p in sorted(result_dir.glob(f"{label}-rank*.json"))]
    launcher = command[0] if label == "ddp" else "python (one process)"
    return gpu_benchmark_report.collect(label, launcher, done.returncode, records)


def device_count(device: str) -> int:
    """The devices the variants spread over: every visible GPU, or 2 CPU processes."""
    if device != "cuda":
        return 2
    import torch

    return torch.cuda.device_count()


def compare(args: argparse.Namespace, n_devices: int) -> list[dict]:
    """Both variants, round after round, the order flipped every round."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as scratch:
        for round_ in range(args.rounds):
            order = LABELS if round_ % 2 == 0 else LABELS[::-1]
            for label in order:
                result = run_variant(label, args, n_devices, Path(scratch))
                result["round"] = round_
                runs.append(result)
                print(json.dumps(result), flush=True)
    return runs


def main() -> int:
    args = parse()
    if args.worker:
        return gpu_benchmark_worker.worker(args, gpu_benchmark_worker.SIZES[args.size])
    n_devices = device_count(args.device)
    if not n_devices:
        print("no CUDA device visible: run with --gpus all, or --device cpu for a smoke test")
        return 2
    facts = gpu_facts()
    runs = compare(args, n_devices)
    block = gpu_benchmark_report.report(runs, args, n_devices, facts)
    print("\n" + block)
    if args.json:
        args.json.write_text(json.dumps({"facts": facts, "runs": runs}, indent=1))
    if args.write_docs:
        doc_block.write_block(args.write_docs, block, GPU_BEGIN, GPU_END, append=True)
        print(f"written: {args.write_docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
