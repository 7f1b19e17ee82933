"""One run of the relay benchmark: a launcher (bare torchrun or ours) starting the log-heavy
DDP workload, or the tiny HF Trainer job, with 2 workers, on this host or in a container of the
image; its output drained as docker's log pipe would, its figures read from what the ranks wrote.

What a run measures and how is relay_benchmark.py's docstring; WORKLOAD is the script the ranks
run (written into the run's tree as relay_workload.py).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HF_SCRIPT = REPO / "examples" / "hf_trainer_tiny.py"
HF_EPOCHS = 16  # 512 examples, batch 8 per rank, 2 ranks: 32 steps per epoch; 512 steps, ~8 s
# (4 epochs, ~2 s, spread 0.86x-1.15x over 5 rounds: the Trainer's start-up weighed too much)
IN_IMAGE = Path("/opt/ml")  # where a container sees the run's tree

WORKLOAD = r'''
"""Tiny DDP MLP step loop that prints `--lines` extra lines per step to `--stream`."""
import argparse, json, os, sys, time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1000)
parser.add_argument("--warmup", type=int, default=100)
parser.add_argument("--lines", type=int, default=0)
parser.add_argument("--stream", default="stdout")
parser.add_argument("--out", required=True)
args = parser.parse_args()


def cpu(pid):
    """utime + stime of a process (all its threads), seconds, and its parent and name."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmd = handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[1]), cmd


def ancestors():
    """CPU of this process and of its ancestors up to (not past) the benchmark itself."""
    found, pid = {}, os.getpid()
    for _ in range(4):
        sample = cpu(pid)
        if sample is None:
            break
        seconds, parent, cmd = sample
        found[pid] = (seconds, cmd)
        if "relay_benchmark" in cmd:
            break
        pid = parent
    return found


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 32), torch.randn(16, 1)
stream = sys.stderr if args.stream == "stderr" else sys.stdout
filler = "abcdefghij" * 8
for step in range(args.steps):
    if step == args.warmup:
        began, before = time.perf_counter(), ancestors()
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.5f}", file=stream)
    for line in range(args.lines):
        print(f"step {step:6d} line {line:2d} {filler}", file=stream)
elapsed, after = time.perf_counter() - began, ancestors()
cpu_window = {
    str(pid): {"cmd": cmd, "seconds": after[pid][0] - before[pid][0]}
    for pid, (_, cmd) in before.items()
    if pid in after
}
result = {
    "rank": rank,
    "steps_per_s": (args.steps - args.warmup) / elapsed,
    "lines": (args.steps - args.warmup) * (1 + args.lines),
    "cpu": cpu_window,
}
with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as handle:
    json.dump(result, handle)
# no destroy_process_group(): gloo's teardown now and then aborts ("terminate called without
# an active exception"), which has nothing to do with what is measured
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
'''


def free_port() -> int:
    """A port with its neighbour free too (the bootstrap's side channel uses port + 1)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port < 65000:
            with socket.socket() as other:
                try:
                    other.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise SystemExit("no free port pair")


def make_tree(base: Path) -> None:
    config = base / "input" / "config"
    config.mkdir(parents=True)
    resource = {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "lo"}
    (config / "resourceconfig.json").write_text(json.dumps(resource))
    (config / "hyperparameters.json").write_text("{}")
    (config / "inputdataconfig.json").write_text("{}")
    (base / "code").mkdir()


def clean_env() -> dict[str, str]:
    prefixes = ("SM_", "PET_", "SAGEMAKER_", "CONTAINER_ENTRY_", "OMP_", "PYTHONUNBUFFERED")
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


class Drain(threading.Thread):
    """Reads one output pipe of the job to its end, as docker's log pipe would; counts lines."""

    def __init__(self, fd: int) -> None:
        super().__init__(daemon=True)
        self.fd, self.lines, self.tail = fd, 0, b""

    def run(self) -> None:
        while chunk := os.read(self.fd, 1 << 20):
            self.lines += chunk.count(b"\n")
            self.tail = (self.tail + chunk)[-4000:]


class RunFailed(Exception):
    pass


def command(
    launcher: str,
    base: Path,
    script_args: list[str],
    port: int,
    image: str | None,
    hf: bool,
    before: Path | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The job's command line and environment, on this host or in a container of `image`;
    launcher `before` runs the container_entry package in the folder `before`."""
    root = IN_IMAGE if image else base
    script = root / "code" / ("hf_trainer_tiny.py" if hf else "relay_workload.py")
    env = {"OMP_NUM_THREADS": "1"}
    if hf:  # both launchers: the summary where this script reads it
        env["SUMMARY_DIR"] = str(root / "result")
    if launcher.startswith("torchrun"):
        if launcher == "torchrun-u":  # the workers unbuffered, as ours runs them (-u)
            env["PYTHONUNBUFFERED"] = "1"
        if hf:  # what the bootstrap sets on a CPU host (docs/cpu-ddp.md)
            env["ACCELERATE_USE_CPU"] = "true"
        python = "python3" if image else sys.executable
        argv = [
            python, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-port", str(port), str(script), *script_args,
        ]  # fmt: skip
    else:
        # the image's entrypoint is the bootstrap: `train NAME` finds NAME in the working folder
        bootstrap = [] if image else [sys.executable, "-m", "container_entry"]
        argv = [*bootstrap, "train", script.name if image else str(script), *script_args]
        env.update(PET_NPROC_PER_NODE="2", CONTAINER_ENTRY_MASTER_PORT=str(port))
        if not image:
            env["SAGEMAKER_BASE_DIR"] = str(base)
        if launcher != "ours":  # another copy of container_entry: --before DIR
            env["PYTHONPATH"] = str(before)
    if not image:
        return argv, {**clean_env(), **env}
    docker = ["docker", "run", "--rm", "--network", "none", "-v", f"{base}:{IN_IMAGE}"]
    docker += [f"--env={name}={value}" for name, value in env.items()]
    return [*docker, "-w", str(IN_IMAGE / "code"), image, *argv], dict(os.environ)


def lay_out(base: Path, hf: bool) -> None:
    """The run's tree: SageMaker's config for one host, the script in code/, result/."""
    make_tree(base)
    if hf:
        (base / "code" / HF_SCRIPT.name).write_bytes(HF_SCRIPT.read_bytes())
    else:
        (base / "code" / "relay_workload.py").write_text(WORKLOAD)
    (base / "result").mkdir()


def script_args(hf: bool, lines: int, stream: str, steps: int, result_dir: Path) -> list[str]:
    """The HF job's epochs, or the workload's steps, lines, stream and result folder."""
    if hf:
        return ["--epochs", str(HF_EPOCHS)]
    return [
        *("--steps", str(steps), "--lines", str(lines), "--stream", stream),
        *("--out", str(result_dir)),
    ]


@dataclass
class Finished:
    """A job that exited 0: the CPU its processes used (wait4), its output, its wall time."""

    usage: resource.struct_rusage
    drains: list[Drain]
    wall: float


def run_job(launcher: str, argv: list[str], env: dict[str, str], cwd: Path) -> Finished:
    """Start the job, drain both its pipes to their ends, reap it; RunFailed unless it exits 0."""
    started = time.monotonic()
    process = subprocess.Popen(
        argv, env=env, cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout is not None and process.stderr is not None
    drains = [Drain(process.stdout.fileno()), Drain(process.stderr.fileno())]
    for drain in drains:
        drain.start()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    for drain in drains:
        drain.join(timeout=30)
    wall = time.monotonic() - started
    if process.returncode != 0:
        raise RunFailed(
            f"{launcher} failed ({process.returncode}):\n"
            + drains[0].tail.decode(errors="replace")
            + drains[1].tail.decode(errors="replace")
        )
    return Finished(usage, drains, wall)


def run_once(
    launcher: str,
    lines: int,
    stream: str,
    steps: int,
    image: str | None = None,
    before: Path | None = None,
) -> dict:
    """One run of `launcher`: steps/s (rank 0's), the lines, where the CPU went."""
    hf = stream == "hf"
    with tempfile.TemporaryDirectory(prefix="relay-bench-") as tmp:
        base = Path(tmp)
        lay_out(base, hf)
        result_dir = (IN_IMAGE if image else base) / "result"
        args = script_args(hf, lines, stream, steps, result_dir)
        argv, env = command(launcher, base, args, free_port(), image, hf, before)
        job = run_job(launcher, argv, env, base / "code")
        ranks = [json.loads((base / "result" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    roles = cpu_roles(ranks)
    return {
        "steps_per_s": ranks[0]["train_steps_per_second" if hf else "steps_per_s"],
        "lines": sum(r.get("lines", 0) for r in ranks),
        "relay_cpu": roles["wrapper"] + roles["bootstrap"],
        "cpu": roles,
        # the docker CLI's own CPU says nothing of the job's: only measured on this host
        "job_cpu": None if image else job.usage.ru_utime + job.usage.ru_stime,
        "wall": job.wall,
        "lines_seen": job.drains[0].lines + job.drains[1].lines,
        "processes": {pid: item for rank in ranks for pid, item in rank.get("cpu", {}).items()},
    }


def cpu_roles(ranks: list[dict]) -> dict[str, float]:
    """CPU seconds per role over the timed window, each process counted once (both ranks see
    the bootstrap and torchrun among their ancestors)."""
    roles: dict[str, float] = {"wrapper": 0.0, "bootstrap": 0.0, "torchrun": 0.0, "script": 0.0}
    seen: set[str] = set()
    for rank in ranks:
        for pid, item in rank.get("cpu", {}).items():
            if pid not in seen:
                seen.add(pid)
                roles[role(item["cmd"])] += item["seconds"]
    return roles


def role(cmd: str) -> str:
    """Which process of the job a command line is (torchrun's names the wrapper module)."""
    if "torch.distributed.run" in cmd:
        return "torchrun"
    if "-m container_entry.worker" in cmd:
        return "wrapper"
    if "-m container_entry" in cmd or "container-entry" in cmd or cmd.startswith("train "):
        return "bootstrap"  # on this host, or the image's console script
    return "script"
