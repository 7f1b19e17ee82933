"""The SM_* environment contract that sagemaker-training exports to user scripts.

Pure: built from the topology, the hyperparameters and the paths, formatted with
sagemaker-training's own `mapping.to_env_vars` so values look exactly like the incumbent's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from container_entry.plan.cluster import Topology
from container_entry.plan.hyperparameters import reserved_keys

LOG_LEVEL_KEY = "sagemaker_container_log_level"
DEFAULT_LOG_LEVEL = 20  # logging.INFO, sagemaker-training's default


def _groups(topology: Topology) -> dict[str, Any]:
    """The instance-group values: this host's group, every group's name, whether there are
    several (a cluster without groups is one, 'homogeneousCluster')."""
    current = next(
        (g for g in topology.instance_groups if topology.current_host in (g.get("hosts") or [])),
        None,
    )
    return {
        "current_instance_group": (current or {}).get("instance_group_name", "homogeneousCluster"),
        "current_instance_group_hosts": list((current or {}).get("hosts") or topology.hosts),
        "instance_groups": [g.get("instance_group_name") for g in topology.instance_groups]
        or ["homogeneousCluster"],
        "is_hetero": len(topology.instance_groups) > 1,
    }


def _paths(base_dir: Path) -> dict[str, str]:
    """The folders under the base dir, as sagemaker-training names them."""
    return {
        "output_data_dir": str(base_dir / "output" / "data"),
        "input_dir": str(base_dir / "input"),
        "input_config_dir": str(base_dir / "input" / "config"),
        "output_dir": str(base_dir / "output"),
        "model_dir": str(base_dir / "model"),
        "output_intermediate_dir": str(base_dir / "output" / "intermediate"),
    }


def sm_env(
    *,
    base_dir: Path,
    topology: Topology,
    user_hyperparameters: Mapping[str, Any],
    sagemaker_hyperparameters: Mapping[str, Any],
    user_args: list[str],
    program: str,
    module_dir: str,
    channels: Mapping[str, str],
    resource_config: Mapping[str, Any],
    input_data_config: Mapping[str, Any],
    num_gpus: int,
    num_cpus: int,
    environ: Mapping[str, str],
) -> dict[str, str]:
    """SM_* variables, keyed and valued as sagemaker-training's Environment.to_env_vars."""
    from sagemaker_training import mapping

    values: dict[str, Any] = {
        **_paths(base_dir),
        **_groups(topology),
        "hosts": list(topology.hosts),
        "network_interface_name": topology.network_interface or "eth0",
        "hps": dict(user_hyperparameters),
        "user_entry_point": program,
        # sagemaker_* keys that sagemaker-training does not consume itself
        "framework_params": {
            k: v for k, v in sagemaker_hyperparameters.items() if k not in reserved_keys()
        },
        "resource_config": dict(resource_config),
        "input_data_config": dict(input_data_config),
        "channels": sorted(channels),
        "current_host": topology.current_host,
        "current_instance_type": topology.instance_type or "local",
        "module_name": program[:-3] if program.endswith(".py") else program,
        "log_level": sagemaker_hyperparameters.get(LOG_LEVEL_KEY, DEFAULT_LOG_LEVEL),
        "framework_module": environ.get("SAGEMAKER_TRAINING_MODULE"),
        "num_cpus": num_cpus,
        "num_gpus": num_gpus,
        "num_neurons": 0,
        "module_dir": module_dir,
        "user_args": user_args,
    }
    values["training_env"] = dict(values)
    for name, path in channels.items():
        values[f"channel_{name}"] = path
    for key, value in user_hyperparameters.items():
        values[f"hp_{key}"] = value
    return {k: str(v) for k, v in mapping.to_env_vars(values).items()}
