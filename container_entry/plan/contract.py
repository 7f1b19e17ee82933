"""The SM_* environment contract, as sagemaker-training 5.1.4 (the DLC's) exports it.

The DLC's `train` exports `Environment().to_env_vars()`: a variable per key, and SM_TRAINING_ENV,
the JSON of every property of its `Environment` (`hyperparameters`, `channel_input_dirs`,
`is_master`, `distribution_hosts`, ...). A script written for the DLC reads any of them, so each
is rebuilt here from the same inputs by the same rules, quirks included (`hosts` unsorted as
the file lists them, `module_name` "None" when no program is named, `current_instance_group_hosts`
[] when no group matches). Values are formatted by sagemaker-training's own
`mapping.to_env_vars`, which has no import-time effects; its `environment` module is never
imported (it creates folders when imported).

Pure: the machine's facts (the GPUs `nvidia-smi --list-gpus` lists, every CPU, NeuronCores,
smddprun) arrive as `Machine`, read by plan/environment.py. The deliberate differences from
the DLC (docs/sm-contract.md): `world_master` names our DDP world's rank 0 where ours differs,
the container_entry_* hyperparameters are our settings and never the script's, and local mode
(no resourceconfig.json) synthesizes what the DLC cannot run without.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from container_entry.plan.groups import HOMOGENEOUS, toolkit_distribution, toolkit_master
from container_entry.plan.hyperparameters import Hyperparameters, reserved_keys

LOG_LEVEL_KEY = "sagemaker_container_log_level"
DEFAULT_LOG_LEVEL = 20  # logging.INFO, sagemaker-training's default
PROGRAM_KEY = "sagemaker_program"
SUBMIT_DIR_KEY = "sagemaker_submit_directory"


@dataclass(frozen=True)
class Machine:
    """What sagemaker-training reads from the machine rather than from its files."""

    gpus: int = 0  # lines of `nvidia-smi --list-gpus` starting "GPU " (CUDA_VISIBLE_DEVICES aside)
    cpus: int = 1  # multiprocessing.cpu_count(): the machine's, not this process's affinity
    neurons: int = 0  # NeuronCores
    smddprun: bool = False  # `which smddprun` finds it
    smddpmprun: bool = False


def local_resource_config(hosts: Sequence[str], current_host: str) -> dict[str, Any]:
    """What stands for resourceconfig.json in local mode (a plain `docker run`), where the DLC
    cannot run at all: our hosts in one group, as sagemaker-training's own local mode writes
    its file when there is none."""
    return {
        "current_host": current_host,
        "hosts": list(hosts),
        "current_instance_group": HOMOGENEOUS,
        "instance_groups": [
            {"instance_group_name": HOMOGENEOUS, "instance_type": "local", "hosts": list(hosts)}
        ],
    }


def _groups(resource_config: Mapping[str, Any], framework: Mapping[str, Any]) -> dict[str, Any]:
    """The instance-group values: environment.py's get_* methods, on the file's order (the
    distribution rule's one home: groups.py)."""
    configured = [g for g in resource_config.get("instance_groups") or [] if isinstance(g, dict)]
    current = resource_config.get("current_group_name", HOMOGENEOUS)
    distribution, distribution_hosts = toolkit_distribution(resource_config, framework)
    names = [g.get("instance_group_name") for g in configured]
    return {
        "current_instance_group": current,
        "current_instance_group_hosts": next(
            (g.get("hosts") for g in configured if g.get("instance_group_name") == current), []
        ),
        "instance_groups": names,
        "instance_groups_dict": {g.get("instance_group_name"): g for g in configured},
        "distribution_instance_groups": distribution,
        "distribution_hosts": distribution_hosts,
        "is_hetero": len(names) > 1,
    }


def _paths(base: str) -> dict[str, str]:
    """The folders under the base dir, joined as sagemaker-training joins them."""
    return {
        "input_dir": posixpath.join(base, "input"),
        "input_config_dir": posixpath.join(base, "input", "config"),
        "model_dir": posixpath.join(base, "model"),
        "output_dir": posixpath.join(base, "output"),
        "output_data_dir": posixpath.join(base, "output", "data"),
        "output_intermediate_dir": posixpath.join(base, "output", "intermediate"),
    }


def _program(
    environ: Mapping[str, str], sagemaker: Mapping[str, Any], named: str | None
) -> dict[str, Any]:
    """module_name and user_entry_point: SAGEMAKER_PROGRAM (even empty, for the module name)
    else the hyperparameter; with neither, the module is str(None) and the entry point None.
    `named`: the script named on our command line, which stands where SAGEMAKER_PROGRAM would."""
    program = named if named is not None else environ.get("SAGEMAKER_PROGRAM")
    module = program if program is not None else str(sagemaker.get(PROGRAM_KEY))
    return {
        "module_name": module[:-3] if module.endswith(".py") else module,
        "user_entry_point": program or sagemaker.get(PROGRAM_KEY),
    }


def training_env(
    *,
    base_dir: str,
    resource_config: Mapping[str, Any],
    input_data_config: Mapping[str, Any],
    hyperparameters: Hyperparameters,
    environ: Mapping[str, str],
    machine: Machine,
    channels: Sequence[str] | None = None,
    named_program: str | None = None,
    world_master: str | None = None,
) -> dict[str, Any]:
    """Every property of sagemaker-training's `Environment`: the object SM_TRAINING_ENV holds.

    `channels`: the input channels (None: those of inputdataconfig.json, as the DLC has them;
    local mode passes the folders found too). `world_master`: our DDP world's rank-0 host where
    our launcher forms a world the DLC would not (None: the DLC's rule, the first distribution
    host, else the first host)."""
    sagemaker = hyperparameters.sagemaker
    framework = {k: v for k, v in sagemaker.items() if k not in reserved_keys()}
    hosts = resource_config.get("hosts") or []
    current_host = resource_config.get("current_host")
    groups = _groups(resource_config, framework)
    if world_master is None:  # the DLC's: the first distribution host, else the first host
        world_master = toolkit_master(resource_config, framework)
    mp = environ.get("SM_HP_MP_PARAMETERS")
    paths = _paths(base_dir)
    return {
        **paths,
        **groups,
        **_program(environ, sagemaker, named_program),
        "additional_framework_parameters": framework,
        "channel_input_dirs": {
            name: posixpath.join(paths["input_dir"], "data", name)
            for name in (input_data_config if channels is None else channels)
        },
        "current_host": current_host,
        "current_instance_type": resource_config.get("current_instance_type", "local"),
        "framework_module": environ.get("SAGEMAKER_TRAINING_MODULE"),
        "hosts": hosts,
        "hyperparameters": dict(hyperparameters.user),
        "input_data_config": dict(input_data_config),
        "is_master": current_host == world_master,
        "is_modelparallel_enabled": mp and mp != "{}",
        "is_smddpmprun_installed": machine.smddpmprun,
        "is_smddprun_installed": machine.smddprun,
        "job_name": environ.get("TRAINING_JOB_NAME"),
        "log_level": sagemaker.get(LOG_LEVEL_KEY, DEFAULT_LOG_LEVEL),
        "master_hostname": world_master,
        "module_dir": str(sagemaker.get(SUBMIT_DIR_KEY, posixpath.join(base_dir, "code"))),
        "network_interface_name": resource_config.get("network_interface_name", "eth0"),
        "num_cpus": machine.cpus,
        "num_gpus": machine.gpus,
        "num_neurons": machine.neurons,
        "resource_config": dict(resource_config),
        "topology": resource_config.get("topology", []),
    }


def sm_env(
    *,
    base_dir: str,
    resource_config: Mapping[str, Any],
    input_data_config: Mapping[str, Any],
    hyperparameters: Hyperparameters,
    user_args: Sequence[str],
    environ: Mapping[str, str],
    machine: Machine,
    channels: Sequence[str] | None = None,
    named_program: str | None = None,
    world_master: str | None = None,
) -> dict[str, str]:
    """The SM_* variables, keyed and valued as sagemaker-training's `Environment.to_env_vars`
    (the arguments are training_env's, and SM_USER_ARGS)."""
    env = training_env(
        base_dir=base_dir,
        resource_config=resource_config,
        input_data_config=input_data_config,
        hyperparameters=hyperparameters,
        environ=environ,
        machine=machine,
        channels=channels,
        named_program=named_program,
        world_master=world_master,
    )
    return env_vars(env, user_args)


def env_vars(env: Mapping[str, Any], user_args: Sequence[str]) -> dict[str, str]:
    """`Environment.to_env_vars` of `training_env`'s object: the keys in its order, formatted
    by its own mapping; `user_args` are what the script is given (SM_USER_ARGS)."""
    from sagemaker_training import mapping

    values: dict[str, Any] = {
        "hosts": env["hosts"],
        "network_interface_name": env["network_interface_name"],
        "hps": env["hyperparameters"],
        "user_entry_point": env["user_entry_point"],
        "framework_params": env["additional_framework_parameters"],
        "resource_config": env["resource_config"],
        "input_data_config": env["input_data_config"],
        "output_data_dir": env["output_data_dir"],
        "channels": sorted(env["channel_input_dirs"]),
        **{
            key: env[key]
            for key in (
                *("current_host", "current_instance_type", "current_instance_group"),
                *("current_instance_group_hosts", "instance_groups", "instance_groups_dict"),
                *("distribution_instance_groups", "is_hetero", "module_name", "log_level"),
                *("framework_module", "input_dir", "input_config_dir", "output_dir"),
                *("num_cpus", "num_gpus", "num_neurons", "model_dir", "module_dir"),
            )
        },
        "training_env": dict(env),
        "user_args": list(user_args),
        "output_intermediate_dir": env["output_intermediate_dir"],
    }
    if env["topology"]:  # the toolkit exports it only where the cluster has one (GB200)
        values["topology"] = env["topology"]
    for name, path in env["channel_input_dirs"].items():
        values[f"channel_{name}"] = path
    for key, value in env["hyperparameters"].items():
        values[f"hp_{key}"] = value
    return {k: str(v) for k, v in mapping.to_env_vars(values).items()}
