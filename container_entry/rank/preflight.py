"""Preflight: a short torchrun pass before the user's script that finds a broken node first.

The pass runs on every rank inside the job's own torchrun launch, before the user's script,
which starts only once it passed: in the script's own Python (preflight_then_script.py calls
`run()`, so `import torch` is paid once), or, for an entry that is not Python or names what
CUDA, NCCL or OpenMP read at start, as a program of its own (`python -u PREFLIGHT_SCRIPT`,
by the worker wrapper). Either way no second torchrun launch; the wrapper reports progress
for it to the hang watchdog (it has its own deadline). Its stages:

  connect     reach the job's TCPStore (every rank reports its stage there)
  gpu-count   the GPUs torch sees match what the plan counted
  gpu-matmul  each GPU multiplies small-integer matrices exactly (fp32, TF32 if forced, bf16)
  join        init_process_group(timeout=..., device_id=...)
  all-reduce  the sum of every rank's value is right; on EFA hosts NCCL must use the OFI net
  bandwidth   warm-up, then a bandwidth-bound all_reduce; latency and bus bandwidth printed

This file is the rank's program: one function per stage, in order. What each check decides is
in preflight_checks, the stages and the deadline (a watchdog thread that names the ranks
furthest behind) in preflight_progress, torch's view of the GPUs in torch_gpus. Any failure
raises (or prints) PreflightError naming the check and the host, and exits with the check's
code (exits.ExitCode); the bootstrap puts it in the failure file before the user's script has
started.
"""

from __future__ import annotations

import datetime
import inspect
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from container_entry.common.logs import PREFIX
from container_entry.plan.machine import read_efa_devices
from container_entry.rank.preflight_checks import (
    PreflightError,
    bus_bandwidth,
    fail,
    matmul_check,
    nccl_network,
    ofi_problem,
    print_failure,
    shm_line,
)
from container_entry.rank.preflight_progress import (
    DEADLINE_ENV,
    DEFAULT_DEADLINE,
    Progress,
    stage_seconds,
)
from container_entry.rank.torch_gpus import check_visible_gpus

EXPECTED_GPUS_ENV = "_CONTAINER_ENTRY_EXPECTED_GPUS"  # set by the bootstrap: the plan's count
STORE_PREFIX = "container-entry/preflight/"


@dataclass(frozen=True)
class Rank:
    """This rank's place in the job, from torchrun's variables and the plan's GPU count."""

    host: str
    rank: int
    local_rank: int
    world: int
    local_world: int
    expected: int  # GPUs the plan counted on this host (0: a CPU job, gloo)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Rank:
        return cls(
            host=environ.get("CURRENT_HOST", "localhost"),
            rank=int(environ["RANK"]),
            local_rank=int(environ["LOCAL_RANK"]),
            world=int(environ["WORLD_SIZE"]),
            local_world=int(environ.get("LOCAL_WORLD_SIZE", "1")),
            expected=int(environ.get(EXPECTED_GPUS_ENV, "0")),
        )


def _connect(me: Rank, progress: Progress) -> Any:
    """connect: the job's TCPStore (torchrun's), under a prefix of the preflight's own."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=progress.timeout())
    store, _, _ = next(dist.rendezvous("env://", me.rank, me.world, timeout=timeout))
    # The script that runs next in the same slot keys its own process group "default_pg/0/..."
    # in this same store (torchrun's): under a prefix of its own the preflight's group leaves it
    # no stale peer address.
    store = dist.PrefixStore(STORE_PREFIX, store)
    progress.store = store
    progress.enter("connect")
    return store


def _check_gpus(me: Rank, progress: Progress) -> int:
    """gpu-count: torch sees the GPUs the plan counted, one per worker (the GPUs torch sees).
    Local rank 0 warns about a small /dev/shm."""
    import torch

    progress.enter("gpu-count")
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible != me.expected:  # the bootstrap's own check, for its versions in the report
        detail = check_visible_gpus(sys.executable, me.expected, os.environ)
        counted = f"the plan counted {me.expected} GPUs, torch sees {visible}"
        raise fail("gpu-count", me.host, detail or counted)
    if me.expected and me.local_world > visible:
        raise fail("gpu-count", me.host, f"{me.local_world} workers but only {visible} GPUs")
    if me.local_rank == 0:
        warning = shm_line(me.host)
        if warning:
            print(warning, file=sys.stderr, flush=True)
    return visible


def _device(me: Rank, progress: Progress) -> Any:
    """gpu-matmul: this rank's GPU multiplies exactly; the CPU on a host without GPUs."""
    import torch

    if not me.expected:
        return torch.device("cpu")
    progress.enter("gpu-matmul")
    device = torch.device("cuda", me.local_rank)
    torch.cuda.set_device(device)
    matmul_check(torch, device, me.local_rank, me.host)
    return device


def _ask_nccl_network(me: Rank) -> tuple[list[str], str | None]:
    """On a GPU host with EFA devices and peers on other hosts: (the devices, a folder where
    NCCL, for this process only, logs which network it picks); else ([], None)."""
    efa = list(read_efa_devices()) if me.expected and me.world > me.local_world else []
    if not efa:
        return [], None
    debug_dir = tempfile.mkdtemp(prefix="preflight-nccl-")
    os.environ.update(
        NCCL_DEBUG="INFO",
        NCCL_DEBUG_SUBSYS="INIT,NET",
        NCCL_DEBUG_FILE=os.path.join(debug_dir, "nccl.%p.log"),
    )
    return efa, debug_dir


def _join(me: Rank, progress: Progress, store: Any, device: Any) -> None:
    """join: this rank's process group, on the store's prefix."""
    import torch.distributed as dist

    progress.enter("join")
    options: dict[str, Any] = {"timeout": datetime.timedelta(seconds=progress.timeout())}
    if me.expected and "device_id" in inspect.signature(dist.init_process_group).parameters:
        options["device_id"] = device  # torch 2.3+: the communicator is made now, on this GPU
    dist.init_process_group(
        "nccl" if me.expected else "gloo", store=store, rank=me.rank, world_size=me.world, **options
    )


def _all_reduce(me: Rank, progress: Progress, device: Any) -> None:
    """all-reduce: the sum of every rank's value is right."""
    import torch
    import torch.distributed as dist

    progress.enter("all-reduce")
    value = torch.tensor([float(me.rank + 1)], device=device)
    dist.all_reduce(value)
    want = me.world * (me.world + 1) / 2
    if value.item() != want:
        raise fail("all-reduce", me.host, f"sum {value.item()} instead of {want}")


def _check_efa(me: Rank, efa: list[str], debug_dir: str | None) -> None:
    """NCCL's log of the join (`_ask_nccl_network`): its warnings printed, and the network it
    chose must be aws-ofi-nccl's on the efa provider."""
    if debug_dir is None:
        return
    lines: list[str] = []
    for log in Path(debug_dir).glob("nccl.*.log"):
        lines += log.read_text(errors="replace").splitlines()
    for line in lines:
        if " NCCL WARN " in line:  # the preflight's own NCCL, not the script's
            print(f"{PREFIX} preflight's NCCL: {line}", file=sys.stderr)
    problem = ofi_problem(*nccl_network(lines), efa)
    if problem:
        raise fail("efa-network", me.host, problem)


def _bandwidth(me: Rank, device: Any) -> str:
    """bandwidth: the latency of a small all_reduce and the bus bandwidth of a bandwidth-bound
    one (256 MiB on GPUs: NVLink, EFA; 4 MiB on CPU: gloo, still 95% transfer at 1 GB/s), each
    after a warm-up. On CPU it is on every job's way to its first step (the script waits for
    it): 3 warm-up rounds of 8 MiB made it 0.08 s of a 2-host job's 3 s (benchmarks.md, READY)."""
    import torch
    import torch.distributed as dist

    def sync() -> None:
        if me.expected:
            torch.cuda.synchronize()

    small = torch.zeros(1, device=device)
    for _ in range(5):
        dist.all_reduce(small)
    sync()
    latencies = []
    for _ in range(20):
        started = time.perf_counter()
        dist.all_reduce(small)
        sync()
        latencies.append(time.perf_counter() - started)
    nbytes = (256 if me.expected else 4) << 20
    big = torch.ones(nbytes // 4, device=device)
    rounds = 10 if me.expected else 3
    for _ in range(3 if me.expected else 1):  # warm-up: NCCL's channels and buffers, gloo's
        dist.all_reduce(big)
    sync()
    dist.barrier()
    started = time.perf_counter()
    for _ in range(rounds):
        dist.all_reduce(big)
    sync()
    seconds = (time.perf_counter() - started) / rounds
    return (
        f"all_reduce latency {statistics.median(latencies) * 1e3:.2f} ms, bus bandwidth "
        f"{bus_bandwidth(nbytes, seconds, me.world) / 1e9:.2f} GB/s "
        f"({nbytes >> 20} MiB, world {me.world})"
    )


def import_torch() -> Any:
    """torch.distributed, for the script that runs next in the same Python (it finds torch
    imported)."""
    import torch.distributed as dist

    return dist


def main() -> None:
    me = Rank.from_environ(os.environ)
    deadline = float(os.environ.get(DEADLINE_ENV) or DEFAULT_DEADLINE)
    progress = Progress(me.rank, me.local_rank, me.host, deadline)
    progress.world = me.world
    progress.watch()

    dist = import_torch()  # under the deadline too

    progress.marks.append(("connect", time.monotonic()))  # imported; published once connected
    store = _connect(me, progress)
    visible = _check_gpus(me, progress)
    device = _device(me, progress)
    efa, debug_dir = _ask_nccl_network(me)
    _join(me, progress, store, device)
    _all_reduce(me, progress, device)
    _check_efa(me, efa, debug_dir)
    if me.world == 1:  # one rank: the all_reduce moved nothing, there is no link to time
        measured = "all_reduce result checked (world 1: no link to measure latency or bandwidth on)"
    else:
        progress.enter("bandwidth")
        measured = _bandwidth(me, device)
    if me.local_rank == 0:
        took = stage_seconds(progress.marks, time.monotonic())
        print(
            f"{PREFIX} preflight ok on {me.host}: {me.local_world} workers, {visible} GPUs, "
            f"{measured}; "
            f"{took}",
            flush=True,
        )
    if me.world > 1:
        dist.barrier()
    dist.destroy_process_group()  # under the deadline too: a hung teardown is reported
    progress.stage = "done"


def run() -> int:
    """The whole pass: 0, or the failed check's exit code with its report printed."""
    try:
        main()
    except PreflightError as error:  # the traceback names the check; the code says its kind
        print_failure(error)
        return error.exit_code
    return 0


if __name__ == "__main__":  # a pass of its own, before a script that is not Python
    code = run()
    # Passed: the script starts in this slot once this process is gone, and the interpreter's
    # own teardown with torch loaded (module and thread state, atexit) took 0.37 s of the
    # 1.8 s this pass cost on a 2-CPU host (docs/benchmarks.md); nothing is left to release
    # (the process group is destroyed, output is unbuffered), so skip it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
