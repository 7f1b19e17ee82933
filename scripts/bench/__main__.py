"""`make bench`: run every scenario for every variant, round after round; write the results.

python -m scripts.bench --image container-entry:bench [--rounds 4 | --quick]
python -m scripts.bench --render build/benchmark.json   (the page again from saved results)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import docker
from scripts.bench import observe, report
from scripts.bench.measure import SCENARIOS
from scripts.bench.results import VARIANTS, Config, ImageSizes, Load, Results, Run

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "benchmarks.md"


def make_config(image: str, base: str, procs: int, quick: bool) -> Config:
    return Config(
        image=image,
        base=base,
        procs=procs,
        ticks=8 if quick else 12,
        tick_seconds=0.25,
        fail_tick=6,
        steps=40 if quick else 400,  # ~10 s timed (100 timed steps spread 5-6% per variant)
        warmup=10 if quick else 20,
        stop_timeout=10,
        fail_cap=60.0,
    )


def run_one(scenario: str, variant: str, config: Config) -> Run:
    root = Path(tempfile.mkdtemp(prefix="ce-bench-"))
    try:
        return SCENARIOS[scenario](variant, config, root)
    except Exception as error:  # the engine went away mid-run
        return Run(variant=variant, scenario=scenario, error=repr(error))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_rounds(
    client: docker.DockerClient,
    config: Config,
    rounds: int,
    scenarios: list[str],
    variants: list[str],
    load: Load,
) -> list[Run]:
    """Every scenario for every variant, one after the other, the order rotated each round."""
    runs: list[Run] = []
    began = time.monotonic()
    for round_ in range(rounds):
        for scenario in scenarios:
            order = variants[round_ % len(variants) :] + variants[: round_ % len(variants)]
            for variant in order:
                observe.wait_for_engine(client)
                others = len(client.containers.list())
                load.others = max(load.others, others)
                run = run_one(scenario, variant, config)
                run.round = round_
                run.others_at_start = others
                run.load1 = os.getloadavg()[0]
                runs.append(run)
                print(f"[{time.monotonic() - began:6.0f} s] {json.dumps(run.brief())}", flush=True)
                if run.error:
                    print(run.error[-3000:], file=sys.stderr, flush=True)
    print(f"total {time.monotonic() - began:.0f} s")
    return runs


def invocation() -> str:
    """How this run was started, as the page names it."""
    if os.environ.get("MAKELEVEL"):
        return "make bench" + (f" ARGS='{os.environ['ARGS']}'" if os.environ.get("ARGS") else "")
    return "python -m scripts.bench " + " ".join(sys.argv[1:])


def measure(args: argparse.Namespace) -> Results:
    config = make_config(args.image, args.base, args.procs_per_host, args.quick)
    client = docker.from_env()
    sizes = ImageSizes(
        base=client.images.get(args.base).attrs["Size"],
        ours=client.images.get(args.image).attrs["Size"],
    )
    machine = observe.machine()
    load = Load(before=os.getloadavg()[0])
    runs = run_rounds(
        client,
        config,
        rounds=1 if args.quick else args.rounds,
        scenarios=[s for s in args.scenarios.split(",") if s],
        variants=[v for v in args.variants.split(",") if v],
        load=load,
    )
    load.after = os.getloadavg()[0]
    return Results(invocation(), config, sizes, machine, load, runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="container-entry:bench", help="our image")
    parser.add_argument("--base", default="container-entry/dlc-standin:latest")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 round, shorter jobs")
    parser.add_argument("--procs-per-host", type=int, default=1)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="a subset, for trials")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="a subset, for trials")
    parser.add_argument("--out", type=Path, default=DOCS, help="page whose block to rewrite")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--json", type=Path, default=REPO / "build" / "benchmark.json")
    parser.add_argument(
        "--render", type=Path, metavar="JSON", help="rewrite the block from saved results only"
    )
    args = parser.parse_args()
    if args.render:
        results = Results.from_json(args.render.read_text())
    else:
        results = measure(args)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(results.to_json())
    block = report.render(results)
    print()
    print(block)
    if not args.no_write:
        report.write_block(args.out, block)
        print(f"written: {args.out} (its generated block)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
