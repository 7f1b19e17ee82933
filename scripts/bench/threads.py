"""Steps per second of the CPU HF Trainer job: our OMP_NUM_THREADS default against torchrun's.

torchrun sets OMP_NUM_THREADS=1 for every worker when the user did not; the bootstrap sets it
to the host's cores divided by the workers per host instead
(container_entry/plan/worker_defaults.py). Both variants run the real bootstrap (`python -m
container_entry train`) on this host, one CPU worker as on a CPU instance, the same script and
data, in alternation for several rounds:

  ours      nothing set: the bootstrap's default (cores / workers)
  torchrun  OMP_NUM_THREADS=1 set by the user (what torchrun would have used); kept as is

The figure is the HF Trainer's own train_steps_per_second (examples/hf_trainer_tiny.py records
it), compared as a ratio of medians within one run. Results: docs/thread-benchmark.md.

`--shared-image IMAGE` measures instead hosts that share one machine (SageMaker local mode
with instance_count=2): a 2-host cluster of containers of IMAGE on this machine
(scripts/local/cluster.py), one worker each, the same job under

  ours        nothing set: the bootstrap divides this machine's cores among the workers of
              every host on it (they exchange kernel boot ids at the join)
  per-host    OMP_NUM_THREADS = this machine's cores per container, what each host chose on
              its own before (every host sizing its threads as if alone)

    python -m scripts.bench.threads [--rounds 3] [--batch-sizes 8,64] [--epochs 2]
    python -m scripts.bench.threads --shared-image container-entry:test [--rounds 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scripts import doc_block

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "hf_trainer_tiny.py"
DOCS = REPO / "docs" / "thread-benchmark.md"
VARIANTS = {"ours": {}, "torchrun": {"OMP_NUM_THREADS": "1"}}


def job_env(base: Path, extra: dict[str, str]) -> dict[str, str]:
    """This process's environment without anything that would steer the bootstrap."""
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SM_", "PET_", "SAGEMAKER_", "CONTAINER_ENTRY_", "OMP_"))
    }
    return {**keep, "SAGEMAKER_BASE_DIR": str(base), "SUMMARY_DIR": str(base / "summary"), **extra}


def threads_in_plan(extra: dict[str, str], base: Path) -> str:
    """OMP_NUM_THREADS as the workers will see it: added by the plan, or the user's own."""
    if "OMP_NUM_THREADS" in extra:
        return extra["OMP_NUM_THREADS"] + " (user)"
    argv = [sys.executable, "-m", "container_entry", "plan", str(SCRIPT)]
    out = subprocess.run(argv, env=job_env(base, extra), capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["env"]["OMP_NUM_THREADS"]["value"] + " (bootstrap)"


def run_once(extra: dict[str, str], batch: int, epochs: int) -> float:
    with tempfile.TemporaryDirectory(prefix="threads-") as tmp:
        base = Path(tmp)
        argv = [
            sys.executable, "-m", "container_entry", "train", str(SCRIPT),
            "--epochs", str(epochs), "--per-device-train-batch-size", str(batch),
        ]  # fmt: skip
        done = subprocess.run(argv, env=job_env(base, extra), capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"job failed ({done.returncode}):\n{done.stdout[-3000:]}")
        summary = json.loads((base / "summary" / "rank-0.json").read_text())
        return float(summary["train_steps_per_second"])


SHARED_HEADING = "## Hosts that share one machine"
SHARED_BEGIN, SHARED_END = "<!-- generated: shared machine -->", "<!-- end generated -->"


def shared_once(image: str, extra: dict[str, str], batch: int, epochs: int) -> tuple[float, str]:
    """One 2-host job on this machine: rank 0's steps/s and the OMP_NUM_THREADS it ran with."""
    from scripts.local.cluster import Cluster

    with tempfile.TemporaryDirectory(prefix="threads-shared-") as tmp:
        cluster = Cluster(
            image=image,
            root=Path(tmp),
            hyperparameters={
                "sagemaker_program": '"hf_trainer_tiny.py"',
                "epochs": str(epochs),
                "per-device-train-batch-size": str(batch),
            },
            environment={
                "PET_NPROC_PER_NODE": "1",
                "CONTAINER_ENTRY_PREFLIGHT": "false",
                **extra,
            },
            code={"hf_trainer_tiny.py": SCRIPT.read_bytes()},
        )
        results = cluster.run(timeout=600)
        if any(r.exit_code for r in results):
            raise SystemExit("job failed:\n" + "\n".join(r.logs[-2000:] for r in results))
        out = cluster.tree("algo-1") / "output" / "data"
        summary = json.loads(next(out.rglob("rank-0.json")).read_text())
        chosen = extra.get("OMP_NUM_THREADS") or next(
            (line.split("OMP_NUM_THREADS=")[1].split(":")[0] for line in
             results[0].logs.splitlines() if "OMP_NUM_THREADS=" in line), "?"
        )  # fmt: skip
        return float(summary["train_steps_per_second"]), chosen


Results = dict[int, dict[str, list[float]]]  # batch size -> variant -> steps/s per round
# one job: (round, variant, the variant's environment, batch size) -> steps/s
Run = Callable[[int, str, dict[str, str], int], float]


@dataclass(frozen=True)
class Settings:
    """What every variant runs: `rounds` in alternation of each per-device batch size (in the
    order given, repeats included) for `epochs`."""

    rounds: int
    batches: list[int]
    epochs: int


def alternate(settings: Settings, variants: dict[str, dict[str, str]], run: Run) -> Results:
    """Every variant for every batch size, round after round, the order flipped every round."""
    results: Results = {b: {n: [] for n in variants} for b in settings.batches}
    for round_no in range(settings.rounds):
        for batch in settings.batches:
            order = list(variants) if round_no % 2 == 0 else list(reversed(variants))
            for name in order:
                results[batch][name].append(run(round_no, name, variants[name], batch))
    return results


def shared_block(
    image: str, settings: Settings, cores: str, results: Results, chosen: dict[str, str]
) -> str:
    """The generated block of the page's shared-machine section."""
    rows = [
        "| per-device batch | ours: OMP_NUM_THREADS | per host alone: OMP_NUM_THREADS | "
        "steps/s ours | steps/s per host alone | ours / per host alone |",
        "|---|---|---|---|---|---|",
    ]
    for batch in settings.batches:
        ours, alone = (statistics.median(results[batch][n]) for n in ("ours", "per-host"))
        rows.append(f"| {batch} | {chosen['ours']} | {cores} | {ours:.2f} | {alone:.2f} | "
                    f"{ours / alone:.2f}x |")  # fmt: skip
    return "\n".join([
        f"Generated by `python -m scripts.bench.threads --shared-image {image}` on "
        f"{dt.date.today()}, {cores} CPUs: 2 hosts (containers) on this one machine, 1 worker "
        f"each, {settings.rounds} rounds in alternation, {settings.epochs} epochs; medians of "
        "rank 0's `train_steps_per_second`.",
        "",
        *rows,
        "",
        "Every round: " + "; ".join(
            f"batch {b}: ours {', '.join(f'{x:.2f}' for x in results[b]['ours'])}, per host "
            f"alone {', '.join(f'{x:.2f}' for x in results[b]['per-host'])}"
            for b in settings.batches
        ),
    ])  # fmt: skip


def shared_machine(image: str, settings: Settings, out: Path | None) -> int:
    """Hosts sharing this machine: ours against every host sizing its threads alone."""
    cores = str(os.cpu_count())
    variants = {"ours": {}, "per-host": {"OMP_NUM_THREADS": cores}}
    chosen: dict[str, str] = {}

    def run(round_no: int, name: str, extra: dict[str, str], batch: int) -> float:
        steps, chosen[name] = shared_once(image, extra, batch, settings.epochs)
        print(f"round {round_no + 1} batch {batch:>3} {name:<8} {steps:7.2f} steps/s "
              f"(OMP_NUM_THREADS={chosen[name]})", flush=True)  # fmt: skip
        return steps

    results = alternate(settings, variants, run)
    block = shared_block(image, settings, cores, results, chosen)
    print(block)
    if out is not None:
        doc_block.write_block(out, block, SHARED_BEGIN, SHARED_END)
        print(f"wrote {out}")
    return 0


def table(settings: Settings, results: Results, threads: dict[str, str]) -> str:
    """Medians per batch size: ours (with the bootstrap's thread count) against torchrun's 1."""
    rows = [
        "| per-device batch | ours: OMP_NUM_THREADS | steps/s ours | steps/s torchrun (1) "
        "| ours / torchrun |",
        "|---|---|---|---|---|",
    ]
    for batch in settings.batches:
        ours = statistics.median(results[batch]["ours"])
        bare = statistics.median(results[batch]["torchrun"])
        rows.append(
            f"| {batch} | {threads['ours']} | {ours:.2f} | {bare:.2f} | {ours / bare:.2f}x |"
        )
    return "\n".join(rows)


def page(settings: Settings, results: Results, threads: dict[str, str]) -> str:
    """docs/thread-benchmark.md up to its shared-machine section: how it was measured, the
    table, how to read it, every round's figures."""
    n = threads["ours"].split()[0]  # the bootstrap's OMP_NUM_THREADS
    return "\n".join(
        [
            "# OMP_NUM_THREADS: the bootstrap's default against torchrun's",
            "",
            f"Generated by `scripts/bench/threads.py` on {dt.date.today()}, "
            f"{os.cpu_count()} CPUs, {settings.rounds} rounds in alternation, {settings.epochs} "
            "epochs of `examples/hf_trainer_tiny.py` (512 rows, a 2-layer 32-wide BERT) through "
            "`python -m container_entry train`, one CPU worker. Medians of the HF Trainer's "
            "`train_steps_per_second`.",
            "",
            table(settings, results, threads),
            "",
            "Reading it: compare each ratio with the spread of the rounds below (this machine "
            f"drifts by a quarter within minutes). With {n} threads against 1 the most to gain "
            f"is {n}x; a small batch spends most of a step outside the matrix kernels that "
            "OpenMP spreads over threads, so the gain grows with the work per step. Hosts with "
            "more cores per worker (a CPU instance running one worker) have more to gain; run this "
            "script there for their figure.",
            "",
            "Every round:",
            "",
            *(
                f"- batch {b}: ours {', '.join(f'{x:.2f}' for x in results[b]['ours'])}; "
                f"torchrun {', '.join(f'{x:.2f}' for x in results[b]['torchrun'])}"
                for b in settings.batches
            ),
            "",
        ]
    )


def write_page(out: Path, text: str) -> None:
    """Replace the page, keeping its shared-machine section (another run's)."""
    previous = out.read_text() if out.exists() else ""
    shared = previous[previous.index(SHARED_HEADING) :] if SHARED_HEADING in previous else ""
    out.write_text(text + ("\n" + shared if shared else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-sizes", default="8,64", help="per-device batch sizes to try")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DOCS)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--shared-image", help="hosts sharing this machine, in this image")
    args = parser.parse_args()
    settings = Settings(args.rounds, [int(b) for b in args.batch_sizes.split(",")], args.epochs)
    if args.shared_image:
        return shared_machine(args.shared_image, settings, None if args.no_write else args.out)

    with tempfile.TemporaryDirectory() as tmp:
        threads = {name: threads_in_plan(extra, Path(tmp)) for name, extra in VARIANTS.items()}

    def run(round_no: int, name: str, extra: dict[str, str], batch: int) -> float:
        steps = run_once(extra, batch, settings.epochs)
        print(f"round {round_no + 1} batch {batch:>3} {name:<8} {steps:7.2f} steps/s")
        return steps

    results = alternate(settings, VARIANTS, run)
    print(table(settings, results, threads))
    if args.no_write:
        return 0
    write_page(args.out, page(settings, results, threads))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
