"""A DDP worker that trains in steps (an all_reduce each) and misbehaves on request.

--fault raise|segfault|exit3|sigkill-self|none on --fault-rank at --fault-step; on SIGTERM it
records when it got the signal, optionally writes a checkpoint (--checkpoint-on-term) that takes
--term-work-seconds to save (a slow checkpoint: longer than torchrun's fixed 30 s before 2.12) or
ignores the signal (--ignore-term) to test the grace period.

--poll-store models what NCCL does and gloo does not: a thread that polls the job's store (the
default process group's, hosted by torchrun) until the process exits, which the exit then waits
for (ProcessGroupNCCL's destructor joins its heartbeat monitor, which sits in TCPStore::check).
A rank whose store host is frozen never gets past that join.

With --checkpoint-on-term the step's all_reduce is waited for in Python, as a rank's collective
is with NCCL (it runs on the GPU's stream; Python goes on): the SIGTERM handler runs at once. A
gloo all_reduce waited for in C++ holds the handler until the collective ends, and a peer
already in its own 35 s handler never joins it: the handlers ran one host after the other and
the last rank's checkpoint outlasted the grace period.

Orderings a test waits for rather than times (a loaded machine stalls any process for seconds):
--exit-until-file holds the exit handler (a slow exit: flushing a logger, closing a tracker)
until the file exists (30 s at most), so a rank is still in its exit when the test's stop
comes; --term-barrier-dir has each rank mark its SIGTERM there (rank-N) and its checkpoint wait
until every rank of the job has (10 s at most) before its --term-work-seconds, so no rank
closes its connections while a peer that has not had the stop yet still waits in a collective.
"""

import argparse
import atexit
import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--fault", default="none")
parser.add_argument("--fault-rank", default="-1")  # one rank, or several: "1,3"
parser.add_argument("--fault-step", type=int, default=2)
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--step-seconds", type=float, default=0.5)
parser.add_argument("--checkpoint-on-term", action="store_true")
parser.add_argument("--term-work-seconds", type=float, default=0.0)
parser.add_argument("--ignore-term", action="store_true")
parser.add_argument("--poll-store", action="store_true")
parser.add_argument("--linger-host", default="")  # this host's ranks work on after training
parser.add_argument("--linger-seconds", type=float, default=0.0)
parser.add_argument("--exit-until-file", default="")  # the script's exit handler waits for it
parser.add_argument("--term-barrier-dir", default="")  # every rank's SIGTERM, before checkpoints
# training ends after the step in which any rank saw this file (the step's all_reduce carries it,
# so every rank ends at the same step): a test ends a job when it has done what it came to do
parser.add_argument("--until-file", default="")
args, _ = parser.parse_known_args()

out = os.environ["SM_OUTPUT_DATA_DIR"]
checkpoints = os.path.join(os.path.dirname(os.environ["SM_MODEL_DIR"]), "checkpoints")
dist.init_process_group("gloo")
rank = dist.get_rank()
exiting = threading.Event()
heartbeat = None
if args.poll_store:
    store = dist.distributed_c10d._get_default_store()

    def poll() -> None:
        while not exiting.is_set():
            # a store that is gone answers at once with an error: the loop goes on to its end
            with contextlib.suppress(Exception):
                store.check(["heartbeat-probe"])
            time.sleep(0.1)

    heartbeat = threading.Thread(target=poll, name="pt_nccl_heartbt-model")
    heartbeat.start()


def leave(code: int) -> None:
    """Exit as a rank with NCCL does: the heartbeat thread joined first."""
    if heartbeat is not None:
        exiting.set()
        heartbeat.join()
    sys.exit(code)


def wait_for_file(*paths: str, cap: float) -> None:
    deadline = time.monotonic() + cap
    while time.monotonic() < deadline and not all(os.path.exists(p) for p in paths):
        time.sleep(0.05)


def on_term(signum, _frame):
    with open(os.path.join(out, f"term-rank-{rank}.txt"), "w") as handle:
        handle.write(repr(time.time()))
    barrier = args.term_barrier_dir
    if barrier:
        os.makedirs(barrier, exist_ok=True)
        with open(os.path.join(barrier, f"rank-{rank}"), "w"):
            pass
    if args.checkpoint_on_term:
        if barrier:  # every rank has the stop before any rank can end
            markers = [os.path.join(barrier, f"rank-{r}") for r in range(dist.get_world_size())]
            wait_for_file(*markers, cap=10.0)
        time.sleep(args.term_work_seconds)  # serialising a large model to slow storage
        os.makedirs(checkpoints, exist_ok=True)
        path = os.path.join(checkpoints, f"checkpoint-rank-{rank}.json")
        with open(path + ".tmp", "w") as handle:
            json.dump({"rank": rank, "step": step}, handle)
        os.replace(path + ".tmp", path)
    if args.ignore_term:
        global sleeping_through
        sleeping_through = True
        return
    leave(128 + signum)


signal.signal(signal.SIGTERM, on_term)
# a slow exit (flushing a logger, closing a tracker): after the script
if args.exit_until_file:

    def slow_exit() -> None:
        print(f"exiting rank {rank}", flush=True)
        wait_for_file(args.exit_until_file, cap=30.0)  # until the test has done its part

    atexit.register(slow_exit)
sleeping_through = False
step = 0
print(f"started rank {rank} pid {os.getpid()} t={time.time():.3f}", flush=True)
while step < args.steps:
    while sleeping_through:  # a rank that ignores SIGTERM and never finishes
        time.sleep(0.1)
    if str(rank) in args.fault_rank.split(",") and step == args.fault_step:
        if args.fault == "raise":
            raise ValueError(f"planted failure at step {step}")
        if args.fault == "segfault":
            ctypes.string_at(0)
        if args.fault == "exit3":
            sys.exit(3)
        if args.fault == "sigkill-self":
            os.kill(os.getpid(), signal.SIGKILL)
    values = torch.ones(2)
    values[1] = float(bool(args.until_file) and os.path.exists(args.until_file))
    if args.checkpoint_on_term:
        work = dist.all_reduce(values, async_op=True)
        while not work.is_completed():
            time.sleep(0.005)
        work.wait()
    else:
        dist.all_reduce(values)
    print(f"step {step} rank {rank} t={time.time():.3f}", flush=True)
    step += 1
    if values[1] > 0:
        break
    deadline = time.time() + args.step_seconds
    while time.time() < deadline:  # sleep in slices so a signal handler runs promptly
        time.sleep(0.05)
dist.destroy_process_group()
if os.environ.get("CURRENT_HOST") == args.linger_host:  # e.g. saving the model
    time.sleep(args.linger_seconds)
print(f"done rank {rank}", flush=True)
leave(0)
