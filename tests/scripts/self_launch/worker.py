"""One worker of a user's own launcher (tests/integration/test_self_launch.py): joins the world
its launcher made (gloo, env://), all_reduces, writes what it saw; on SIGTERM it writes a
checkpoint to SM_MODEL_DIR and exits 0; CRASH=<rank> makes that rank raise at step 2."""

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def main(rank: int | None = None, world: int | None = None) -> None:
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    if rank is None and "RANK" not in os.environ:  # started plainly (a launcher of one)
        rank, world = 0, 1
    if rank is None:
        dist.init_process_group("gloo")
    else:  # the tutorial's way: the launcher passes the rank
        os.environ["MASTER_ADDR"] = "localhost"
        os.environ["MASTER_PORT"] = os.environ["USER_PORT"]
        dist.init_process_group("gloo", rank=rank, world_size=world)
    rank, world = dist.get_rank(), dist.get_world_size()
    out = os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "ranks")
    os.makedirs(out, exist_ok=True)
    print(f"started rank {rank} of {world}", flush=True)
    total = torch.ones(1)
    for step in range(int(os.environ.get("STEPS", "3"))):
        total = torch.ones(1)
        dist.all_reduce(total)
        if stop:
            path = os.path.join(os.environ["SM_MODEL_DIR"], f"checkpoint-{rank}")
            with open(path, "w") as handle:
                handle.write(str(step))
            print(f"rank {rank} checkpointed at step {step}", flush=True)
            sys.exit(0)
        if os.environ.get("CRASH") == str(rank) and step == 2:
            raise ValueError(f"planted failure on rank {rank}")
        time.sleep(0.3)
    facts = {"rank": rank, "world": world, "sum": int(total.item())}
    facts["local"] = int(os.environ.get("LOCAL_RANK", rank))
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as handle:
        json.dump(facts, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
