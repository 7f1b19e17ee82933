"""Rank program of the GPU checks (scripts/gpu/check.py): a plain DDP script, launched by the
bootstrap like any user's script, that knows nothing of container-entry.

    --mode ok     init the process group, all_reduce, print the PROBE line, end cleanly
           crash  raise ValueError after an all_reduce (the failure file names it)
           oom    ask the GPU for 4 TiB (on cpu: raise CUDA's out-of-memory message)
           hang   rank 1 (rank 0 alone) goes silent in Python; the others wait for it in an
                  all_reduce it never joins (the hang watchdog and the flight recorder)
           stop   train (all_reduce, sleep) until SIGTERM, then checkpoint for
                  --checkpoint-seconds and exit 0
    --device cuda NCCL, one GPU per rank (LOCAL_RANK)
             cpu  gloo: the same paths on a machine without a GPU (the check's self-test)

Every rank prints `PROBE {json}` once its first all_reduce returned: the check waits for these
lines, counts ranks by them and finds their pids in them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

STEP_EVERY = 0.2  # seconds between training steps in stop mode
PRINT_EVERY = 25  # steps between step lines (every 5 s)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("ok", "crash", "oom", "hang", "stop"), default="ok")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--checkpoint-seconds", type=float, default=40.0)
    return parser.parse_args(argv)


def init(device: str) -> torch.device:
    """The default process group on the requested device; the device the tensors go to."""
    if device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)  # before NCCL: each rank on its own GPU
        dist.init_process_group("nccl")
        return torch.device("cuda", local)
    dist.init_process_group("gloo")
    return torch.device("cpu")


def all_reduce_ones(dev: torch.device) -> float:
    """One all_reduce of ones: the world size when every rank took part."""
    t = torch.ones(1, device=dev)
    dist.all_reduce(t)
    return float(t.item())  # .item() waits for the GPU


def facts(dev: torch.device, result: float) -> dict[str, object]:
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return {
        "rank": dist.get_rank(),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "world": dist.get_world_size(),
        "backend": str(dist.get_backend()),
        "device": name,
        "torch": torch.__version__,
        "all_reduce": result,
        "pid": os.getpid(),
    }


def say(text: str) -> None:
    print(f"PROBE {text}", flush=True)


def hang(dev: torch.device) -> None:
    """One rank silent in Python forever; the others block in a collective it never joins."""
    rank, world = dist.get_rank(), dist.get_world_size()
    say("entering silence")
    victim = 1 if world > 1 else 0
    if rank == victim:
        if world == 1:
            all_reduce_ones(dev)  # something for the flight recorder to show
        while True:
            time.sleep(3600)
    all_reduce_ones(dev)  # never returns: the victim does not join
    say("the all_reduce returned: no hang")


def write_atomically(path: Path, write) -> None:
    """Under a temporary name, then renamed: a checkpoint is whole or absent."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(temporary)
    os.replace(temporary, path)


class Heartbeat:
    """On gloo, a non-daemon thread that polls the job's store, as NCCL's heartbeat monitor does
    on GPU ranks: a rank cannot end while a store call of it is blocked (the stop scenario)."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="probe-heartbeat")

    def _run(self) -> None:
        store = dist.distributed_c10d._get_default_store()
        while not self.stopping.is_set():
            # the store gone or failing: keep polling, as NCCL's monitor does
            with contextlib.suppress(Exception):
                store.check(["x"])
            self.stopping.wait(0.1)

    def start(self) -> None:
        self.thread.start()

    def join(self) -> None:
        self.stopping.set()
        self.thread.join()


def checkpoint(rank: int, state: dict[str, object], seconds: float) -> None:
    """A slow checkpoint (`seconds`, longer than torch < 2.12's torchrun allowed after a stop),
    written atomically to SM_CHECKPOINT_DIR."""
    say(f"rank {rank} got SIGTERM, checkpointing for {seconds:g} s")
    time.sleep(seconds)
    folder = Path(os.environ.get("SM_CHECKPOINT_DIR", "/tmp"))
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(folder / f"ckpt-rank{rank}.pt", lambda path: torch.save(state, path))
    say(f"rank {rank} checkpoint written")


def stop(dev: torch.device, checkpoint_seconds: float, announce: str) -> None:
    """Train (all_reduce + sleep) until SIGTERM, then checkpoint slowly and exit 0.

    The handler only notes the signal (time in `<SM_OUTPUT_DATA_DIR>/term-rank-N.txt`); each
    step all_reduces a stop flag, so every rank leaves the loop at the same step: a rank that
    checkpointed from inside the handler could leave a peer waiting in a collective it never
    joins (on NCCL the ranks' queues drift apart). The PROBE line (`announce`) comes once the
    handler is in place: the check signals right after it."""
    rank = dist.get_rank()
    heartbeat = Heartbeat() if dev.type == "cpu" else None
    told: list[float] = []

    def on_term(signum: int, frame: object) -> None:
        if not told:
            told.append(time.time())
            out = Path(os.environ.get("SM_OUTPUT_DATA_DIR", "/tmp"))
            out.mkdir(parents=True, exist_ok=True)
            (out / f"term-rank-{rank}.txt").write_text(f"{told[0]:.6f}\n")

    signal.signal(signal.SIGTERM, on_term)
    if heartbeat is not None:
        heartbeat.start()
    say(announce)
    flag = torch.zeros(1, device=dev)
    step = 0
    while True:
        flag.fill_(1.0 if told else 0.0)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():  # a rank was told to stop: all stop at this step
            break
        if step % PRINT_EVERY == 0:
            say(f"step {step}")
        step += 1
        time.sleep(STEP_EVERY)
    checkpoint(rank, {"step": step}, checkpoint_seconds)
    if heartbeat is not None:
        heartbeat.join()
    sys.exit(0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dev = init(args.device)
    line = json.dumps(facts(dev, all_reduce_ones(dev)))
    if args.mode == "stop":
        stop(dev, args.checkpoint_seconds, line)
    say(line)
    if args.mode == "crash":
        raise ValueError("planted failure after an all_reduce")
    if args.mode == "oom":
        if dev.type == "cuda":
            torch.empty(4 * 1024**4, dtype=torch.uint8, device=dev)  # 4 TiB
            raise RuntimeError("4 TiB were allocated on the GPU: no out-of-memory error")
        raise RuntimeError("CUDA out of memory. Tried to allocate 4096.00 GiB")
    if args.mode == "hang":
        hang(dev)
    dist.destroy_process_group()
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
