"""GPU benchmark: one HF model under DataParallel (the incumbent's default) and our DDP launch.

The DLC's default runs the training script once per host; the HF Trainer then sees every GPU
in one process and wraps the model in `nn.DataParallel`, which keeps the master weights, the
optimizer state and the gathered outputs on GPU 0. Our image launches one DDP process per GPU
instead. This script trains the same model (built from a config, nothing is downloaded) with
the same per-GPU batch both ways, in alternation, and prints per-GPU peak memory (max/min
across GPUs) and samples per second.

Run it on a machine with GPUs, inside our image (so `container-entry train` is our launch):

    docker run --gpus all --rm --shm-size 8g -v "$PWD":/w -w /w container-entry:bench \\
        python scripts/gpu_benchmark.py --write-docs docs/benchmarks.md

Multi-GPU host (e.g. 8 GPUs): the same command; every visible GPU is used
(`--gpus '"device=0,1"'` or CUDA_VISIBLE_DEVICES picks fewer). DataParallel runs one process
over all of them; ours runs one process per GPU. On 1 GPU both are a single process on one
device: the run then shows only that ours costs nothing per step (samples/s, peak memory);
the memory imbalance of DataParallel needs 2 or more GPUs. Outside our image the DDP side
falls back to plain `torchrun --nproc-per-node <GPUs>` (and says so).

    --device cpu   smoke test of the plumbing on a machine without GPUs (tiny model, gloo)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve()
GPU_BEGIN, GPU_END = "<!-- gpu-results:begin -->", "<!-- gpu-results:end -->"
SIZES = {  # GPT-2 shaped models built from a config
    "tiny": dict(n_embd=64, n_layer=2, n_head=2),
    "small": dict(n_embd=768, n_layer=12, n_head=12),  # GPT-2 small, 124M parameters
    "medium": dict(n_embd=1024, n_layer=24, n_head=16),  # GPT-2 medium, 355M parameters
}


# ------------------------------------------------------------------------- worker (trains)
def worker(args: argparse.Namespace) -> None:
    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, n: int) -> None:
            g = torch.Generator().manual_seed(0)
            self.ids = torch.randint(0, 50257, (n, args.seq_len), generator=g)

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.times: dict[int, float] = {}

        def on_step_end(self, _args, state, _control, **_kwargs) -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.times[state.global_step] = time.time()

    config = GPT2Config(n_positions=max(1024, args.seq_len), **SIZES[args.size])
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    bf16 = args.device == "cuda" and torch.cuda.is_bf16_supported() and not args.fp32
    training_args = TrainingArguments(
        output_dir=os.path.join(tempfile.gettempdir(), "gpu-bench-trainer"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=1e-4,
        bf16=bf16,
        report_to=[],
        logging_steps=10**6,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=2,
        ddp_find_unused_parameters=False,
        seed=0,
    )
    clock = Clock()
    global_batch = training_args.train_batch_size * training_args.world_size
    data = Tokens(global_batch * (args.steps + 1))
    trainer = Trainer(model=model, args=training_args, train_dataset=data, callbacks=[clock])
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(index)
    trainer.train()

    last = max(clock.times)
    first = min(args.warmup, last - 1)
    rate = (last - first) * global_batch / (clock.times[last] - clock.times[first])
    rank = training_args.process_index
    peaks = {}
    if torch.cuda.is_available():
        # DataParallel: one process sees every GPU; DDP: each rank reports its own device
        if training_args.world_size == 1:
            devices = list(range(torch.cuda.device_count()))
        else:
            devices = [training_args.device.index or 0]
        peaks = {str(i): torch.cuda.max_memory_allocated(i) for i in devices}
    record = {
        "rank": rank,
        "world_size": training_args.world_size,
        "n_gpu": training_args.n_gpu,
        "parallel_mode": str(training_args.parallel_mode),
        "model_wrapper": type(trainer.model_wrapped).__name__,
        "global_batch": global_batch,
        "samples_per_second": rate,
        "peak_bytes": peaks,
        "bf16": bf16,
    }
    out = Path(args.result_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.label}-rank{rank}.json").write_text(json.dumps(record))
    print(f"[{args.label} rank {rank}] {json.dumps(record)}", flush=True)


# ------------------------------------------------------------------- orchestrator (compares)
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
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def run_variant(label: str, args: argparse.Namespace, n_devices: int, result_dir: Path) -> dict:
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
    for stale in result_dir.glob(f"{label}-rank*.json"):
        stale.unlink()
    print(f"$ {' '.join(command)}", flush=True)
    done = subprocess.run(command, env=env, timeout=args.timeout)
    records = [json.loads(p.read_text()) for p in sorted(result_dir.glob(f"{label}-rank*.json"))]
    if done.returncode or not records:
        raise SystemExit(f"{label} failed (exit {done.returncode})")
    peaks: dict[str, int] = {}
    for record in records:
        peaks.update(record["peak_bytes"])
    rank0 = next(r for r in records if r["rank"] == 0)
    return {
        "label": label,
        "launcher": command[0] if label == "ddp" else "python (one process)",
        "samples_per_second": rank0["samples_per_second"],
        "peaks": [peaks[k] for k in sorted(peaks, key=int)],
        "wrapper": rank0["model_wrapper"],
        "parallel_mode": rank0["parallel_mode"],
        "world_size": rank0["world_size"],
        "global_batch": rank0["global_batch"],
        "bf16": rank0["bf16"],
    }


def summarise(runs: list[dict], label: str) -> dict:
    mine = [r for r in runs if r["label"] == label]
    rates = [r["samples_per_second"] for r in mine]
    peaks = [max(col) for col in zip(*(r["peaks"] for r in mine), strict=True)] if mine else []
    return {
        "rates": rates,
        "peaks": peaks,
        "imbalance": (max(peaks) / min(peaks)) if peaks and min(peaks) else None,
        "first": mine[0] if mine else {},
    }


def report(runs: list[dict], args: argparse.Namespace, n_devices: int, facts: dict) -> str:
    gib = 1024**3
    dp, ddp = summarise(runs, "dataparallel"), summarise(runs, "ddp")

    def rate(s: dict) -> str:
        r = s["rates"]
        med = statistics.median(r)
        return f"{med:.1f}" + (f" ({min(r):.1f}-{max(r):.1f})" if len(r) > 1 else "")

    def mem(s: dict) -> str:
        if not s["peaks"]:
            return "n/a (no GPU)"
        return " / ".join(f"{p / gib:.2f}" for p in s["peaks"])

    def imbalance(s: dict) -> str:
        return f"{s['imbalance']:.2f}" if s["imbalance"] else "n/a"

    ratio = statistics.median(ddp["rates"]) / statistics.median(dp["rates"])
    launcher = ddp["first"].get("launcher", "")
    ddp_name = "ours (DDP)" if launcher == "container-entry" else "torchrun DDP (not in our image)"
    lines = [
        GPU_BEGIN,
        "## GPU: DataParallel (the incumbent's default) against our DDP launch",
        "",
        f"Generated by `python scripts/gpu_benchmark.py {' '.join(sys.argv[1:])}` on "
        f"{facts['date']}; GPUs: {facts['gpus']}; device `{args.device}`.",
        f"Model: GPT-2 `{args.size}` from its config, sequence {args.seq_len}, "
        f"{args.batch_size} per GPU (global batch {ddp['first'].get('global_batch')}), "
        f"{'bf16' if ddp['first'].get('bf16') else 'fp32'}, {args.steps} steps, rate from step "
        f"{args.warmup}; {args.rounds} round(s) in alternation (median (min-max)).",
        "",
        "| launch | model wrapper | samples/s | peak memory per GPU (GiB) | max/min |",
        "|---|---|---|---|---|",
        f"| incumbent default: one process, HF Trainer | {dp['first'].get('wrapper')} | "
        f"{rate(dp)} | {mem(dp)} | {imbalance(dp)} |",
        f"| {ddp_name}: one process per GPU | {ddp['first'].get('wrapper')} | {rate(ddp)} | "
        f"{mem(ddp)} | {imbalance(ddp)} |",
        "",
        f"DDP ÷ DataParallel samples/s: {ratio:.2f}.".replace("÷", "/"),
    ]
    if n_devices < 2:
        lines.append(
            "With 1 device both launches are one process on one device (no DataParallel "
            "wrapper): this shows the per-step cost of our launch only; the memory imbalance "
            "and the DataParallel slowdown need 2 or more GPUs (run it on a multi-GPU host)."
        )
    lines.append(GPU_END)
    return "\n".join(lines)


def write_docs(path: Path, block: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start, end = text.find(GPU_BEGIN), text.find(GPU_END)
    if start >= 0 and end > start:
        text = text[:start] + block + text[end + len(GPU_END) :]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--size", choices=sorted(SIZES), default=None)
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
    args = parser.parse_args()
    if args.size is None:
        args.size = "small" if args.device == "cuda" else "tiny"
    if args.device == "cpu" and not args.worker:
        args.seq_len = min(args.seq_len, 64)
    if args.worker:
        worker(args)
        return 0

    if args.device == "cuda":
        import torch

        n_devices = torch.cuda.device_count()
        if not n_devices:
            print("no CUDA device visible: run with --gpus all, or --device cpu for a smoke test")
            return 2
    else:
        n_devices = 2
    facts = gpu_facts()
    runs = []
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as scratch:
        for round_ in range(args.rounds):
            order = ["dataparallel", "ddp"] if round_ % 2 == 0 else ["ddp", "dataparallel"]
            for label in order:
                result = run_variant(label, args, n_devices, Path(scratch))
                result["round"] = round_
                runs.append(result)
                print(json.dumps(result), flush=True)
    block = report(runs, args, n_devices, facts)
    print("\n" + block)
    if args.json:
        args.json.write_text(json.dumps({"facts": facts, "runs": runs}, indent=1))
    if args.write_docs:
        write_docs(args.write_docs, block)
        print(f"written: {args.write_docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
