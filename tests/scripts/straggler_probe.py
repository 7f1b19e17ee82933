"""A training loop on gloo for the straggler tests: every step a little work and one all_reduce;
`--slow R` sleeps `--delay` seconds before each of its collectives (the straggler), `--then R2`
takes over from half the steps on (the slowness moves), `--subgroups 1` runs in two groups
across hosts instead ([0, 2] and [1, 3]), where `--slow` and `--slow2` are each group's;
`--busy 1` spends the work on the CPU (a starved host falls behind).
Prints `probe: training` at its first step and `probe: done` at its end."""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--work", type=float, default=0.02)
    parser.add_argument("--delay", type=float, default=0.1)
    parser.add_argument("--slow", type=int, default=-1)
    parser.add_argument("--slow2", type=int, default=-1)
    parser.add_argument("--then", type=int, default=-1)
    parser.add_argument("--subgroups", type=int, default=0)
    parser.add_argument("--busy", type=int, default=0)  # the work on the CPU, not a sleep
    args, _ = parser.parse_known_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    group = None
    slow = {args.slow}
    if args.subgroups:
        pairs = [dist.new_group([0, 2]), dist.new_group([1, 3])]
        group = pairs[rank % 2]
        slow = {args.slow, args.slow2}
    tensor = torch.ones(1)
    for step in range(args.steps):
        if step == 0:
            print("probe: training", file=sys.stderr, flush=True)
        if args.busy:
            spent = time.thread_time() + args.work
            while time.thread_time() < spent:
                pass
        else:
            time.sleep(args.work)
        late = slow if args.then < 0 or step < args.steps // 2 else {args.then}
        if rank in late:
            time.sleep(args.delay)
        dist.all_reduce(tensor, group=group)
    dist.barrier()
    print("probe: done", file=sys.stderr, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
