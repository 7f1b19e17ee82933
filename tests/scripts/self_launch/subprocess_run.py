"""A Python entry point that starts torchrun itself, as some users' train.py does."""

import json
import os
import subprocess
import sys

hosts = json.loads(os.environ["SM_HOSTS"])
here = os.path.dirname(os.path.abspath(__file__))
command = [
    sys.executable, "-m", "torch.distributed.run",
    "--nnodes", str(len(hosts)),
    "--node_rank", str(hosts.index(os.environ["SM_CURRENT_HOST"])),
    "--master_addr", hosts[0],
    "--master_port", os.environ["USER_PORT"],
    "--nproc_per_node", os.environ.get("NPROC", "2"),
    os.path.join(here, "worker.py"),
]  # fmt: skip
sys.exit(subprocess.run(command, check=False).returncode)
