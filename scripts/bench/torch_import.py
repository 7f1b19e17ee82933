"""What torch's import costs the launcher and each rank, plain and as the product does it.

    python -m scripts.bench.torch_import --image container-entry:bench [--rounds 10]

Inside one container of the image, fresh interpreters import, round after round, alternated:
- launcher, plain: `import torch.distributed.run` (bare torchrun);
- launcher, ours: `_torchrun_main.import_launcher()` (the cyclic GC paused, numpy's OpenBLAS on
  one thread for the import);
- rank, plain: `import torch.distributed` (a script's first line);
- rank, ours: `preflight.import_torch()` (the GC paused; the script then finds torch imported).
Each interpreter times its own import (CPU of all its threads, and wall) and counts the threads
it has after it; the table gives medians and the ratio to plain. docs/benchmarks.md has a run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, os, resource, sys, time
kind = sys.argv[1]
if kind == "launcher, ours":
    from container_entry.supervise._torchrun_main import import_launcher as go
elif kind == "rank, ours":
    from container_entry.rank.preflight import import_torch as go
elif kind == "launcher, plain":
    go = lambda: __import__("torch.distributed.run")
else:
    go = lambda: __import__("torch.distributed")
wall, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
go()
after = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({
    "wall": time.perf_counter() - wall,
    "cpu": after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime,
    "threads": len(os.listdir("/proc/self/task")),
}))
"""
KINDS = ("launcher, plain", "launcher, ours", "rank, plain", "rank, ours")


def measure(rounds: int) -> dict[str, list[dict]]:
    """Every kind once per round, in a fresh interpreter each."""
    found: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    for _ in range(rounds):
        for kind in KINDS:
            out = subprocess.run(
                [sys.executable, "-c", CHILD, kind], capture_output=True, text=True, check=True
            )
            found[kind].append(json.loads(out.stdout))
    return found


def table(found: dict[str, list[dict]]) -> str:
    rows = [
        "| import | wall (s) | CPU (s) | CPU / plain | threads after |",
        "|---|---|---|---|---|",
    ]
    for kind, runs in found.items():
        plain = statistics.median(r["cpu"] for r in found[kind.split(",")[0] + ", plain"])
        cpu = statistics.median(r["cpu"] for r in runs)
        wall = statistics.median(r["wall"] for r in runs)
        threads = statistics.median(r["threads"] for r in runs)
        rows.append(f"| {kind} | {wall:.3f} | {cpu:.3f} | {cpu / plain:.2f} | {threads:g} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", help="run inside one container of this image")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    if args.image:
        here = Path(__file__).resolve()
        argv = ["docker", "run", "--rm", "-v", f"{here}:/bench.py:ro", "--entrypoint", "python"]
        argv += [args.image, "/bench.py", "--rounds", str(args.rounds)]
        sys.exit(subprocess.run(argv, check=False).returncode)
    print(f"{os.cpu_count()} CPUs, {args.rounds} rounds, medians")
    print(table(measure(args.rounds)))


if __name__ == "__main__":
    main()
