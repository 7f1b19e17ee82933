"""What a script can see of how it was started, as one JSON line per rank ("facts: {...}"),
so a test can compare a run with the preflight in the same Python against a plain
`python script.py` (issue 27). `--die` ends it with an uncaught exception instead."""

import gc
import json
import multiprocessing
import os
import pickle
import signal
import sys
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


def square(x):
    return x * x


class Squares(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return torch.tensor(float(square(index)))


def handler_name(sig):
    handler = signal.getsignal(sig)
    return getattr(handler, "__name__", str(handler))


def facts():
    main = sys.modules["__main__"]
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        spawned = pool.apply(square, (3,))
    loader = DataLoader(Squares(), batch_size=4, num_workers=2)
    loaded = sum(float(batch.sum()) for batch in loader)
    initialized_at_start = dist.is_initialized()
    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    dist.destroy_process_group()
    return {
        "name": __name__,
        "globals": sorted(k for k in globals() if k.startswith("__")),
        "file": __file__,
        "spec": repr(__spec__),
        "loader": type(__loader__).__name__,
        "package": __package__,
        "cached": __cached__,
        "main_is_this": main.__dict__ is globals(),
        "argv": sys.argv,
        "path0": sys.path[0],
        "path_rest": sys.path[1:],
        "flags": list(sys.flags),
        "gc": [gc.isenabled(), gc.get_threshold()],  # as Python leaves it, preflight or not
        "cwd": os.getcwd(),
        "pickled": pickle.loads(pickle.dumps(square))(4),
        "spawned": spawned,
        "loaded": loaded,
        "initialized_at_start": initialized_at_start,
        "all_reduce": float(total[0]),
        "world": os.environ["WORLD_SIZE"],
        "signals": {s.name: handler_name(s) for s in (signal.SIGINT, signal.SIGTERM)},
        "warnings": [repr(f[:1] + f[2:]) for f in warnings.filters[:8]],
        "stdin_isatty": sys.stdin.isatty() if sys.stdin else None,
        "excepthook": sys.excepthook.__module__,
        # not compared: which Python this is (the preflight's own, or a new one)
        "cmdline": open("/proc/self/cmdline", "rb").read().split(b"\0")[:-1],
        "preflight_ran_here": "container_entry.rank.preflight" in sys.modules,
    }


def evaluate():
    raise ValueError("planted in evaluate")


if __name__ == "__main__":
    if "--die" in sys.argv:
        evaluate()
    print("facts: " + json.dumps(facts(), sort_keys=True, default=os.fsdecode), flush=True)
