"""Rank program of the GPU check's fr-fields scenario (scripts/gpu/fr_fields.py): one rank (world
size 1, its rendezvous in MASTER_ADDR/MASTER_PORT), a short all_reduce loop with torch's flight
recorder on (TORCH_FR_BUFFER_SIZE, set by the check), first in the default group, made without
TORCH_NCCL_ENABLE_TIMING, then in a group made with it ("timed"): the straggler analysis reads
`duration_ms` only where that variable was set when the group was made (docs/stragglers.md).

    --device cuda  NCCL: its own recorder (`_dump_nccl_trace_json`)
             cpu   gloo: the generic recorder (`_dump_fr_trace_json`), the check's self-test

Prints one line, `FR {json}`: the dump as the bootstrap's request gets it
(_site/sitecustomize.py `_flight_records`: {"recorders": {name: torch's JSON}}).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

COLLECTIVES = 20  # per group
RETIRE_SECONDS = 10.0  # for NCCL's watchdog to retire each timed collective (its duration)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    return parser.parse_args(argv)


def loop(device: torch.device, group: object) -> None:
    t = torch.ones(1024, device=device)
    for _ in range(COLLECTIVES):
        dist.all_reduce(t, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def dump(device: torch.device) -> dict:
    c10d = torch._C._distributed_c10d
    name, function = ("nccl", "_dump_nccl_trace_json")
    if device.type != "cuda":
        name, function = ("generic", "_dump_fr_trace_json")
    raw = getattr(c10d, function)()
    return {"recorders": {name: json.loads(raw.decode() if isinstance(raw, bytes) else raw)}}


def retired(records: dict, group: str) -> bool:
    """Every collective of `group` retired (by NCCL's watchdog, which sets duration_ms then)."""
    entries = [
        e
        for recorder in records["recorders"].values()
        for e in recorder.get("entries") or []
        if (e.get("process_group") or [None])[0] == group
    ]
    return len(entries) >= COLLECTIVES and all(e.get("retired") for e in entries)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda":
        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    loop(device, None)
    os.environ["TORCH_NCCL_ENABLE_TIMING"] = "1"  # read as each NCCL group is made
    timed = dist.new_group([0], group_desc="timed")
    loop(device, timed)
    name = dist.distributed_c10d._get_process_group_name(timed)
    deadline = time.monotonic() + RETIRE_SECONDS
    records = dump(device)
    while not (retired(records, "0") and retired(records, name)) and time.monotonic() < deadline:
        time.sleep(0.2)
        records = dump(device)
    print("FR " + json.dumps(records), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
