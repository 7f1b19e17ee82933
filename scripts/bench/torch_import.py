"""What torch's import costs the launcher, plain and as the product does it.

    python -m scripts.bench.torch_import --image container-entry:bench [--rounds 10]

Inside one container of the image, fresh interpreters import, round after round, alternated:
- launcher, plain: `import torch.distributed.run` (bare torchrun);
- launcher, ours: `_torchrun_main.import_launcher()` (numpy's OpenBLAS on one thread for the
  import);
- launcher, ours with the GC paused: the same with Python's cyclic GC paused for the import, as
  a27d709 shipped it (the row that says why it is gone).
Each interpreter times its own import and the first work after it (CPU of all its threads, and
wall), then counts its threads; the table gives medians and the ratio to plain. The work,
200,000 new dicts, runs the collections that a GC paused during the import only put off: the
import's objects are still young then, and the first collections after it pass over all of
them. docs/benchmarks.md has a run.
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
import gc, json, os, resource, sys, time
WORK = 200_000
kind = sys.argv[1]
if kind == "launcher, plain":
    go = lambda: __import__("torch.distributed.run")
else:
    from container_entry.supervise._torchrun_main import import_launcher

    def go():
        if kind.endswith("GC paused"):
            gc.disable()
        import_launcher()
        gc.enable()
wall, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
go()
# the program's first work: a paused GC left its garbage to the collections this starts
work = [{} for _ in range(WORK)]
after = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({
    "wall": time.perf_counter() - wall,
    "cpu": after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime,
    "threads": len(os.listdir("/proc/self/task")),
}))
"""
KINDS = ("launcher, plain", "launcher, ours", "launcher, ours with the GC paused")


def measure(rounds: int) -> dict[str, list[dict]]:
    """Every kind once per round, in a fresh interpreter each."""
    found: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    for _ in range(rounds):
        for kind in KINDS:
            argv = [sys.executable, "-c", CHILD, kind]
            out = subprocess.run(argv, capture_output=True, text=True, check=True)
            found[kind].append(json.loads(out.stdout))
    return found


def table(found: dict[str, list[dict]]) -> str:
    rows = [
        "| import | wall (s) | CPU (s) | CPU / plain | threads after |",
        "|---|---|---|---|---|",
    ]
    for kind, runs in found.items():
        plain = statistics.median(r["cpu"] for r in found["launcher, plain"])
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
