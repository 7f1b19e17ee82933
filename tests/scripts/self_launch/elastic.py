"""torch's launcher API in the script itself: elastic_launch over a function, one world per
host."""

import os

import worker
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

if __name__ == "__main__":
    port = os.environ["USER_PORT"]
    nproc = int(os.environ.get("NPROC", "2"))
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{port}",
        run_id="elastic-test",
        max_restarts=0,
        local_addr="127.0.0.1",  # the host's own name need not resolve
    )
    elastic_launch(config, worker.main)()
