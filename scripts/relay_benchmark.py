"""Steps per second of a log-heavy DDP loop: our launch against bare torchrun, same machine.

A tiny DDP MLP (gloo, 2 workers on this host, OMP_NUM_THREADS=1 for both) prints one line per
step and, in the heavier scenarios, 20 lines of ~100 bytes per step, to stdout or to stderr
(logging and tqdm write to stderr). Each scenario runs under

  torchrun  `python -m torch.distributed.run --nproc-per-node 2 WORKLOAD`: the workers write
            straight to the job's stdout/stderr (Python block-buffers stdout on a pipe)
  ours      `python -m container_entry train WORKLOAD` (a temporary /opt/ml tree): every line
            relayed by the per-rank wrapper (tagged, masked, rank log, rank record)

in alternation (the order flips every round), both writing into pipes this script drains, as
docker's log pipe would. With `--image IMAGE` (what `make bench` runs) each run is a container of
that image instead: `docker run IMAGE python3 -m torch.distributed.run ...` against
`docker run IMAGE train ...`, the same torch, Python and CPUs for both. Scenario `hf` is the tiny
HF Trainer job (examples/hf_trainer_tiny.py, one log line per step) under both launchers, its
steps/s from the Trainer's own `train_steps_per_second`. Rank 0 times its steps after a
warm-up; each rank also reads the CPU seconds of its ancestors (/proc) over the same window: for
ours the wrapper, torchrun and the bootstrap, whose sum over both ranks' wrappers plus the
bootstrap is "relay CPU".
Results: median (min-max) over the rounds; the ratio is the median of the per-round ratios.

    python -m scripts.relay_benchmark [--image IMAGE] [--rounds 5] [--steps 3000] [--before DIR]
                                      [--scenarios 1:stdout,20:stderr,hf] [--no-write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from scripts import doc_block

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- generated: make bench-relay -->", "<!-- end generated: make bench-relay -->"
GOALS = {0: 0.98, 1: 0.98, 20: 0.95}  # lines per step (0: the HF job) -> ours / torchrun
BEFORE: dict[str, Path] = {}  # launcher name -> folder holding another container_entry
SCENARIOS = [(1, "stdout"), (1, "stderr"), (20, "stdout"), (20, "stderr"), (0, "hf")]
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


def idle_share(seconds: float = 1.0) -> float:
    """Share of this machine's CPU time that was idle over `seconds` (/proc/stat)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as handle:
            fields = [int(x) for x in handle.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)

    idle0, total0 = sample()
    time.sleep(seconds)
    idle1, total1 = sample()
    return (idle1 - idle0) / max(1, total1 - total0)


def wait_until_quiet(threshold: float, limit: float) -> float:
    """Wait (up to `limit` s) until the machine is at least `threshold` idle: other work on
    a 2-CPU machine moves steps/s more than the relay does. Returns the idle share seen."""
    deadline = time.monotonic() + limit
    while True:
        share = idle_share()
        if share >= threshold or time.monotonic() > deadline:
            return share


class RunFailed(Exception):
    pass


def command(
    launcher: str, base: Path, script_args: list[str], port: int, image: str | None, hf: bool
) -> tuple[list[str], dict[str, str]]:
    """The job's command line and environment, on this host or in a container of `image`."""
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
            env["PYTHONPATH"] = str(BEFORE[launcher])
    if not image:
        return argv, {**clean_env(), **env}
    docker = ["docker", "run", "--rm", "--network", "none", "-v", f"{base}:{IN_IMAGE}"]
    docker += [f"--env={name}={value}" for name, value in env.items()]
    return [*docker, "-w", str(IN_IMAGE / "code"), image, *argv], dict(os.environ)


def run_once(launcher: str, lines: int, stream: str, steps: int, image: str | None = None) -> dict:
    hf = stream == "hf"
    with tempfile.TemporaryDirectory(prefix="relay-bench-") as tmp:
        base = Path(tmp)
        make_tree(base)
        if hf:
            (base / "code" / HF_SCRIPT.name).write_bytes(HF_SCRIPT.read_bytes())
        else:
            (base / "code" / "relay_workload.py").write_text(WORKLOAD)
        out = base / "result"
        out.mkdir()
        result_dir = (IN_IMAGE if image else base) / "result"
        script_args = (
            ["--epochs", str(HF_EPOCHS)]
            if hf
            else [
                *("--steps", str(steps), "--lines", str(lines), "--stream", stream),
                *("--out", str(result_dir)),
            ]
        )
        argv, env = command(launcher, base, script_args, free_port(), image, hf)
        started = time.monotonic()
        process = subprocess.Popen(
            argv, env=env, cwd=str(base / "code"), stdout=subprocess.PIPE, stderr=subprocess.PIPE
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
        ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    roles: dict[str, float] = {"wrapper": 0.0, "bootstrap": 0.0, "torchrun": 0.0, "script": 0.0}
    seen: set[str] = set()
    for rank in ranks:
        for pid, item in rank.get("cpu", {}).items():
            if pid not in seen:
                seen.add(pid)
                roles[role(item["cmd"])] += item["seconds"]
    return {
        "steps_per_s": ranks[0]["train_steps_per_second" if hf else "steps_per_s"],
        "lines": sum(r.get("lines", 0) for r in ranks),
        "relay_cpu": roles["wrapper"] + roles["bootstrap"],
        "cpu": roles,
        # the docker CLI's own CPU says nothing of the job's: only measured on this host
        "job_cpu": None if image else usage.ru_utime + usage.ru_stime,
        "wall": wall,
        "lines_seen": drains[0].lines + drains[1].lines,
        "processes": {pid: item for rank in ranks for pid, item in rank.get("cpu", {}).items()},
    }


def role(cmd: str) -> str:
    """Which process of the job a command line is (torchrun's names the wrapper module)."""
    if "torch.distributed.run" in cmd:
        return "torchrun"
    if "-m container_entry.worker" in cmd:
        return "wrapper"
    if "-m container_entry" in cmd or "container-entry" in cmd or cmd.startswith("train "):
        return "bootstrap"  # on this host, or the image's console script
    return "script"


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    return (
        f"{fmt.format(statistics.median(values))} "
        f"({fmt.format(min(values))}-{fmt.format(max(values))})"
    )


def label(lines: int, stream: str, epochs: int = HF_EPOCHS) -> str:
    if stream == "hf":
        return f"HF Trainer job (tiny BERT, {epochs} epochs, a log line per step)"
    return f"1, {stream}" if lines <= 1 else f"{1 + lines} (1 + {lines}), {stream}"


def ratios(cell: dict, name: str) -> list[float]:
    """Per-round ratio to bare torchrun of the same round."""
    pairs = zip(cell[name], cell["torchrun"], strict=True)
    return [o["steps_per_s"] / b["steps_per_s"] for o, b in pairs]


def per_million(runs: list[dict], key: str = "relay_cpu") -> list[float]:
    return [(r["cpu"][key] if key in r["cpu"] else r[key]) / r["lines"] * 1e6 for r in runs]


def spread_or_dash(values: list[float | None], fmt: str = "{:.1f}") -> str:
    """A spread where every round measured the figure; "-" where it is not taken."""
    return "-" if not values or any(v is None for v in values) else spread(values, fmt)


def render(results: dict, meta: dict) -> str:
    """The markdown block: steps/s with the goals, then where the relay's CPU goes."""
    epochs = meta.get("hf_epochs", 4)  # runs saved before it was recorded had 4
    before = any("before" in cell for cell in results.values())
    unbuffered = any("torchrun-u" in cell for cell in results.values())
    head = "| lines per step, stream | bare torchrun, steps/s | ours, steps/s | ours / torchrun "
    head += "| goal | met |"
    rule = "|---|---|---|---|---|---|"
    if before:
        head += " before this change, steps/s | before / torchrun |"
        rule += "---|---|"
    if unbuffered:
        head += " torchrun, workers unbuffered, steps/s | ours / that |"
        rule += "---|---|"
    rows = [head, rule]
    for (lines, stream), cell in results.items():
        goal = GOALS.get(lines, GOALS[20])
        ratio = ratios(cell, "ours")
        met = "yes" if statistics.median(ratio) >= goal else "**no**"
        row = (
            f"| {label(lines, stream, epochs)} "
            f"| {spread([r['steps_per_s'] for r in cell['torchrun']])} "
            f"| {spread([r['steps_per_s'] for r in cell['ours']])} "
            f"| {spread(ratio, '{:.2f}x')} | ≥ {goal:.2f}x | {met} |"
        )
        if before:
            row += (
                f" {spread([r['steps_per_s'] for r in cell['before']])} "
                f"| {spread(ratios(cell, 'before'), '{:.2f}x')} |"
            )
        if unbuffered:
            pairs = zip(cell["ours"], cell["torchrun-u"], strict=True)
            row += (
                f" {spread([r['steps_per_s'] for r in cell['torchrun-u']])} "
                f"| {spread([o['steps_per_s'] / u['steps_per_s'] for o, u in pairs], '{:.2f}x')} |"
            )
        rows.append(row)
    cpu_head = (
        "| lines per step, stream | relay CPU s per million lines, ours "
        "| of it: wrappers | of it: bootstrap |"
    )
    cpu_rule = "|---|---|---|---|"
    if before:
        cpu_head += " before: relay | of it: wrappers | of it: bootstrap |"
        cpu_rule += "---|---|---|"
    cpu_head += " whole job CPU s: torchrun | ours |"
    cpu_rule += "---|---|"
    cpu_rows = [cpu_head, cpu_rule]
    for (lines, stream), cell in results.items():
        if stream == "hf":  # its lines are the Trainer's own, not counted
            continue
        row = f"| {label(lines, stream, epochs)} "
        names = ["ours", "before"] if before else ["ours"]
        for name in names:
            row += (
                f"| {spread(per_million(cell[name]))} "
                f"| {spread(per_million(cell[name], 'wrapper'))} "
                f"| {spread(per_million(cell[name], 'bootstrap'))} "
            )
        row += (
            f"| {spread_or_dash([r['job_cpu'] for r in cell['torchrun']])} "
            f"| {spread_or_dash([r['job_cpu'] for r in cell['ours']])} |"
        )
        cpu_rows.append(row)
    return "\n".join(
        [
            f"Generated by `{meta.get('invocation', 'make bench-relay')}` on {meta['when']}: "
            f"{meta['cpus']} CPUs, "
            + (
                f"in containers of the image `{meta['image']}` (both launchers), "
                if meta.get("image")
                else "on the host, "
            )
            + f"Python {meta['python']}, torch {meta['torch']}; {meta['rounds']} alternated "
            f"rounds of {meta['steps']} steps ({meta['steps'] - 100} timed after 100 warm-up "
            f"steps; the HF Trainer job: {epochs} epochs, its own steps/s), 2 "
            "workers, gloo, `OMP_NUM_THREADS=1`; each run started once the CPUs were at least "
            f"{meta['idle']:.0%} idle (median idle share before a run "
            f"{meta['idle_seen']:.0%}). Cells: median (min-max) over the rounds; a ratio is "
            "the median of the per-round ratios."
            + (
                " *before this change*: the same tree with the previous worker.py and "
                "launch.py (two pump threads per rank, stderr through the bootstrap)."
                if before
                else ""
            ),
            "",
            *rows,
            "",
            "CPU over the timed window, from /proc: *relay* is both ranks' wrappers plus the "
            "bootstrap (its monitor loop, and before this change its stderr pump); *whole job* "
            "is every process of the run, start-up included (`wait4`; not taken in containers, "
            "where it would be the docker client's).",
            "",
            *cpu_rows,
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", help="run both launchers in containers of this image")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument(
        "--scenarios",
        default=",".join(f"{n}:{s}" if s != "hf" else s for n, s in SCENARIOS),
        help="e.g. 20:stderr,hf",
    )
    parser.add_argument(
        "--idle",
        type=float,
        default=0.8,
        help="before each run wait (up to 120 s) until this share of the CPUs is idle; 0: never",
    )
    parser.add_argument(
        "--before",
        type=Path,
        help="a folder with another container_entry package (e.g. `git archive HEAD "
        "container_entry | tar -x -C DIR`): adds launcher `before`, run in every round too",
    )
    parser.add_argument(
        "--unbuffered",
        action="store_true",
        help="adds launcher `torchrun-u`: bare torchrun with PYTHONUNBUFFERED=1 (what `-u` costs)",
    )
    parser.add_argument("--out", type=Path, default=DOCS)
    parser.add_argument("--json", type=Path, default=REPO / "build" / "relay-benchmark.json")
    parser.add_argument("--from-json", type=Path, help="render a previous run's results only")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--make-target", help=argparse.SUPPRESS)  # the page names the target
    args = parser.parse_args()
    if args.image and args.before:
        parser.error("--before runs another container_entry on this host: not with --image")
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        results = {scenario(k): v for k, v in saved["results"].items()}
        meta = saved["meta"]
    else:
        results, meta = measure(args)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        saved = {"meta": meta, "results": {f"{n}:{s}": v for (n, s), v in results.items()}}
        args.json.write_text(json.dumps(saved, indent=1))
    table = render(results, meta)
    print(table)
    if not args.no_write:
        doc_block.write_block(args.out, table, BEGIN, END)
        print(f"written: {args.out}")
    return 0


def invocation(target: str | None) -> str:
    """How this run was started, as the page names it: the make target that says so
    (`--make-target`, with make's ARGS where they reached this command), else this command
    line."""
    if target:
        given = (os.environ.get("ARGS") or "").split()
        passed = bool(given) and sys.argv[-len(given) :] == given
        return f"make {target}" + (f" ARGS='{' '.join(given)}'" if passed else "")
    return "python -m scripts.relay_benchmark " + " ".join(sys.argv[1:])


def versions(image: str | None) -> tuple[str, str]:
    """Python and torch as the runs see them: this host's, or the image's."""
    if not image:
        import torch

        return platform.python_version(), torch.__version__.split("+")[0]
    probe = "import platform, torch; print(platform.python_version(), torch.__version__)"
    said = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", image, "python3", "-c", probe],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return said[0], said[1].split("+")[0]


def scenario(item: str) -> tuple[int, str]:
    """ "20:stderr" -> (20, "stderr"); "hf" -> (0, "hf")."""
    lines, _, stream = item.rpartition(":")
    return int(lines or 0), stream


def measure(args: argparse.Namespace) -> tuple[dict, dict]:
    scenarios = [scenario(item) for item in args.scenarios.split(",")]
    launchers = ["torchrun", "ours"]
    if args.before:
        BEFORE["before"] = args.before.resolve()
        launchers.append("before")
    if args.unbuffered:
        launchers.append("torchrun-u")
    results: dict = {key: {name: [] for name in launchers} for key in scenarios}
    idle_seen = []
    for round_no in range(args.rounds):
        for lines, stream in scenarios:
            order = launchers if round_no % 2 == 0 else list(reversed(launchers))
            for name in order:
                idle = wait_until_quiet(args.idle, 120) if args.idle else 1.0
                idle_seen.append(idle)
                try:
                    result = run_once(name, lines, stream, args.steps, args.image)
                except RunFailed as error:  # once: a crash that is not the launcher's
                    print(f"{name} failed, running it again: {str(error)[-1000:]}", flush=True)
                    result = run_once(name, lines, stream, args.steps, args.image)
                result["idle_before"] = idle
                results[(lines, stream)][name].append(result)
                print(
                    f"round {round_no + 1} {lines:>2} lines {stream:<6} {name:<8} "
                    f"{result['steps_per_s']:7.1f} steps/s  lines {result['lines_seen']}  cpu "
                    + " ".join(f"{k} {v:.2f}" for k, v in result["cpu"].items())
                    + f" s  job {result['job_cpu'] or 0:.1f} s  wall {result['wall']:.1f} s  "
                    f"idle before {idle:.0%}",
                    flush=True,
                )
    python, torch_version = versions(args.image)
    meta = {
        "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "invocation": invocation(args.make_target),
        "image": args.image,
        "cpus": os.cpu_count(),
        "python": python,
        "torch": torch_version,
        "rounds": args.rounds,
        "steps": args.steps,
        "hf_epochs": HF_EPOCHS,
        "idle": args.idle,
        "idle_seen": statistics.median(idle_seen),
    }
    return results, meta


if __name__ == "__main__":
    sys.exit(main())
