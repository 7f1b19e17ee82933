"""Inside the image, with the DLC's own sagemaker-training: every SM_* variable the bootstrap
exports is the one `Environment().to_env_vars()` exports there, for the same /opt/ml/input.

One container per configuration runs both: `container-entry plan` (its `env` holds the
variables we add, with their values) and the toolkit's Environment, each in a process of its
own. The comparison and its deliberate differences: tests/sm_contract.py, docs/sm-contract.md.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.sm_contract import assert_the_dlcs

# run in the container: our plan, then the toolkit (whose import creates folders: last)
DRIVER = r"""
import json, subprocess
plan = subprocess.run(["container-entry", "plan"], capture_output=True, text=True)
dlc = subprocess.run(["python3", "-c", "import json; from sagemaker_training import "
    "environment as e; print(json.dumps(e.Environment().to_env_vars()))"],
    capture_output=True, text=True)
print(json.dumps({"plan": plan.stdout, "plan_stderr": plan.stderr[-3000:],
    "dlc": dlc.stdout.strip().splitlines()[-1:], "dlc_rc": dlc.returncode,
    "dlc_stderr": dlc.stderr[-3000:]}))
"""

HETERO = {
    "current_host": "algo-1",
    "current_instance_type": "ml.p4d.24xlarge",
    "current_group_name": "train",
    "hosts": ["algo-1", "algo-2", "algo-3"],
    "instance_groups": [
        {"instance_group_name": "data", "instance_type": "ml.c5.18xlarge", "hosts": ["algo-2"]},
        {
            "instance_group_name": "train",
            "instance_type": "ml.p4d.24xlarge",
            "hosts": ["algo-3", "algo-1"],
        },
    ],
    "network_interface_name": "eth0",
}
CHANNELS = {
    "train": {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated"},
    "val-set": {"TrainingInputMode": "Pipe"},
    "data.v2": {"TrainingInputMode": "FastFile"},
    "Images": {"TrainingInputMode": "File"},
    "code": {"TrainingInputMode": "File"},
}
CONFIGS: dict[str, dict[str, Any]] = {
    "one-host-sdk-v2": {
        "rc": {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0"},
        "hps": {
            "epochs": "3",
            "model": '"bert"',
            "opts": '{"a": 1}',
            "sagemaker_program": '"train.py"',
            "sagemaker_submit_directory": '"s3://bucket/job-1/source/sourcedir.tar.gz"',
            "sagemaker_container_log_level": "10",
            "_tuning_objective_metric": '"eval_loss"',
        },
        "idc": {"train": CHANNELS["train"]},
        "environ": {"TRAINING_JOB_NAME": "job-1"},
    },
    "hetero-sdk-v3-no-group-key": {
        "rc": HETERO,
        "hps": {
            "epochs": "3",
            "model": "bert",
            "sagemaker_program": "train.py",
            "sagemaker_torch_distributed_enabled": "true",
        },
        "idc": CHANNELS,
        "environ": {},
    },
    "hetero-group-key": {
        "rc": HETERO,
        "hps": {
            "epochs": "3",
            "sagemaker_program": '"train.py"',
            "sagemaker_mpi_enabled": "true",
            "sagemaker_distribution_instance_groups": '["train"]',
        },
        "idc": CHANNELS,
        "environ": {},
    },
    "two-hosts-unsorted-generic-settings": {
        "rc": {"current_host": "algo-1", "hosts": ["algo-2", "algo-1"]},
        "hps": {
            "use_fp16": "True",
            "name": "bert",
            "container_entry_hang_timeout": "600",
        },
        "idc": {},
        "environ": {"SAGEMAKER_PROGRAM": "train.py"},
    },
    "local-mode": {"rc": None, "hps": {"epochs": "1"}, "idc": None, "environ": {}},
}
LOCAL_HOST = "local-box"


def run_both(image: str, root: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Write the configuration's files under `root` (mounted at /opt/ml/input) and run the
    driver in one container; its two answers."""
    config = root / "config"
    config.mkdir(parents=True)
    for name, key in (
        ("resourceconfig.json", "rc"),
        ("hyperparameters.json", "hps"),
        ("inputdataconfig.json", "idc"),
    ):
        if spec[key] is not None:
            (config / name).write_text(json.dumps(spec[key]))
    for channel in spec["idc"] or {"local-data": {}}:
        (root / "data" / channel).mkdir(parents=True)
    environ = [arg for name, value in spec["environ"].items() for arg in ("-e", f"{name}={value}")]
    result = subprocess.run(
        [
            *("docker", "run", "--rm", "--network", "none", "--hostname", LOCAL_HOST),
            *("-v", f"{root}:/opt/ml/input", *environ, "--entrypoint", "python3", image),
            *("-c", DRIVER),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_image_exports_the_dlcs_sm_variables(image, tmp_path, name):
    spec = CONFIGS[name]
    both = run_both(image, tmp_path / "input", spec)
    assert both["plan"], both["plan_stderr"]
    plan = json.loads(both["plan"])
    ours = {k: v["value"] for k, v in plan["env"].items() if k.startswith("SM_")}
    if spec["rc"] is None:  # local mode: the DLC cannot run; we name this host, found channels
        assert both["dlc_rc"] != 0 and "FileNotFoundError" in both["dlc_stderr"]
        assert json.loads(ours["SM_HOSTS"]) == [LOCAL_HOST]
        assert json.loads(ours["SM_CHANNELS"]) == ["local-data"]
        assert json.loads(ours["SM_TRAINING_ENV"])["is_master"] is True
        return
    assert both["dlc_rc"] == 0, both["dlc_stderr"]
    dlc = json.loads(both["dlc"][0])
    assert_the_dlcs(
        ours,
        dlc,
        hyperparameters=spec["hps"],
        world_rank0=(plan["topology"]["world"] or [None])[0],  # our world's rank 0's host
        torch_version=plan["torch_version"],
    )
    if name == "hetero-group-key":  # the toolkit's own world: the train group, file order
        training = json.loads(dlc["SM_TRAINING_ENV"])
        assert training["distribution_hosts"] == ["algo-3", "algo-1"]
        assert (training["master_hostname"], training["is_master"]) == ("algo-3", False)
