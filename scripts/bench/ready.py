"""`make bench-ready`: container start -> READY on 2 hosts, ours and bare torchrun side by side.

READY is what every DDP script does before its first step: `import torch`,
`init_process_group`, its first `all_reduce` done. The job is scripts/bench/job.py with one
tick (its first tick line follows `init_process_group` and one `all_reduce`); per rank, that
line's time minus its container's docker `State.StartedAt`; the slowest rank's is the job's.
Variants alternate within a round (the order rotated each round); a ratio is the median of the
per-round ratios.

python -m scripts.bench.ready --image container-entry:bench --base IMAGE [--rounds 5]
                              [--before IMAGE]   (also ours as another image built: "before")
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from scripts.bench import observe
from scripts.bench.launchers import make_cluster
from scripts.bench.observe import LogTap
from scripts.bench.results import Config

VARIANTS = ("torchrun", "ours", "ours-nopreflight")
GOAL = 1.10  # ours as shipped / bare torchrun, median


def config(image: str, base: str, procs: int) -> Config:
    return Config(
        image=image, base=base, procs=procs, ticks=1, tick_seconds=0.0, fail_tick=0,
        steps=0, warmup=0, stop_timeout=10, fail_cap=60.0,
    )  # fmt: skip


def one(variant: str, conf: Config) -> dict[str, float]:
    """One job: {"ready": s, "first": s, "preflight": s (ours)}, slowest rank's; {} if it failed."""
    root = Path(tempfile.mkdtemp(prefix="ce-ready-"))
    job = {"ticks": 1, "tick-seconds": 0}
    if variant.startswith("before="):  # ours as shipped, from another image
        cluster = make_cluster("ours", replace(conf, image=variant.split("=", 1)[1]), job, root)
    else:
        cluster = make_cluster(variant, conf, job, root)
    try:
        cluster.start()
        tap = LogTap(cluster)
        results = cluster.wait(timeout=180)
        started = observe.started_at(cluster)
        events = tap.events()
        ready = {e.rank: e.t - started[e.host] for e in events if e.kind == "tick" and e.seq == 0}
        first = [e.t - started[e.host] for e in events if e.kind == "first"]
        if len(ready) < conf.world or any(r.exit_code != 0 for r in results):
            print(f"{variant}: failed\n{observe.tail(cluster)}", file=sys.stderr)
            return {}
        figures = {"ready": max(ready.values()), "first": max(first)}
        if tap.preflight_seconds():
            figures["preflight"] = max(tap.preflight_seconds())
        return figures
    finally:
        observe.cleanup(cluster)
        shutil.rmtree(root, ignore_errors=True)


def median(values: list[float]) -> str:
    return (
        f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})" if values else "-"
    )


def table(runs: list[dict[str, dict[str, float]]], variants: list[str]) -> str:
    """Medians per variant and the per-round ratios against bare torchrun."""

    def column(variant: str, figure: str) -> list[float]:
        return [r[variant][figure] for r in runs if figure in r.get(variant, {})]

    def ratio(variant: str) -> list[float]:
        return [
            r[variant]["ready"] / r["torchrun"]["ready"]
            for r in runs
            if "ready" in r.get(variant, {}) and "ready" in r.get("torchrun", {})
        ]

    rows = [
        "| container start → (s) | " + " | ".join(variants) + " |",
        "|---" * (len(variants) + 1) + "|",
    ]
    for figure, label in (("first", "the script's first line"), ("ready", "READY")):
        rows.append(
            f"| {label} | " + " | ".join(median(column(v, figure)) for v in variants) + " |"
        )
    rows.append(
        "| ... of it: the preflight (its ok line) | "
        + " | ".join(median(column(v, "preflight")) for v in variants)
        + " |"
    )
    rows.append("")
    for variant in variants[1:]:
        ratios = ratio(variant)
        if ratios:
            line = f"{variant} / torchrun, READY: {statistics.median(ratios):.2f}x"
            rounds = ", ".join(f"{x:.2f}" for x in ratios)
            rows.append(f"{line} (rounds: {rounds})")
    shipped = ratio("ours")
    if shipped:
        met = "met" if statistics.median(shipped) <= GOAL else "NOT met"
        rows.append(f"goal: ours (preflight on) <= {GOAL:.2f}x bare torchrun: {met}")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="container-entry:bench")
    parser.add_argument("--base", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--procs", type=int, default=1, help="workers per host")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--before", help="an image of ours built before a change, run beside")
    args = parser.parse_args()
    conf = config(args.image, args.base, args.procs)
    variants = args.variants.split(",")
    if variants[0] != "torchrun":
        parser.error("--variants: torchrun first (the ratios are against it)")
    if args.before:
        variants.append(f"before={args.before}")
    runs: list[dict[str, dict[str, float]]] = []
    began = time.monotonic()
    for round_ in range(args.rounds):
        order = variants[round_ % len(variants) :] + variants[: round_ % len(variants)]
        runs.append({})
        for variant in order:
            runs[-1][variant] = one(variant, conf)
            print(f"[{time.monotonic() - began:5.0f} s] round {round_} {variant}: "
                  f"{runs[-1][variant]}", flush=True)  # fmt: skip
    print()
    print(table(runs, variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
