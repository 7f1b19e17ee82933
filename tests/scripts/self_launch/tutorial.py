"""The PyTorch DDP tutorial's shape: one process per device started by mp.spawn, its own
MASTER_ADDR=localhost: one world per host."""

import os

import torch.multiprocessing as mp
import worker

if __name__ == "__main__":
    world = int(os.environ.get("NPROC", "2"))
    mp.spawn(worker.main, args=(world,), nprocs=world, join=True)
