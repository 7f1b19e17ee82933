"""Preflight: a short torchrun pass before the user's script that finds a broken node first.

Run by the worker wrapper on every rank, with the job's own topology. Checks, in order: the
GPUs torch sees match what the plan counted; each GPU multiplies matrices like the CPU does;
every rank joins one process group and an all_reduce gives the right sum, with latency and
bandwidth printed per host. Any failure raises PreflightError naming the check and the host,
which the bootstrap puts in the failure file before the user's script has started.
"""

from __future__ import annotations

import os
import statistics
import time

EXPECTED_GPUS_ENV = "_CONTAINER_ENTRY_EXPECTED_GPUS"


class PreflightError(RuntimeError):
    pass


def _fail(check: str, host: str, detail: str) -> PreflightError:
    return PreflightError(f"preflight check '{check}' failed on host {host}: {detail}")


def main() -> None:
    import torch
    import torch.distributed as dist

    host = os.environ.get("CURRENT_HOST", "localhost")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    expected = int(os.environ.get(EXPECTED_GPUS_ENV, "0"))

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible != expected:
        raise _fail("gpu-count", host, f"the plan counted {expected} GPUs, torch sees {visible}")
    if expected and local_world > visible:
        raise _fail("gpu-count", host, f"{local_world} workers but only {visible} GPUs")

    device = torch.device("cpu")
    if expected:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        generator = torch.Generator().manual_seed(1234)
        a = torch.randn(512, 512, generator=generator)
        reference = a @ a
        result = (a.to(device) @ a.to(device)).cpu()
        if not torch.allclose(result, reference, rtol=1e-3, atol=1e-2):
            error = (result - reference).abs().max().item()
            raise _fail("gpu-matmul", host, f"GPU {local_rank} differs from the CPU by {error}")

    dist.init_process_group("nccl" if expected else "gloo")
    value = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(value)
    want = world * (world + 1) / 2
    if value.item() != want:
        raise _fail("all-reduce", host, f"sum {value.item()} instead of {want}")

    small = torch.zeros(1, device=device)
    latencies = []
    for _ in range(20):
        started = time.perf_counter()
        dist.all_reduce(small)
        if expected:
            torch.cuda.synchronize()
        latencies.append(time.perf_counter() - started)
    big = torch.ones(1 << 20, device=device)  # 4 MiB of float32
    started = time.perf_counter()
    for _ in range(3):
        dist.all_reduce(big)
    if expected:
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / 3
    if local_rank == 0:
        print(
            f"preflight ok on {host}: {local_world} workers, {visible} GPUs, all_reduce latency "
            f"{statistics.median(latencies) * 1e3:.2f} ms, bandwidth "
            f"{big.numel() * 4 / seconds / 1e6:.0f} MB/s (4 MiB, world {world})",
            flush=True,
        )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
