"""The plan JSON for representative clusters, compared with reviewed snapshots.

Regenerate after a deliberate change with UPDATE_SNAPSHOTS=1 and review the diff.
"""

import json
import os
from pathlib import Path

import pytest

from container_entry.plan.plan import build_plan
from tests.unit.conftest import NVIDIA_SMI_4, make_env

SNAPSHOTS = Path(__file__).parent / "snapshots"
HPS = {
    "epochs": "3",
    "model_name": '"bert"',
    "hf_token": '"hf_secret_value"',
    "sagemaker_program": '"train.py"',
    "sagemaker_submit_directory": '"/opt/ml/code"',
}
CASES = {
    "one-host": {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0"},
    "two-hosts": {
        "current_host": "algo-2",
        "hosts": ["algo-1", "algo-2"],
        "network_interface_name": "eth0",
    },
    "heterogeneous": {
        "current_host": "algo-3",
        "current_instance_type": "ml.g5.12xlarge",
        "current_group_name": "workers",
        "hosts": ["algo-1", "algo-2", "algo-3"],
        "instance_groups": [
            {
                "instance_group_name": "workers",
                "instance_type": "ml.g5.12xlarge",
                "hosts": ["algo-3", "algo-2"],
            },
            {
                "instance_group_name": "leader",
                "instance_type": "ml.p4d.24xlarge",
                "hosts": ["algo-1"],
            },
        ],
        "network_interface_name": "eth0",
    },
}


def render(name: str) -> str:
    env = make_env(
        resource_config=CASES[name],
        hyperparameters=HPS,
        nvidia_smi=NVIDIA_SMI_4,
        environ={"TRAINING_JOB_NAME": "job-1"},
        interfaces=("eth0", "lo"),
    )
    data = build_plan(env).to_dict()
    # the program by its name: where the package is installed (and its folder in it) varies
    data["preflight"] = [a.rsplit("/", 1)[-1] for a in data["preflight"]]
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_snapshot(name):
    path = SNAPSHOTS / f"plan-{name}.json"
    text = render(name)
    if os.environ.get("UPDATE_SNAPSHOTS"):
        path.write_text(text)
    assert "hf_secret_value" not in text
    assert text == path.read_text(), f"plan changed: UPDATE_SNAPSHOTS=1 and review {path}"
