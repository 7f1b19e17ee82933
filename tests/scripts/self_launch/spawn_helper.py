"""A DDP script that uses mp.spawn for a helper of its own (a data step before training): the
detection takes it for a launcher; CONTAINER_ENTRY_LAUNCH=ddp runs it in our workers."""

import torch.multiprocessing as mp
import worker


def prepare(index: int) -> None:
    print(f"helper {index} prepared the data", flush=True)


if __name__ == "__main__":
    mp.spawn(prepare, nprocs=1)
    worker.main()
