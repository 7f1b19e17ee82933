"""torch.multiprocessing.start_processes, mp.spawn's general form, with the start method named
(fork, as accelerate's launchers use it): the tutorial's world, one per host."""

import os

import torch.multiprocessing as mp
import worker

if __name__ == "__main__":
    world = int(os.environ.get("NPROC", "2"))
    mp.start_processes(worker.main, args=(world,), nprocs=world, join=True, start_method="fork")
