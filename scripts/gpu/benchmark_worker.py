"""One rank of the GPU benchmark (`gpu_benchmark.py --worker`): trains the model, then records
what it measured in <label>-rank<R>.json.

The benchmark starts it once per variant: one process that sees every GPU (the HF Trainer wraps
the model in DataParallel), or one process per GPU under `container-entry train` or torchrun
(DDP). torch and transformers are imported inside the functions, in the ranks only: the side
that compares the variants needs neither.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ENV_RECORDED = ("OMP_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF", "NCCL_DEBUG", "CUDA_VISIBLE_DEVICES")
OOM_EXIT = 3  # a worker that ran out of memory: recorded, then the job stops
SIZES = {  # GPT-2 shaped models built from a config
    "tiny": dict(n_embd=64, n_layer=2, n_head=2),
    "small": dict(n_embd=768, n_layer=12, n_head=12),  # GPT-2 small, 124M parameters
    "medium": dict(n_embd=1024, n_layer=24, n_head=16),  # GPT-2 medium, 355M parameters
}


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


def tokens(n: int, seq_len: int) -> Any:
    """`n` rows of `seq_len` random token ids, the same in every run, each its own label."""
    import torch

    class Tokens(torch.utils.data.Dataset):
        def __init__(self) -> None:
            g = torch.Generator().manual_seed(0)
            self.ids = torch.randint(0, 50257, (n, seq_len), generator=g)

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    return Tokens()


def clock(devices: list[int]) -> Any:
    """A Trainer callback that keeps each step's end time (`times`) and each device's peak used
    memory as the device reports it (`used`: the CUDA context, NCCL, the allocator)."""
    import torch
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.times: dict[int, float] = {}
            self.devices = devices
            self.used: dict[str, int] = {}

        def on_step_end(self, _args, state, _control, **_kwargs) -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                for i in self.devices:
                    free, total = torch.cuda.mem_get_info(i)
                    self.used[str(i)] = max(self.used.get(str(i), 0), total - free)
            self.times[state.global_step] = time.time()

    return Clock()


def training_arguments(args: argparse.Namespace) -> Any:
    """The Trainer's settings, the same in both variants; bf16 is Precision's, not the
    Trainer's (under DataParallel the Trainer never wraps the model in autocast)."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=os.path.join(tempfile.gettempdir(), "gpu-bench-trainer"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=1e-4,
        bf16=False,
        report_to=[],
        logging_steps=10**6,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=2,
        ddp_find_unused_parameters=False,
        seed=0,
    )


def own_devices(torch: Any, training_args: Any) -> list[int]:
    """The GPUs this rank reports: every GPU for DataParallel's one process, a DDP rank's own."""
    if not torch.cuda.is_available():
        return []
    if training_args.world_size == 1:
        return list(range(torch.cuda.device_count()))
    return [training_args.device.index or 0]


def train(trainer: Any) -> str | None:
    """Train; None, or the out-of-memory error (the seed's point: DataParallel runs GPU 0 out
    of memory) as one line, a result rather than a crash."""
    try:
        trainer.train()
    except Exception as error:
        if not is_oom(error):
            raise
        return f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
    return None


def samples_per_second(times: dict[int, float], warmup: int, global_batch: int) -> float:
    """From step `warmup` (or the one before the last) to the last step."""
    last = max(times)
    first = min(warmup, last - 1)
    return (last - first) * global_batch / (times[last] - times[first])


def worker(args: argparse.Namespace, shape: dict[str, int]) -> int:
    """Train a GPT-2 of `shape`; write and print what this rank measured. OOM_EXIT when it ran
    out of memory."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer

    config = GPT2Config(n_positions=max(1024, args.seq_len), **shape)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    bf16 = args.device == "cuda" and torch.cuda.is_bf16_supported() and not args.fp32
    precision = Precision(args.device, torch.bfloat16 if bf16 else None)
    precision.install(model, model.lm_head)
    training_args = training_arguments(args)
    devices = own_devices(torch, training_args)
    timer = clock(devices)
    global_batch = training_args.train_batch_size * training_args.world_size
    data = tokens(global_batch * (args.steps + 1), args.seq_len)
    trainer = Trainer(model=model, args=training_args, train_dataset=data, callbacks=[timer])
    for index in devices:
        torch.cuda.reset_peak_memory_stats(index)
    oom = train(trainer)
    rate = None if oom else samples_per_second(timer.times, args.warmup, global_batch)
    rank = training_args.process_index
    record = {
        "rank": rank,
        "world_size": training_args.world_size,
        "n_gpu": training_args.n_gpu,
        "parallel_mode": str(training_args.parallel_mode),
        "model_wrapper": type(trainer.model_wrapped).__name__,
        "global_batch": global_batch,
        "samples_per_second": rate,
        "memory": memory(torch, devices, timer.used) if devices else {},
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
