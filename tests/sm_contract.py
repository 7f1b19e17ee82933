"""The one comparison of the SM_* contract with sagemaker-training's, which the unit table (the
toolkit in a subprocess) and the docker test (the toolkit in the image) both make.

`ours` and `dlc` are the SM_* variables a script sees under each; they must be equal key for
key and value for value (SM_TRAINING_ENV as parsed JSON and as the exact string), except for
the deliberate differences of docs/sm-contract.md, each asserted here where it arises.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from container_entry.plan.settings import HYPERPARAMETER_PREFIX

CHECKPOINT = "SM_CHECKPOINT_DIR"


def formatted(value: Any) -> str:
    """A value as sagemaker-training's own mapping formats a JSON variable."""
    from sagemaker_training import mapping

    return str(mapping.to_env_vars({"x": value})["SM_X"])


def without_settings(dlc: Mapping[str, str], settings: set[str]) -> dict[str, str]:
    """The DLC's variables less our container_entry_* settings, which the DLC hands to the
    script and we consume: SM_HP_<NAME>, and their place in SM_HPS, SM_USER_ARGS and
    SM_TRAINING_ENV's `hyperparameters`."""
    from sagemaker_training import mapping

    view = {k: v for k, v in dlc.items() if k not in {f"SM_HP_{s.upper()}" for s in settings}}
    hps = json.loads(view["SM_HPS"])
    training = json.loads(view["SM_TRAINING_ENV"])
    assert settings <= set(hps) and settings <= set(training["hyperparameters"])
    hps = {k: v for k, v in hps.items() if k not in settings}
    training["hyperparameters"] = hps
    args = [str(a) for a in mapping.to_cmd_args(hps)]
    return {
        **view,
        "SM_HPS": formatted(hps),
        "SM_TRAINING_ENV": formatted(training),
        "SM_USER_ARGS": formatted(args),
    }


def assert_the_dlcs(
    ours: Mapping[str, str],
    dlc: Mapping[str, str],
    *,
    hyperparameters: Mapping[str, Any],
    base: str = "/opt/ml",
    world_rank0: str | None = None,
) -> None:
    """`ours` is `dlc` but for the deliberate differences. `hyperparameters`: the job's, as
    in hyperparameters.json; `world_rank0`: the host of our DDP world's rank 0, which
    is_master and master_hostname may name instead of the DLC's master."""
    ours, dlc = dict(ours), dict(dlc)
    # ours only: where SageMaker syncs checkpoints with S3
    assert ours.pop(CHECKPOINT) == f"{base}/checkpoints" and CHECKPOINT not in dlc
    settings = {k for k in hyperparameters if k.startswith(HYPERPARAMETER_PREFIX)}
    if settings:  # our settings: consumed, never the script's
        hps = json.loads(ours["SM_HPS"])
        assert not settings & set(hps) and not any(
            f"--{s}" in ours["SM_USER_ARGS"] for s in settings
        )
        dlc = without_settings(dlc, settings)
    mine, theirs = json.loads(ours["SM_TRAINING_ENV"]), json.loads(dlc["SM_TRAINING_ENV"])
    if mine["master_hostname"] != theirs["master_hostname"]:  # our world is not the DLC's
        assert world_rank0 is not None and mine["master_hostname"] == world_rank0
        assert mine["is_master"] is (mine["current_host"] == world_rank0)
        theirs.update(master_hostname=mine["master_hostname"], is_master=mine["is_master"])
        dlc["SM_TRAINING_ENV"] = formatted(theirs)
    assert sorted(ours) == sorted(dlc)
    assert mine == theirs
    assert {k: (ours[k], dlc[k]) for k in dlc if ours[k] != dlc[k]} == {}
