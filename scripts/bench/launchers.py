"""The same job (scripts/bench/job.py) on a 2-host local cluster, launched each variant's way:

torchrun          `python -m torch.distributed.run --node-rank i ...` in the base image;
incumbent         the base image's `train` (sagemaker-training), distributed by hyperparameter;
ours              our image's `train`;
ours-nopreflight  the same with CONTAINER_ENTRY_PREFLIGHT=false.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.bench.results import HOSTS, Config
from scripts.local.cluster import Cluster

JOB = Path(__file__).with_name("job.py")
COMMON_ENV = {"ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}


@dataclass
class BenchCluster(Cluster):
    """Cluster with a command per host (bare torchrun needs its --node-rank on the line).

    Cluster.start() writes each host's tree and then creates that host's container with
    `self.command`, so setting the command while the tree is written gives each its own."""

    host_commands: dict[str, list[str]] = field(default_factory=dict)

    def _write_tree(self, host: str) -> Path:
        if host in self.host_commands:
            self.command = self.host_commands[host]
        return super()._write_tree(host)


def torchrun_command(config: Config, node_rank: int, job: dict[str, Any]) -> list[str]:
    return [
        "python", "-m", "torch.distributed.run",
        "--nnodes", str(len(HOSTS)),
        "--nproc-per-node", str(config.procs),
        "--node-rank", str(node_rank),
        "--master-addr", HOSTS[0],
        "--master-port", "29500",
        "/opt/ml/code/bench_job.py",
        *(f"--{key}={value}" for key, value in job.items()),
    ]  # fmt: skip


def make_cluster(variant: str, config: Config, job: dict[str, Any], root: Path) -> BenchCluster:
    """The job (its arguments in `job`), launched the variant's way."""
    code = {"bench_job.py": JOB.read_bytes()}
    env = dict(COMMON_ENV)
    if variant == "torchrun":
        commands = {host: torchrun_command(config, i, job) for i, host in enumerate(HOSTS)}
        return BenchCluster(
            image=config.base, root=root, hosts=HOSTS, environment=env, code=code,
            command=None, host_commands=commands,
        )  # fmt: skip
    hps = {key: json.dumps(value) for key, value in job.items()}
    hps["sagemaker_program"] = json.dumps("bench_job.py")
    if variant == "incumbent":
        hps["sagemaker_submit_directory"] = json.dumps("/opt/ml/code")
        hps["sagemaker_torch_distributed_enabled"] = "true"
        # the toolkit's processes per host (on CPU it defaults to 1; PET_NPROC_PER_NODE is
        # overridden by the --nproc_per_node it always passes)
        hps["sagemaker_mpi_num_of_processes_per_host"] = str(config.procs)
        image = config.base
    else:
        env["PET_NPROC_PER_NODE"] = str(config.procs)
        if variant == "ours-nopreflight":
            env["CONTAINER_ENTRY_PREFLIGHT"] = "false"
        image = config.image
    return BenchCluster(
        image=image, root=root, hosts=HOSTS, hyperparameters=hps, environment=env, code=code
    )
