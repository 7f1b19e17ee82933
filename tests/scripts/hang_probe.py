"""A DDP script that hangs, or does not, in the ways the hang watchdog must tell apart.

--mode deadlock:    rank `--rank` deadlocks in plain Python (a lock taken twice), the others
                    wait for it in a barrier
        collective: rank `--rank` blocks forever without printing (a sleep), the others wait
                    in an all_reduce it never joins
        steady:     every rank prints one line each `--every` seconds for `--seconds`, then ends
        progress:   every rank prints nothing for `--seconds` but reports progress each
                    `--every` seconds (container_entry.hang.report_progress, the public API)
        one-talks:  rank `--rank` prints each `--every` seconds for `--seconds`; the others print
                    nothing, waiting in a barrier (one host's output keeps the job alive)
        skip:       after 3 all_reduces, rank `--rank` never enters the 4th (it waits without
                    printing in `evaluate`); the others wait in it (a culprit to name)
        desync:     after 3 all_reduces, rank `--rank` calls a broadcast of one int64 where the
                    others call an all_reduce of 4096 float32 (a desync to name)
--pg-timeout S: the collectives time out after S seconds (gloo's own timeout, as NCCL's
                watchdog would end them)
--abort-when-a-peer-dies 1: as NCCL does (torch's async error handling, its default): a
                rank whose connection to any peer breaks aborts at once (no atexit, no record
                at its death). gloo notices only where a collective waits on that peer.
"""

import argparse
import datetime
import os
import select
import socket
import subprocess
import threading
import time

from container_entry.hang import PROGRESS_ENV, report_progress  # stdlib only: before torch


def starting() -> subprocess.Popen | None:
    """The script's own start-up (torch's import, the rendezvous) counts for a fixed
    HANG_TIMEOUT, and it outlasted 10 s beside a busy suite with a busy loop per CPU (runs 3
    and 5 of issue 35): the probe reports progress until it is past it, so the silence under
    test begins where the probe hangs, however slow the machine. From a process of its own:
    torch's import holds this interpreter's lock for seconds at a time, and a thread here
    would report nothing meanwhile."""
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        return None
    # the path is the shell's $0, never part of its code
    loop = 'while :; do touch "$0"; sleep 0.5; done'
    return subprocess.Popen(["/bin/sh", "-c", loop, path])


reporter = starting()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--mode", required=True)
parser.add_argument("--rank", type=int, default=1)
parser.add_argument("--seconds", type=float, default=8.0)
parser.add_argument("--every", type=float, default=1.0)
parser.add_argument("--pg-timeout", type=float, default=None, help="collectives time out after")
parser.add_argument("--abort-when-a-peer-dies", type=int, default=0)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()


def abort_when_a_peer_dies() -> None:
    """One connection to every other rank, as NCCL's; the first that breaks aborts this rank."""
    store, world = dist.distributed_c10d._get_default_store(), dist.get_world_size()
    listener = socket.create_server(("127.0.0.1", 0))
    store.set(f"probe-peer-{rank}", str(listener.getsockname()[1]))
    links = [
        socket.create_connection(("127.0.0.1", int(store.get(f"probe-peer-{peer}"))))
        for peer in range(rank + 1, world)
    ]
    links += [listener.accept()[0] for _ in range(rank)]

    def watch() -> None:
        readable, _, _ = select.select(links, [], [])
        readable[0].recv(1)  # only ever EOF: nobody sends
        print(f"rank {rank}: a peer's connection broke: aborting, as NCCL does", flush=True)
        os.abort()

    threading.Thread(target=watch, daemon=True).start()


if args.abort_when_a_peer_dies:
    abort_when_a_peer_dies()
print(f"rank {rank} ready", flush=True)
dist.barrier()
if args.pg_timeout:
    # the collectives' timeout from here on: given to init_process_group, it bounded the
    # rendezvous and the barrier above too, where ranks whose imports of torch raced on a busy
    # machine may arrive seconds apart
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=args.pg_timeout))
if reporter is not None:  # past the start-up: the silence under test is the script's own
    report_progress()
    reporter.kill()
    reporter.wait()


def stuck_in_python() -> None:
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()


def quiet_forever() -> None:
    while True:
        time.sleep(3600)


if args.mode == "deadlock":
    if rank == args.rank:
        stuck_in_python()
    dist.barrier()
elif args.mode == "collective":
    if rank == args.rank:
        quiet_forever()
    dist.all_reduce(torch.ones(1))
elif args.mode == "steady":
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        time.sleep(args.every)
        print(f"rank {rank} still working", flush=True)
elif args.mode == "progress":
    from container_entry.hang import report_progress

    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        time.sleep(args.every)
        report_progress()
elif args.mode == "one-talks":
    if rank == args.rank:
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            time.sleep(args.every)
            print(f"rank {rank} still working", flush=True)
    dist.barrier()
elif args.mode in ("skip", "desync"):
    for _ in range(3):
        dist.all_reduce(torch.ones(4))

    def evaluate() -> None:
        while True:
            time.sleep(3600)

    if rank != args.rank:
        dist.all_reduce(torch.ones(4096))
    elif args.mode == "skip":
        evaluate()
    else:
        dist.broadcast(torch.zeros(1, dtype=torch.int64), src=args.rank)
else:
    raise SystemExit(f"unknown --mode {args.mode}")
print(f"rank {rank} done", flush=True)
