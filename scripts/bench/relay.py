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

    python -m scripts.bench.relay [--image IMAGE] [--rounds 5] [--steps 3000] [--before DIR]
                                      [--scenarios 1:stdout,20:stderr,hf] [--no-write]

This module is the command line and the rounds; relay_benchmark_run.py is one run (the
workload, the launchers' commands, the drained pipes), relay_benchmark_report.py the table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scripts import doc_block
from scripts.bench.relay_report import render
from scripts.bench.relay_run import HF_EPOCHS, REPO, RunFailed, run_once

DOCS = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- generated: make bench-relay -->", "<!-- end generated: make bench-relay -->"
SCENARIOS = [(1, "stdout"), (1, "stderr"), (20, "stdout"), (20, "stderr"), (0, "hf")]


def parse() -> argparse.Namespace:
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
    return args


def main() -> int:
    args = parse()
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
    return "python -m scripts.bench.relay " + " ".join(sys.argv[1:])


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


def measure(args: argparse.Namespace) -> tuple[dict, dict]:
    """Every scenario under every launcher, round after round, the order flipped every round;
    a run that fails is run once again."""
    scenarios = [scenario(item) for item in args.scenarios.split(",")]
    before = args.before.resolve() if args.before else None
    launchers = ["torchrun", "ours", *(["before"] if before else [])]
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
                    result = run_once(name, lines, stream, args.steps, args.image, before)
                except RunFailed as error:  # once: a crash that is not the launcher's
                    print(f"{name} failed, running it again: {str(error)[-1000:]}", flush=True)
                    result = run_once(name, lines, stream, args.steps, args.image, before)
                result["idle_before"] = idle
                results[(lines, stream)][name].append(result)
                print(progress(round_no, lines, stream, name, result, idle), flush=True)
    return results, meta_of(args, statistics.median(idle_seen))


def progress(round_no: int, lines: int, stream: str, name: str, result: dict, idle: float) -> str:
    """One run's line on the console."""
    return (
        f"round {round_no + 1} {lines:>2} lines {stream:<6} {name:<8} "
        f"{result['steps_per_s']:7.1f} steps/s  lines {result['lines_seen']}  cpu "
        + " ".join(f"{k} {v:.2f}" for k, v in result["cpu"].items())
        + f" s  job {result['job_cpu'] or 0:.1f} s  wall {result['wall']:.1f} s  "
        f"idle before {idle:.0%}"
    )


def meta_of(args: argparse.Namespace, idle_seen: float) -> dict:
    """What the table says of how the figures were taken."""
    python, torch_version = versions(args.image)
    return {
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
        "idle_seen": idle_seen,
    }


if __name__ == "__main__":
    sys.exit(main())
