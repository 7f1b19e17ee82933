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
        python scripts/gpu_benchmark.py --write-docs docs/benchmarks.md

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
import threading
import time
from pathlib import Path
from typing import Any

try:
    from scripts import doc_block
except ImportError:  # run by path (`python scripts/gpu_benchmark.py`): its folder is on sys.path
    import doc_block  # type: ignore[no-redef]

SCRIPT = Path(__file__).resolve()
IMAGE = "container-entry:gpu-bench"  # not container-entry:bench, which `make bench` rebuilds
ENV_RECORDED = ("OMP_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF", "NCCL_DEBUG", "CUDA_VISIBLE_DEVICES")
OOM_EXIT = 3  # a worker that ran out of memory: recorded, then the job stops
GPU_BEGIN, GPU_END = "<!-- gpu-results:begin -->", "<!-- gpu-results:end -->"
SIZES = {  # GPT-2 shaped models built from a config
    "tiny": dict(n_embd=64, n_layer=2, n_head=2),
    "small": dict(n_embd=768, n_layer=12, n_head=12),  # GPT-2 small, 124M parameters
    "medium": dict(n_embd=1024, n_layer=24, n_head=16),  # GPT-2 medium, 355M parameters
}


# ------------------------------------------------------------------------- worker (trains)
class Precision:
    """Runs a module's forward under autocast(dtype) in whatever thread calls it (DataParallel
    calls each replica's forward in a thread of its own, where an autocast entered by the
    caller does not apply) and records the dtype of what its `probe` submodule returned."""

    def __init__(self, device_type: str, dtype: Any | None) -> None:
        self.device_type = device_type
        self.dtype = dtype  # None: no autocast (fp32)
        self.ran: set[str] = set()
        self._local = threading.local()

    def install(self, model: Any, probe: Any) -> None:
        if self.dtype is not None:
            model.register_forward_pre_hook(self._enter)
            model.register_forward_hook(self._exit)
        probe.register_forward_hook(self._record)

    def _enter(self, _module: Any, _inputs: Any) -> None:
        import torch

        context = torch.autocast(self.device_type, dtype=self.dtype)
        context.__enter__()
        self._local.__dict__.setdefault("stack", []).append(context)

    def _exit(self, _module: Any, _inputs: Any, _output: Any) -> None:
        self._local.stack.pop().__exit__(None, None, None)

    def _record(self, _module: Any, _inputs: Any, output: Any) -> None:
        tensor = output[0] if isinstance(output, tuple) else output
        self.ran.add(str(tensor.dtype).replace("torch.", ""))


def is_oom(error: BaseException) -> bool:
    return type(error).__name__ == "OutOfMemoryError" or "out of memory" in str(error).lower()


def memory(torch: Any, devices: list[int], used: dict[str, int]) -> dict[str, dict[str, int]]:
    """Per device: peak allocated, peak reserved, peak device used memory (sampled)."""
    return {
        str(i): {
            "allocated": torch.cuda.max_memory_allocated(i),
            "reserved": torch.cuda.max_memory_reserved(i),
            "device_used": used.get(str(i), 0),
        }
        for i in devices
    }


def worker(args: argparse.Namespace) -> int:
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
        def __init__(self, devices: list[int]) -> None:
            self.times: dict[int, float] = {}
            self.devices = devices
            self.used: dict[str, int] = {}

        def on_step_end(self, _args, state, _control, **_kwargs) -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                for i in self.devices:  # the device's own view: context, NCCL, allocator
                    free, total = torch.cuda.mem_get_info(i)
                    self.used[str(i)] = max(self.used.get(str(i), 0), total - free)
            self.times[state.global_step] = time.time()

    config = GPT2Config(n_positions=max(1024, args.seq_len), **SIZES[args.size])
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    bf16 = args.device == "cuda" and torch.cuda.is_bf16_supported() and not args.fp32
    precision = Precision(args.device, torch.bfloat16 if bf16 else None)
    precision.install(model, model.lm_head)
    training_args = TrainingArguments(
        output_dir=os.path.join(tempfile.gettempdir(), "gpu-bench-trainer"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=1e-4,
        bf16=False,  # autocast is ours (Precision), the same in both variants
        report_to=[],
        logging_steps=10**6,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=2,
        ddp_find_unused_parameters=False,
        seed=0,
    )
    devices: list[int] = []
    if torch.cuda.is_available():
        # DataParallel: one process sees every GPU; DDP: each rank reports its own device
        if training_args.world_size == 1:
            devices = list(range(torch.cuda.device_count()))
        else:
            devices = [training_args.device.index or 0]
    clock = Clock(devices)
    global_batch = training_args.train_batch_size * training_args.world_size
    data = Tokens(global_batch * (args.steps + 1))
    trainer = Trainer(model=model, args=training_args, train_dataset=data, callbacks=[clock])
    for index in devices:
        torch.cuda.reset_peak_memory_stats(index)
    oom = None
    try:
        trainer.train()
    except Exception as error:  # the seed's point: DataParallel runs GPU 0 out of memory
        if not is_oom(error):
            raise
        oom = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
    rate = None
    if oom is None:
        last = max(clock.times)
        first = min(args.warmup, last - 1)
        rate = (last - first) * global_batch / (clock.times[last] - clock.times[first])
    rank = training_args.process_index
    record = {
        "rank": rank,
        "world_size": training_args.world_size,
        "n_gpu": training_args.n_gpu,
        "parallel_mode": str(training_args.parallel_mode),
        "model_wrapper": type(trainer.model_wrapped).__name__,
        "global_batch": global_batch,
        "samples_per_second": rate,
        "memory": memory(torch, devices, clock.used) if devices else {},
        "precision_requested": "bf16" if bf16 else "fp32",
        "dtype_ran": sorted(precision.ran),
        "oom": oom,
        "env": {name: os.environ.get(name) for name in ENV_RECORDED},
    }
    out = Path(args.result_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.label}-rank{rank}.json").write_text(json.dumps(record))
    print(f"[{args.label} rank {rank}] {json.dumps(record)}", flush=True)
    return OOM_EXIT if oom else 0


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
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
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
    launcher = command[0] if label == "ddp" else "python (one process)"
    return collect(label, launcher, done.returncode, records)


def collect(label: str, launcher: str, returncode: int, records: list[dict]) -> dict:
    """One variant's result from its ranks' records; an out-of-memory run is a result."""
    oom = next((r["oom"] for r in records if r.get("oom")), None)
    if (returncode and not oom) or not records:
        raise SystemExit(f"{label} failed (exit {returncode})")
    memory: dict[str, dict[str, int]] = {}
    for record in records:
        memory.update(record["memory"])
    rank0 = min(records, key=lambda r: r["rank"])
    return {
        "label": label,
        "launcher": launcher,
        "samples_per_second": None if oom else rank0["samples_per_second"],
        "oom": oom,
        "memory": [memory[k] for k in sorted(memory, key=int)],
        "wrapper": rank0["model_wrapper"],
        "parallel_mode": rank0["parallel_mode"],
        "world_size": rank0["world_size"],
        "global_batch": rank0["global_batch"],
        "precision_requested": rank0["precision_requested"],
        "dtype_ran": sorted({d for r in records for d in r["dtype_ran"]}),
        "env": rank0["env"],
    }


def summarise(runs: list[dict], label: str) -> dict:
    mine = [r for r in runs if r["label"] == label]
    rates = [r["samples_per_second"] for r in mine if r["samples_per_second"] is not None]
    columns = [list(col) for col in zip(*(r["memory"] for r in mine), strict=True)] if mine else []

    def peak(kind: str) -> list[int]:
        return [max(m[kind] for m in column) for column in columns]

    allocated = peak("allocated")
    return {
        "rates": rates,
        "ooms": [r["oom"] for r in mine if r.get("oom")],
        "allocated": allocated,
        "reserved": peak("reserved"),
        "device_used": peak("device_used"),
        "imbalance": (max(allocated) / min(allocated)) if allocated and min(allocated) else None,
        "dtypes": sorted({d for r in mine for d in r["dtype_ran"]}),
        "first": mine[0] if mine else {},
    }


def report(runs: list[dict], args: argparse.Namespace, n_devices: int, facts: dict) -> str:
    gib = 1024**3
    dp, ddp = summarise(runs, "dataparallel"), summarise(runs, "ddp")

    def rate(s: dict) -> str:
        r = s["rates"]
        if not r:
            return "out of memory"
        text = f"{statistics.median(r):.1f}" + (
            f" ({min(r):.1f}-{max(r):.1f})" if len(r) > 1 else ""
        )
        return text + (f"; OOM in {len(s['ooms'])} run(s)" if s["ooms"] else "")

    def mem(s: dict, kind: str) -> str:
        if not s[kind]:
            return "n/a (no GPU)"
        return " / ".join(f"{p / gib:.2f}" for p in s[kind])

    def imbalance(s: dict) -> str:
        return f"{s['imbalance']:.2f}" if s["imbalance"] else "n/a"

    def row(name: str, s: dict) -> str:
        return (
            f"| {name} | {s['first'].get('wrapper')} | {', '.join(s['dtypes']) or '-'} | "
            f"{rate(s)} | {mem(s, 'allocated')} | {mem(s, 'reserved')} | "
            f"{mem(s, 'device_used')} | {imbalance(s)} |"
        )

    launcher = ddp["first"].get("launcher", "")
    ddp_name = "ours (DDP)" if launcher == "container-entry" else "torchrun DDP (not in our image)"
    lines = [
        "## GPU: DataParallel (the incumbent's default) against our DDP launch",
        "",
        f"Generated by `python scripts/gpu_benchmark.py {' '.join(sys.argv[1:])}` on "
        f"{facts['date']}; GPUs: {facts['gpus']}; device `{args.device}`; image "
        f"`{os.environ.get('CONTAINER_ENTRY_IMAGE', IMAGE)}`.",
        f"Model: GPT-2 `{args.size}` from its config, sequence {args.seq_len}, "
        f"{args.batch_size} per GPU (global batch {ddp['first'].get('global_batch')}), "
        f"{ddp['first'].get('precision_requested')} requested in both (dtype that ran: "
        "column 3, from a forward hook), "
        f"{args.steps} steps, rate from step {args.warmup}; {args.rounds} round(s) in "
        "alternation (median (min-max)).",
        "",
        "| launch | model wrapper | dtype ran | samples/s | peak allocated per GPU (GiB) | "
        "peak reserved (GiB) | device used (GiB) | allocated max/min |",
        "|---|---|---|---|---|---|---|---|",
        row("incumbent default: one process, HF Trainer", dp),
        row(f"{ddp_name}: one process per GPU", ddp),
        "",
    ]
    if dp["rates"] and ddp["rates"]:
        ratio = statistics.median(ddp["rates"]) / statistics.median(dp["rates"])
        lines.append(f"DDP / DataParallel samples/s: {ratio:.2f}.")
    for s, name in ((dp, "DataParallel"), (ddp, "DDP")):
        for oom in s["ooms"][:1]:
            lines.append(f"{name} ran out of memory: `{oom}`.")
    if dp["first"].get("env") != ddp["first"].get("env"):
        lines.append(
            f"Environments differed: {dp['first'].get('env')} / {ddp['first'].get('env')}."
        )
    if n_devices < 2:
        lines.append(
            "With 1 device both launches are one process on one device (no DataParallel "
            "wrapper): this shows the per-step cost of our launch only; the memory imbalance "
            "and the DataParallel slowdown need 2 or more GPUs (run it on a multi-GPU host)."
        )
    return "\n".join(lines)


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
        return worker(args)

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
        doc_block.write_block(args.write_docs, block, GPU_BEGIN, GPU_END, append=True)
        print(f"written: {args.write_docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
