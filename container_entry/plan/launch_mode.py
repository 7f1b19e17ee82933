"""How this host runs the entry point: our DDP workers, the entry point once, or the base's toolkit.

The DLC runs a script once per host and leaves distribution to it, so the users who trained on
several GPUs there launched their workers themselves (a shell entry running `torchrun`, the
PyTorch tutorial's `mp.spawn`, `accelerate launch`). Started once per GPU worker, such an entry
point launches its workers once per worker: N copies of the user's launcher on one host, a
port in use, a hang, or duplicate trainings. So one decision, in priority order:

1. `CONTAINER_ENTRY_LAUNCH=once` (or the hyperparameter): once, the user's word;
2. `distribution=` asks for a launcher that is not DDP (MPI, the model-parallel library, XLA):
   the base image's own toolkit runs the job, unchanged (`sagemaker_training`'s `train`),
   unless `CONTAINER_ENTRY_LAUNCH=ddp`;
3. this host's instance group is outside the distribution groups (groups.py): once, whatever
   the setting (no world has a place for it);
4. `CONTAINER_ENTRY_LAUNCH=ddp`: our workers, for an entry point wrongly taken for a launcher;
5. the entry point launches its own workers (launchers.py, read from the code, not its text):
   once;
6. otherwise one DDP worker per GPU through our torchrun.

The code may arrive after the plan (S3, an archive): then the plan says the decision waits for
it (`pending`), and the job decides again once the code is where it runs. Pure.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from container_entry.plan.groups import decoded
from container_entry.plan.launchers import find_launcher

MODEL_PARALLEL_KEY = "mp_parameters"  # SDK v2's smdistributed modelparallel parameters
# distribution= choices that are not DDP: the toolkit's own runners (sagemaker-pytorch-training
# 3.0.0, training.py), by the hyperparameter SDK v2 writes for each
OTHER_LAUNCHERS = {
    "sagemaker_mpi_enabled": "MPI",
    "sagemaker_pytorch_xla_multi_worker_enabled": "PyTorch XLA",
    "sagemaker_parameter_server_enabled": "the parameter server",
    "sagemaker_multi_worker_mirrored_strategy_enabled": "MultiWorkerMirroredStrategy",
}


class LaunchMode(enum.StrEnum):
    DDP = "ddp"  # one worker per GPU through our torchrun, in this host's world
    ONCE = "once"  # the entry point once on this host, as the DLC runs it
    TOOLKIT = "toolkit"  # the base image's own toolkit, unchanged


@dataclass(frozen=True)
class LaunchDecision:
    mode: LaunchMode
    why: str
    pending: bool = False  # the code is not here yet: decided again once it is

    def describe(self) -> str:
        """One line for the start and the plan."""
        what = {
            LaunchMode.DDP: "one DDP worker per GPU (our torchrun)",
            LaunchMode.ONCE: "the entry point once on this host, as the DLC runs it",
            LaunchMode.TOOLKIT: "the base image's own SageMaker toolkit, unchanged",
        }[self.mode]
        return f"{what}: {self.why}"


DDP_BY_DEFAULT = LaunchDecision(LaunchMode.DDP, "the default")


def other_launcher(hyperparameters: Mapping[str, Any]) -> str | None:
    """The launcher `distribution=` asks for that is not DDP, in words; None: DDP or none."""
    for key, name in OTHER_LAUNCHERS.items():
        if decoded(hyperparameters.get(key, False)):
            return f"{name} ({key})"
    parameters = decoded(hyperparameters.get(MODEL_PARALLEL_KEY, {}))
    if parameters not in ({}, None, "", "{}"):
        return f"the model-parallel library ({MODEL_PARALLEL_KEY})"
    return None


def launch_mode_of(
    setting: str,
    hyperparameters: Mapping[str, Any],
    world: tuple[str, ...],
    world_why: str,
    entry: str | None,
    code_files: Mapping[str, bytes] | None,
    code_from: str,
) -> LaunchDecision:
    """This host's launch mode. `world`: this host's DDP world (empty: in none, `world_why`
    says why); `entry`: the entry script as a key of `code_files`, the code folder's scripts
    (None: not here yet, it comes from `code_from`)."""
    if setting == "once":
        return LaunchDecision(LaunchMode.ONCE, "CONTAINER_ENTRY_LAUNCH=once (forced)")
    other = other_launcher(hyperparameters)
    if other and setting != "ddp":
        return LaunchDecision(LaunchMode.TOOLKIT, f"distribution= asks for {other}")
    if not world:
        return LaunchDecision(LaunchMode.ONCE, f"in no DDP world ({world_why})")
    if setting == "ddp":
        return LaunchDecision(LaunchMode.DDP, "CONTAINER_ENTRY_LAUNCH=ddp (forced)")
    if code_files is None:
        why = f"unless the entry point launches its own workers (decided once {code_from} is here)"
        return LaunchDecision(LaunchMode.DDP, why, pending=True)
    found = find_launcher(entry, code_files) if entry is not None else None
    if found is not None:
        why = f"the entry point launches its own workers ({found.describe()})"
        return LaunchDecision(LaunchMode.ONCE, why)
    return LaunchDecision(LaunchMode.DDP, "the entry point launches no workers of its own")
