"""The one comparison of the SM_* contract with sagemaker-training's, which the unit table (the
toolkit in a subprocess) and the docker test (the toolkit in the image) both make.

`ours` and `dlc` are the SM_* variables a script sees under each; they must be equal key for
key and value for value (SM_TRAINING_ENV as parsed JSON and as the exact string), except for
the deliberate differences of docs/sm-contract.md, each asserted here where it arises.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from container_entry.plan.settings import HYPERPARAMETER_PREFIX

# one subprocess runs the toolkit on every configuration: it reads its files at each
# Environment(); its folders are fixed when its module is imported (SAGEMAKER_BASE_DIR)
TOOLKIT = r"""
import json, os, sys
configs = json.load(open(sys.argv[1]))
from sagemaker_training import environment
start, folder, results = dict(os.environ), environment.input_config_dir, {}
for name, config in configs.items():
    os.environ.clear()
    os.environ.update({**start, **config["environ"]})
    for file, key in (("resourceconfig.json", "rc"), ("hyperparameters.json", "hps"),
                      ("inputdataconfig.json", "idc")):
        path = os.path.join(folder, file)
        if config[key] is None:
            os.path.exists(path) and os.remove(path)
        else:
            json.dump(config[key], open(path, "w"))
    try:
        results[name] = environment.Environment().to_env_vars()
    except Exception as error:
        results[name] = {"error": type(error).__name__}
json.dump(results, open(sys.argv[2], "w"))
"""
CHECKPOINT = "SM_CHECKPOINT_DIR"
TORCH_VERSION = "SM_DLC_TORCH_VERSION"


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
    torch_version: str | None = None,
) -> None:
    """`ours` is `dlc` but for the deliberate differences. `hyperparameters`: the job's, as
    in hyperparameters.json; `world_rank0`: the host of our DDP world's rank 0, which
    is_master and master_hostname may name instead of the DLC's master."""
    ours, dlc = dict(ours), dict(dlc)
    # ours only: where SageMaker syncs checkpoints with S3
    assert ours.pop(CHECKPOINT) == f"{base}/checkpoints" and CHECKPOINT not in dlc
    # the DLC's PyTorch toolkit sets it beside sagemaker-training's (torch.__version__): where
    # torch is installed (`torch_version`), as that version
    assert ours.pop(TORCH_VERSION, None) == torch_version and TORCH_VERSION not in dlc
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


def run_toolkit(
    configs: Mapping[str, Any], root: Path, environ: Mapping[str, str]
) -> dict[str, dict[str, str]]:
    """sagemaker-training's own `Environment().to_env_vars()` on each configuration ({"rc",
    "hps", "idc", "environ"}: its files and variables), in one subprocess of this Python whose
    SAGEMAKER_BASE_DIR (in `environ`) has an input/config folder; {"error": type} where the
    toolkit raised."""
    (root / "configs.json").write_text(json.dumps(configs))
    subprocess.run(
        [sys.executable, "-c", TOOLKIT, str(root / "configs.json"), str(root / "out.json")],
        env=dict(environ),
        check=True,
        capture_output=True,
        timeout=120,
    )
    return json.loads((root / "out.json").read_text())
