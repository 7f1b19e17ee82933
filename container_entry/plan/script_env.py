"""What the script is given beside its arguments: the SM_* contract as the DLC exports it
(contract.py), what every script gets from the bootstrap, and what the DLC's toolkit adds for a
script it runs once per host; each variable with the reason the plan shows. Pure.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from container_entry.common.layout import RunDir
from container_entry.common.programs import UNBUFFERED
from container_entry.diagnose.hang import PROGRESS_ENV
from container_entry.plan import contract, hyperparameters
from container_entry.plan.cluster import Topology
from container_entry.plan.code_source import CodeSource
from container_entry.plan.environment import Environment
from container_entry.plan.groups import toolkit_master
from container_entry.plan.launch_mode import LaunchDecision, LaunchMode
from container_entry.plan.settings import Settings


@dataclass(frozen=True)
class EnvVar:
    value: str
    reason: str


def _local_channels(env: Environment) -> list[str] | None:
    """Local mode's input channels: those the job was given and the folders found on disk (the
    DLC cannot run there to say otherwise). None under SageMaker: the DLC's, inputdataconfig's."""
    if env.resource_config is not None:
        return None
    return sorted(set(env.input_data_config) | set(env.local_channels))


def sm_variables(
    env: Environment,
    topology: Topology,
    hps: hyperparameters.Hyperparameters,
    user_args: list[str],
    program: str | None,
    world_master: str | None,
) -> dict[str, EnvVar]:
    """The SM_* variables, as sagemaker-training exports them (contract.py; the deliberate
    differences: docs/sm-contract.md)."""
    sm = contract.sm_env(
        base_dir=env.environ.get("SAGEMAKER_BASE_DIR") or str(env.base_dir),
        resource_config=resource_config(env, topology),
        input_data_config=env.input_data_config,
        hyperparameters=hps,
        user_args=user_args,
        environ=env.environ,
        machine=contract.Machine(
            gpus=env.listed_gpus,
            cpus=env.all_cpus,
            neurons=env.neuron_cores,
            smddprun=env.smddprun,
            smddpmprun=env.smddpmprun,
        ),
        channels=_local_channels(env),
        # a script named on our command line, or SDK v3's, stands where SAGEMAKER_PROGRAM would
        named_program=posixpath.basename(program)
        if program and (env.cli_args or env.sdk)
        else None,
        # our world's rank-0 host where our workers form a world (the DLC's own elsewhere)
        world_master=world_master,
    )
    reason = "SageMaker contract (as sagemaker-training exports it)"
    found = {name: EnvVar(value, reason) for name, value in sm.items()}
    sdk = "SageMaker SDK v3 contract (its scripts/environment.py)"
    return {**found, **{name: EnvVar(value, sdk) for name, value in env.sdk_env.items()}}


def resource_config(env: Environment, topology: Topology) -> Mapping[str, Any]:
    """resourceconfig.json, or what stands for it in local mode (contract.py)."""
    if env.resource_config is not None:
        return env.resource_config
    return contract.local_resource_config(topology.hosts, topology.current_host)


def once_variables(
    env: Environment, topology: Topology, hps: hyperparameters.Hyperparameters
) -> dict[str, EnvVar]:
    """What the DLC's toolkit exports to a script it runs once per host beside the SM_*
    contract (sagemaker-pytorch-training 3.0.0, training.py): the master its toolkit computes
    and its port, and NCCL's interface. Not its NCCL_IB_DISABLE=1 and NCCL_DEBUG=WARN, which
    it forces over the user's own values (a known pain: docs/launch-modes.md)."""
    master = str(toolkit_master(resource_config(env, topology), hps.sagemaker))
    why = "as the DLC's toolkit exports it to a script it runs once per host"
    wanted = {"MASTER_ADDR": EnvVar(master, why), "MASTER_PORT": EnvVar("7777", why)}
    if topology.network_interface:
        wanted["NCCL_SOCKET_IFNAME"] = EnvVar(topology.network_interface, why)
    return wanted


def bootstrap_variables(
    env: Environment, topology: Topology, knobs: Settings, code: CodeSource, job_name: object
) -> dict[str, EnvVar]:
    """What every script is given beside the SM_* contract and the workers' defaults."""
    wanted: dict[str, EnvVar] = {}
    if env.torch_version:
        wanted["SM_DLC_TORCH_VERSION"] = EnvVar(
            env.torch_version, "as the DLC's PyTorch toolkit exports it (torch.__version__)"
        )
    if job_name:
        wanted["SAGEMAKER_JOB_NAME"] = EnvVar(str(job_name), "transformers detects SageMaker")
    wanted["CURRENT_HOST"] = EnvVar(topology.current_host, "SageMaker contract")
    wanted["SM_CHECKPOINT_DIR"] = EnvVar(
        str(env.base_dir / "checkpoints"), "where SageMaker syncs checkpoints with S3 (resume)"
    )
    wanted[UNBUFFERED[0]] = EnvVar(UNBUFFERED[1], "live logs: print reaches stdout at once")
    wanted["PYTHONPATH"] = EnvVar(code.code_dir, "user modules importable, as the incumbent")
    wanted[PROGRESS_ENV] = EnvVar(
        str(RunDir.of(env.base_dir).progress),
        "touch it (or call container_entry.hang.report_progress()) to count as output for "
        + (f"HANG_TIMEOUT ({knobs.hang_timeout:g} s)" if knobs.hang_timeout else "HANG_TIMEOUT"),
    )
    return wanted


def world_master(decision: LaunchDecision, topology: Topology) -> str | None:
    """The host of our world's rank 0 where our workers form one; None: the DLC's master."""
    if decision.mode is LaunchMode.DDP and topology.world:
        return topology.world[0]
    return None
