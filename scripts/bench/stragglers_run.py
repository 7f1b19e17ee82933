"""One run of the straggler-watch benchmark: the tiny HF Trainer job, or a plain DDP step loop,
under `python -m container_entry train` with 2 workers on this host, sampling off
(CONTAINER_ENTRY_STRAGGLER_INTERVAL=0) or every INTERVAL seconds; its figures read from what
the ranks wrote, the watch's own output from the run's tree.

What the benchmark measures and how is stragglers.py's docstring. The run's tree, the command
line and the drained pipes are the relay benchmark's (relay_run.py); WORKLOAD is the DDP loop the
ranks run (written where relay_run.command looks for its workload).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from container_entry.common.layout import RunDir
from scripts.bench.relay_run import command, free_port, lay_out, run_job

INTERVAL_ENV = "CONTAINER_ENTRY_STRAGGLER_INTERVAL"
DDP_WARMUP = 200  # steps before rank 0 starts its clock
STALL_BIN = 0.5  # s: the resolution of the steps' pace after a sample

WORKLOAD = r'''
"""Plain DDP step loop (gloo): every rank writes its steps/s; rank 0 also every step's end."""
import argparse, json, os, sys, time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3000)
parser.add_argument("--warmup", type=int, default=200)
parser.add_argument("--out", required=True)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 32), torch.randn(16, 1)
ends = []
for step in range(args.steps):
    if step == args.warmup:
        began, wall = time.perf_counter(), time.time()
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step >= args.warmup:
        ends.append(time.time())
elapsed = time.perf_counter() - began
result = {"rank": rank, "steps_per_s": (args.steps - args.warmup) / elapsed, "began": wall}
if rank == 0:  # seconds after `began` (the wall clock: the watch samples at its multiples)
    result["ends"] = [round(t - wall, 6) for t in ends]
with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as handle:
    json.dump(result, handle)
# no destroy_process_group(): see relay_run.WORKLOAD
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
'''


class TableWatch(threading.Thread):
    """Counts the master's writes of stragglers.json while the job runs (it rewrites the file
    after every sample that lined collectives up): when samples took place."""

    def __init__(self, path: Path, period: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.path, self.period = path, period
        self.writes: set[int] = set()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.period):
            with contextlib.suppress(OSError):
                self.writes.add(self.path.stat().st_mtime_ns)


@dataclass
class Run:
    """One job's figures."""

    job: str  # "hf" or "ddp"
    interval: float  # 0: sampling off
    steps_per_s: float  # rank 0's
    steps: int
    wall: float  # the whole job, start-up included
    job_cpu: float  # every process of the job (wait4)
    samples: int  # writes of stragglers.json seen
    sampled: list[float]  # their times (epoch s), a sample's end
    # the watch's lines ("[container-entry] straggler ...") in the last 4 KB of each output
    # stream (relay_run.Drain keeps no more), and those of its table at the end
    watch_lines: list[str]
    began: float = 0.0  # ddp: the wall clock at rank 0's first timed step
    ends: list[float] | None = None  # ddp: rank 0's step ends, s after `began`


def run_once(job: str, interval: float, size: int) -> Run:
    """`job` ("hf": `size` epochs; "ddp": `size` steps) under our launcher, sampling every
    `interval` s (0: off)."""
    hf = job == "hf"
    with tempfile.TemporaryDirectory(prefix="stragglers-bench-") as tmp:
        base = Path(tmp)
        lay_out(base, hf)
        if hf:
            args = ["--epochs", str(size)]
        else:  # relay_run.command runs the DDP script by this name
            (base / "code" / "relay_workload.py").write_text(WORKLOAD)
            result = str(base / "result")
            args = ["--steps", str(size), "--warmup", str(DDP_WARMUP), "--out", result]
        argv, env = command("ours", base, args, free_port(), None, hf)
        env[INTERVAL_ENV] = f"{interval:g}"
        poll = TableWatch(RunDir.of(base).stragglers)
        poll.start()
        try:
            finished = run_job(job, argv, env, base / "code")
        finally:
            poll.done.set()
            poll.join()
        ranks = [json.loads((base / "result" / f"rank-{r}.json").read_text()) for r in (0, 1)]
        named = table_lines(RunDir.of(base).stragglers)
    output = b"".join(drain.tail for drain in finished.drains).decode(errors="replace")
    zero = ranks[0]
    return Run(
        job=job,
        interval=interval,
        steps_per_s=float(zero["train_steps_per_second" if hf else "steps_per_s"]),
        steps=int(zero["steps"]) if hf else size - DDP_WARMUP,
        wall=finished.wall,
        job_cpu=finished.usage.ru_utime + finished.usage.ru_stime,
        samples=len(poll.writes),
        sampled=sorted(ns / 1e9 for ns in poll.writes),
        watch_lines=[line for line in output.splitlines() if "] straggler" in line] + named,
        began=float(zero.get("began", 0.0)),
        ends=zero.get("ends"),
    )


def table_lines(path: Path) -> list[str]:
    """The straggler lines of the master's last table (none: a balanced job, or no table)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [f"stragglers.json: {line}" for line in data.get("lines", [])]


@dataclass
class Stall:
    """Rank 0's steps of one run by the phase of the sampling interval (the time since the last
    multiple of it on the wall clock, when the watch samples), over its whole cycles (sampling
    on: those that began with a sample)."""

    interval: float
    counts: list[int]  # steps that ended in each bin of the phase, over all the cycles
    longest: list[float]  # per cycle, s: the longest step in its first half

    @property
    def cycles(self) -> int:
        return len(self.longest)

    def pace(self) -> list[float]:
        """Steps per bin against the mean of the second half's bins (which a sample leaves
        alone): 1.0 is the run's steady pace."""
        rest = self.counts[len(self.counts) // 2 :]
        steady = sum(rest) / len(rest)
        return [count / steady for count in self.counts]


def stall(run: Run, interval: float) -> Stall | None:
    """Rank 0's steps by phase of `interval` over the run's whole cycles: with sampling on, the
    cycles that began with a sample (the first one an interval or more after the bootstrap
    started; a write of the table ends a sample, in the cycle it began); off, every cycle (the
    control: the same moments, no sample; what the machine does at them)."""
    if not run.ends or len(run.ends) < 100:
        return None
    ends = run.ends
    bins = max(2, round(interval / STALL_BIN))
    width = interval / bins
    cycles = list(range(int(run.began // interval) + 1, int((run.began + ends[-1]) // interval)))
    if run.interval:
        cycles = sorted({int(t // interval) for t in run.sampled} & set(cycles))
    found = Stall(interval, [0] * bins, [])
    for k in cycles:
        start = k * interval - run.began
        edges = [bisect.bisect_left(ends, start + b * width) for b in range(bins + 1)]
        for b in range(bins):
            found.counts[b] += edges[b + 1] - edges[b]
        half = range(max(1, edges[0]), edges[bins // 2])  # steps that ended in the first half
        found.longest.append(max((ends[i] - ends[i - 1] for i in half), default=0.0))
    return found if found.cycles and sum(found.counts[bins // 2 :]) else None
