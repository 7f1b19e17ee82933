"""The tutorial's shape (mp.spawn, one world per host) with what tests/integration/test_once_mode.py
reads in its workers' output: SHOW_SECRETS=1 makes each worker print the job's secrets (the
HF_TOKEN variable and the hf_token hyperparameter) on its stdout and its stderr; HANG=<rank>
makes that worker go silent forever after the first barrier while the others wait for it in an
all_reduce (a hung collective), else each trains as worker.py does."""

import os
import subprocess
import sys
import time


def silent_marker() -> str:
    return os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "silent-from-now")


def starting() -> subprocess.Popen | None:
    """HANG: progress reported (the progress file touched, as container_entry.hang's
    report_progress does) until the worker that hangs goes silent. The start-up (torch's import
    here, then again in each worker mp.spawn starts) counts for a fixed HANG_TIMEOUT and
    outlasted 10 s beside a busy suite (tests/scripts/hang_probe.py says when): the silence
    under test begins where the worker does. From a process of its own: torch's import holds
    this interpreter's lock for seconds at a time."""
    path = os.environ.get("CONTAINER_ENTRY_PROGRESS_FILE")
    if "HANG" not in os.environ or not path:
        return None
    # the paths are the shell's $0 and $1, never part of its code
    loop = 'while [ ! -e "$1" ]; do touch "$0"; sleep 0.5; done'
    return subprocess.Popen(["/bin/sh", "-c", loop, path, silent_marker()])


if __name__ == "__main__":  # the entry point, not a worker mp.spawn starts (__mp_main__)
    reporter = starting()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import worker  # noqa: E402


def main(rank: int, world: int) -> None:
    if os.environ.get("SHOW_SECRETS") == "1":
        token, hyperparameter = os.environ["HF_TOKEN"], os.environ["SM_HP_HF_TOKEN"]
        for stream in (sys.stdout, sys.stderr):  # one write each: the workers share the pipes
            stream.write(f"worker {rank} says {token} and {hyperparameter}\n")
            stream.flush()
    if "HANG" not in os.environ:
        worker.main(rank, world)
        return
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = os.environ["USER_PORT"]
    dist.init_process_group("gloo", rank=rank, world_size=world)
    print(f"started rank {rank} pid {os.getpid()}", flush=True)  # test_faults.worker_pids
    dist.barrier()
    if rank == int(os.environ["HANG"]):
        open(silent_marker(), "w").close()  # the progress reports end
        while True:  # silent, as a worker stuck in a data loader or a deadlock
            time.sleep(3600)
    dist.all_reduce(torch.ones(1))  # never completes: the silent worker never enters it


if __name__ == "__main__":
    world = int(os.environ.get("NPROC", "2"))
    mp.spawn(main, args=(world,), nprocs=world, join=True)
