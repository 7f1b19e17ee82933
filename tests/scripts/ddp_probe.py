"""A minimal DDP worker for tests: joins the gloo group, all_reduces, records what it saw."""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--exit-code", type=int, default=0)
parser.add_argument("--fail-rank", type=int, default=-1)
args, _ = parser.parse_known_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
summary = {
    "rank": rank,
    "world_size": world,
    "all_reduce": total.item(),
    "argv": sys.argv[1:],
    "host": os.environ.get("CURRENT_HOST"),
    # The families, spelled without their "_": a script whose text names a variable that CUDA,
    # NCCL or OpenMP read at start gets its preflight in a Python of its own
    # (preflight_then_script.READ_AT_START), and this probe stands for the usual script.
    "env": {
        k: v
        for k, v in os.environ.items()
        if k.split("_", 1)[0] in ("SM", "PET", "NCCL", "GLOO", "OMP") and "_" in k
    },
}
out = os.environ.get("SM_OUTPUT_DATA_DIR", ".")
with open(os.path.join(out, f"probe-rank-{rank}.json"), "w") as handle:
    json.dump(summary, handle)
print(f"probe rank {rank}/{world} host {summary['host']} sum {total.item()}", flush=True)
dist.destroy_process_group()
if rank == args.fail_rank or (args.fail_rank < 0 and args.exit_code):
    sys.exit(args.exit_code)
