"""What the straggler watch costs training: steps/s with sampling off against sampling often.

Every CONTAINER_ENTRY_STRAGGLER_INTERVAL seconds (default 180; 0: off) the bootstrap asks every
rank for a flight-recorder dump (the rank's daemon thread in container_entry/rank/_site/
sitecustomize.py writes it) and summarises it (container_entry/supervise/straggler_watch.py).
The requirement: at most 0.5% of steps/s at the default interval. Two jobs, each under our
launcher on this host (`python -m container_entry train`, a temporary /opt/ml tree, 2 workers,
OMP_NUM_THREADS=1: the relay benchmark's run, scripts/bench/relay_run.py), no docker:

  hf   the tiny HF Trainer job (examples/hf_trainer_tiny.py), steps/s from the Trainer's own
       `train_steps_per_second` (rank 0)
  ddp  a plain DDP step loop (a tiny MLP, gloo), steps/s timed by rank 0 after a warm-up; at
       ~600 steps/s its ring of 2000 records is always full: every dump is the largest one

each run with sampling off (interval 0) and every `--interval` seconds (5: 36 times as often as
the default, so that a run of `--seconds` of training holds several samples), in alternation,
the order flipped every round. One warm-up run per job first (not counted) sizes the runs
(epochs, steps) to about `--seconds` of training and warms the page cache.

Figures: median (min-max) steps/s of each; the median of the per-round ratios on/off; the cost
at the short interval, 1 - ratio; and extrapolated to the default interval, cost x short / 180.
A sample costs per sample: a dump is the rank's whole ring of 2000 records, full after seconds
of either job (the HF job makes about 6 collectives a step), every 5 s as every 180 s; so the
cost scales with how often samples come. `samples` are the master's writes of
output/data/container-entry/stragglers.json seen during a run (one per sample that lined
collectives up): a 0 there means the watch never sampled. `job CPU a sample`: the CPU seconds
(wait4) of all the job's processes with sampling on less off in the same round, the same work
both ways, per sample: what a sample takes from the ranks on a host whose CPUs they fill.

The direct measure (ddp only): rank 0 records every step's end on the wall clock, and the watch
samples at multiples of the interval on that clock (the first an interval or more after the
bootstrap started; which ones is read from the table's writes). Rank 0's steps are counted by
the phase of the interval (0.5 s bins after each multiple), over the cycles that began with a
sample, and over every cycle of the runs with sampling off (the control: what the machine does
at those moments anyway); the pace of each bin of the first half is set against the second
half's, and the time lost in the first half, on less off, is what one sample stalls the job.
That / 180 s is the cost at the default interval: a cross-check of the steps/s figure, which on
a 2-CPU machine is noisier than the cost it extrapolates.

    python -m scripts.bench.stragglers [--rounds 4] [--seconds 25] [--interval 5]
                                       [--jobs hf,ddp] [--json build/stragglers-benchmark.json]
    python -m scripts.bench.stragglers --from-json build/stragglers-benchmark.json

A default invocation takes 9-11 minutes on 2 CPUs (`make bench-stragglers`), more under other load.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

from container_entry.plan.settings import Settings
from scripts.bench.relay import versions, wait_until_quiet
from scripts.bench.relay_run import REPO, RunFailed
from scripts.bench.stragglers_run import DDP_WARMUP, Run, Stall, run_once, stall

DEFAULT_INTERVAL = float(Settings().straggler_interval)
BUDGET = 0.005  # the requirement: at most 0.5% of steps/s at the default interval
JOBS = ("hf", "ddp")
WARMUP_SIZE = {"hf": 4, "ddp": 3000}  # epochs, steps


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=25.0, help="of training per run")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--jobs", default=",".join(JOBS), help="hf, ddp or both")
    parser.add_argument(
        "--idle",
        type=float,
        default=0.8,
        help="before each run wait (up to --idle-wait s) until this share of the CPUs is idle",
    )
    parser.add_argument("--idle-wait", type=float, default=6.0)
    parser.add_argument("--json", type=Path, default=REPO / "build" / "stragglers-benchmark.json")
    parser.add_argument("--from-json", type=Path, help="print a previous run's table only")
    args = parser.parse_args()
    args.jobs = [job.strip() for job in args.jobs.split(",") if job.strip()]
    if not set(args.jobs) <= set(JOBS) or not args.jobs:
        parser.error(f"--jobs: some of {', '.join(JOBS)}")
    if args.interval <= 0 or args.rounds < 1:
        parser.error("--interval > 0 and --rounds >= 1")
    return args


def main() -> int:
    args = parse()
    if args.from_json:
        print(report(*load(args.from_json, args), args=args))
        return 0
    began = time.monotonic()
    sizes = {job: size_of(job, args.seconds) for job in args.jobs}
    runs: dict[str, dict[float, list[Run]]] = {job: {0.0: [], args.interval: []} for job in sizes}
    for round_no in range(args.rounds):
        for job, size in sizes.items():
            order = [0.0, args.interval] if round_no % 2 == 0 else [args.interval, 0.0]
            for interval in order:
                run = measured(job, interval, size, args)
                runs[job][interval].append(run)
                print(progress(round_no, run, args.interval), flush=True)
    elapsed = time.monotonic() - began
    print()
    print(report(runs, sizes, elapsed, args=args))
    save(args.json, runs, args, sizes, elapsed)
    return 0


def size_of(job: str, seconds: float) -> int:
    """The job's epochs (hf) or steps (ddp) for about `seconds` of training, from a warm-up run
    with sampling off."""
    warm = run_once(job, 0.0, WARMUP_SIZE[job])
    rate = warm.steps_per_s
    if job == "hf":
        per_epoch = warm.steps / WARMUP_SIZE[job]
        size = max(1, round(seconds * rate / per_epoch))
        said = f"{size} epochs ({size * per_epoch:.0f} steps)"
    else:
        size = DDP_WARMUP + round(seconds * rate)
        said = f"{size} steps"
    print(f"warm-up {job:<3} {rate:7.1f} steps/s  wall {warm.wall:.1f} s -> {said}", flush=True)
    return size


def measured(job: str, interval: float, size: int, args: argparse.Namespace) -> Run:
    """One run after the machine quietened (bounded); one that fails is run once again."""
    if args.idle:
        wait_until_quiet(args.idle, args.idle_wait)
    try:
        return run_once(job, interval, size)
    except RunFailed as error:  # once: a crash that is not the watch's
        print(f"{job} failed, running it again: {str(error)[-1000:]}", flush=True)
        return run_once(job, interval, size)


def progress(round_no: int, run: Run, short: float) -> str:
    """One run's line on the console (the stall: ddp's, read at the sample moments, also with
    sampling off: the control)."""
    mode = f"every {run.interval:g} s" if run.interval else "off"
    line = (
        f"round {round_no + 1} {run.job:<3} {mode:<10} {run.steps_per_s:8.1f} steps/s  "
        f"samples {run.samples:2d}  wall {run.wall:5.1f} s  job cpu {run.job_cpu:5.1f} s"
    )
    found = stall(run, short)
    if found:
        line += f"  lost after a moment {lost([found])[1] * 1000:+.0f} ms"
    return line + "".join(f"\n    {said}" for said in run.watch_lines)


def spread(values: list[float], fmt: str) -> str:
    """median (min-max)."""
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def percent(share: float) -> str:
    return f"{share * 100:+.2f}%"


def report(
    runs: dict[str, dict[float, list[Run]]],
    sizes: dict[str, int],
    elapsed: float,
    *,
    args: argparse.Namespace,
) -> str:
    """The table: per job, steps/s off and on, the ratio, the cost there and at the default."""
    short = args.interval
    scale = short / DEFAULT_INTERVAL
    python, torch_version = versions(None)
    lines = [
        f"Straggler watch: steps/s with sampling off (STRAGGLER_INTERVAL=0) against every "
        f"{short:g} s ({DEFAULT_INTERVAL / short:.0f}x the default {DEFAULT_INTERVAL:g} s), "
        f"our launcher, 2 workers (gloo) on this host ({os.cpu_count()} CPUs), Python {python}, "
        f"torch {torch_version}; {args.rounds} rounds, ~{args.seconds:g} s of training a run, "
        f"the order flipped every round.",
        "",
        f"| job | off: steps/s | every {short:g} s: steps/s | on/off (median of rounds) "
        f"| cost every {short:g} s | cost every {DEFAULT_INTERVAL:g} s (x{scale:.3f}) "
        f"| samples a run | job CPU a sample | within {BUDGET:.1%} |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for job, by_mode in runs.items():
        off, on = by_mode[0.0], by_mode[short]
        ratios = [b.steps_per_s / a.steps_per_s for a, b in zip(off, on, strict=True)]
        cost = 1 - statistics.median(ratios)
        worst = 1 - min(ratios)
        samples = [run.samples for run in on]
        # the same work both ways: what the job's processes spent more, per sample taken
        extra = [(b.job_cpu - a.job_cpu) / max(1, b.samples) for a, b in zip(off, on, strict=True)]
        lines.append(
            f"| {job} ({sizes[job]} {'epochs' if job == 'hf' else 'steps'}) "
            f"| {spread([r.steps_per_s for r in off], '.1f')} "
            f"| {spread([r.steps_per_s for r in on], '.1f')} "
            f"| {spread(ratios, '.4f')} | {percent(cost)} (worst round {percent(worst)}) "
            f"| {percent(cost * scale)} (worst round {percent(worst * scale)}) "
            f"| {spread([float(s) for s in samples], '.0f')} "
            f"| {statistics.median(extra):+.2f} s "
            f"| {'yes' if cost * scale <= BUDGET else 'NO'} |"
        )
    lengths = {
        job: [(t % short) * 1000 for run in by_mode[short] for t in run.sampled[:-1]]
        for job, by_mode in runs.items()
    }
    lines += [
        "",
        "A sample's length, its moment to the master's write of the table (each run's last "
        "write left out: it may come as the ranks exit), median (min-max): "
        + ", ".join(f"{job} {spread(ms, '.0f')} ms" for job, ms in lengths.items() if ms)
        + ".",
    ]
    lines += ["", "Per round, steps/s off / on (ratio):", ""]
    for job, by_mode in runs.items():
        pairs = zip(by_mode[0.0], by_mode[short], strict=True)
        rounds = [
            f"{a.steps_per_s:.1f} / {b.steps_per_s:.1f} ({b.steps_per_s / a.steps_per_s:.3f})"
            for a, b in pairs
        ]
        lines.append(f"- {job}: " + ", ".join(rounds))
    if "ddp" in runs:
        lines += ["", *stall_lines(runs["ddp"], short)]
    silent = [run for by_mode in runs.values() for run in by_mode[short] if not run.samples]
    if silent:
        lines += [
            "",
            f"WARNING: {len(silent)} run(s) with sampling on saw no stragglers.json write",
        ]
    said = sorted(
        {line for by_mode in runs.values() for r in by_mode[short] for line in r.watch_lines}
    )
    lines += [
        "",
        "The watch's own lines: " + ("; ".join(said) if said else "none (a balanced job)"),
    ]
    lines.append(f"\nTotal runtime {elapsed / 60:.1f} min ({elapsed:.0f} s).")
    return "\n".join(lines)


def lost(stalls: list[Stall]) -> tuple[list[float], float]:
    """The pace in the first half's bins (every run's, weighted by its cycles) and the time
    lost there per cycle, s."""
    cycles = sum(found.cycles for found in stalls)
    paces = [found.pace() for found in stalls]
    half = len(paces[0]) // 2
    pace = [
        sum(p[b] * found.cycles for p, found in zip(paces, stalls, strict=True)) / cycles
        for b in range(half)
    ]
    width = stalls[0].interval / len(paces[0])
    return pace, width * sum(1 - value for value in pace)


def stall_lines(by_mode: dict[float, list[Run]], short: float) -> list[str]:
    """The direct measure: the steps' pace after a sample moment, sampling on and off."""
    found = {
        mode: [f for f in (stall(run, short) for run in mode_runs) if f]
        for mode, mode_runs in by_mode.items()
    }
    if not found[short] or not found[0.0]:
        return ["Stall per sample (ddp): no whole sampled cycle inside the timed steps."]
    rows, cost = [], {}
    names = {short: f"every {short:g} s: cycles begun by a sample", 0.0: "off: every cycle"}
    for mode, name in names.items():
        pace, cost[mode] = lost(found[mode])
        longest = statistics.median(x for f in found[mode] for x in f.longest)
        cycles = sum(f.cycles for f in found[mode])
        rows.append(
            f"| {name} | {cycles} | {' '.join(f'{p:.2f}' for p in pace)} "
            f"| {cost[mode] * 1000:.0f} ms | {longest * 1000:.0f} ms |"
        )
    per_sample = cost[short] - cost[0.0]
    width = short / len(found[short][0].counts)
    return [
        f"Stall per sample (ddp, rank 0): its steps in each {width:g} s after a multiple of "
        f"{short:g} s on the wall clock (when the watch samples), against their pace in the "
        f"interval's second half; every run's cycles, weighted (off: the control, what the "
        f"machine does at those moments):",
        "",
        f"| sampling | cycles | pace in the first half, per {width:g} s | time lost in it a cycle "
        "| longest step in it (median) |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"One sample costs the job about {per_sample * 1000:.0f} ms (on less off): "
        f"{percent(per_sample / short)} of the time at every {short:g} s, "
        f"{percent(per_sample / DEFAULT_INTERVAL)} at every {DEFAULT_INTERVAL:g} s.",
    ]


def save(
    path: Path,
    runs: dict[str, dict[float, list[Run]]],
    args: argparse.Namespace,
    sizes: dict[str, int],
    elapsed: float,
) -> None:
    """Every run's figures (with rank 0's step ends: the stall can be read again) and its stall
    figures, as JSON."""
    data = {
        "invocation": "python -m scripts.bench.stragglers " + " ".join(sys.argv[1:]),
        "interval": args.interval,
        "default_interval": DEFAULT_INTERVAL,
        "rounds": args.rounds,
        "seconds": args.seconds,
        "sizes": sizes,
        "elapsed": elapsed,
        "runs": {
            job: {
                f"{mode:g}": [
                    {
                        **dataclasses.asdict(run),
                        "stall": dataclasses.asdict(s)
                        if (s := stall(run, args.interval))
                        else None,
                    }
                    for run in by_mode[mode]
                ]
                for mode in by_mode
            }
            for job, by_mode in runs.items()
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    print(f"written: {path}")


def load(
    path: Path, args: argparse.Namespace
) -> tuple[dict[str, dict[float, list[Run]]], dict[str, int], float]:
    """A saved run's runs, sizes and runtime; its interval, rounds and seconds into `args`."""
    data = json.loads(path.read_text())
    args.interval, args.rounds, args.seconds = data["interval"], data["rounds"], data["seconds"]
    fields = {field.name for field in dataclasses.fields(Run)}
    runs = {
        job: {
            float(mode): [Run(**{k: v for k, v in run.items() if k in fields}) for run in saved]
            for mode, saved in by_mode.items()
        }
        for job, by_mode in data["runs"].items()
    }
    return runs, data["sizes"], data["elapsed"]


if __name__ == "__main__":
    sys.exit(main())
