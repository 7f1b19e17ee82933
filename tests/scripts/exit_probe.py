"""A rank that leaves its process groups to its exit, as HF Trainer scripts do, and records
what the exit teardown did (tests/integration/test_exit_teardown.py).

    exit_probe.py --how HOW --out OUT [--death-dump PATH] [--only-rank R]
                  [--after-teardown SECONDS] [--after-peer PATH]
                                                      (hyperparameters, as SageMaker passes them)

HOW (or HOW,HOW,...: rank r ends as the r-th, in turn): `return` (falls off the end),
`exit0`, `exit3` (sys.exit), `raise` (an uncaught exception), `stuck` (the teardown never
returns: a peer or a pending collective it waits for), `fork` (a child forked after init
exits through Python, so through the exit handlers it inherited).
torch.distributed.destroy_process_group is wrapped to write OUT/calls-rank-<RANK>-<pid>.json
when it is called: by whom, whether the script's own exit handler had run with the group
still there, whether the death dump existed by then.

--only-rank R: only rank R ends as HOW; the others go on with collectives until its exit
breaks them (gloo: "Connection closed by peer"), as a DDP job's other ranks do.
--after-teardown S: the exit takes S seconds more once the groups are gone (a slow
finalization: its sockets are closed, its process is not gone).
--after-peer PATH: ... and before those S seconds, waits (30 s at most) until PATH exists, e.g.
a peer's rank record: that peer's failure is recorded while this exit still runs, however long
a loaded machine takes to get there (the test waits for the event, not a fixed time).
"""

import argparse
import atexit
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--how", required=True)
parser.add_argument("--out", type=Path, required=True)
parser.add_argument("--death-dump", type=Path, default=None)
parser.add_argument("--only-rank", type=int, default=None)
parser.add_argument("--after-teardown", type=float, default=0.0)
parser.add_argument("--after-peer", type=Path, default=None)
given = parser.parse_args()
out, death_dump = given.out, given.death_dump
rank = int(os.environ["RANK"])
hows = given.how.split(",")  # one per rank, in turn: several endings in one job
how = hows[rank % len(hows)]
bystander = given.only_rank is not None and rank != given.only_rank
state: dict = {"handler_sum": None}
real_destroy = dist.destroy_process_group


def recording_destroy(*args, **kwargs):
    call = {
        "pid": os.getpid(),
        "handler_sum": state["handler_sum"],
        "death_dump_existed": bool(death_dump and death_dump.exists()),
        "initialized_before": dist.is_initialized(),
    }
    path = out / f"calls-rank-{rank}-{os.getpid()}.json"
    path.write_text(json.dumps(call))
    if how == "stuck":
        time.sleep(3600)
    real_destroy(*args, **kwargs)
    call["initialized_after"] = dist.is_initialized()
    path.write_text(json.dumps(call))
    if not bystander:
        deadline = time.monotonic() + 30
        while given.after_peer and not given.after_peer.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(given.after_teardown)


dist.destroy_process_group = recording_destroy
dist.init_process_group("gloo")
tensor = torch.ones(8)
for _ in range(5):
    dist.all_reduce(tensor)


if bystander:  # collectives until the rank that ends breaks them
    for _ in range(600):
        dist.all_reduce(torch.ones(8))
        time.sleep(0.05)
    sys.exit("the other rank never ended")

main_pid = os.getpid()


def own_exit_handler():
    """The script's own: registered after the wrapper's, so run before it; needs the group."""
    if os.getpid() != main_pid:  # a forked child's exit: not a rank of the group
        return
    total = torch.ones(8)  # the size a bystander's collectives have
    dist.all_reduce(total)
    state["handler_sum"] = total[0].item()


atexit.register(own_exit_handler)
print(f"rank {rank} trained", flush=True)

if how == "fork":
    child = os.fork()
    if child == 0:
        sys.exit(0)  # through Python's exit, so through the handlers it inherited
    os.waitpid(child, 0)
    assert dist.is_initialized()  # the child's exit left its parent's group alone (the exit
    # handler's all_reduce below checks it works: the same collectives as the other ranks)
elif how == "exit0":
    sys.exit(0)
elif how == "exit3":
    sys.exit(3)
elif how == "raise":
    raise ValueError("planted at the end")
